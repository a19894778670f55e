"""DraftModelProposer: a second, small model proposes k tokens per sequence, greedily (vLLM's "draft_model").

The draft runs on runtime pieces of its own, built like an engine's (setup.build_runtime): its KV cache and
block pool (as many tokens as the target's, no prefix caching), its runner, compiled when the target is (an
artifact, or compile=True: the draft's own artifact in the same cache_dir), else eager; on a GPU its one-token decode steps replay its own decode CUDA graphs (cuda_graphs as the
target's), its catch-up steps run un-graphed. Each sequence has a draft-side copy (a Sequence over the same tokens)
whose K/V the draft keeps between steps. Proposing for a sequence:

    sync       the copy takes the target's tokens; its computed tokens are cut back to where they still
               agree with the target's (the proposals the target rejected go, with their blocks)
    catch up   the copy's uncomputed tokens (the whole prompt at first; then the tokens the target added,
               one or more) run in chunks of the draft's token budget; the last chunk's argmax is d_1
    decode     k - 1 one-token steps, each feeding the argmax before it: d_2 .. d_k

The draft's argmax makes the proposals deterministic (a point-mass draft for the rejection sampler). A
sequence whose copy finds no free draft blocks (after the copies of sequences not proposing now are
dropped) gets no proposal that step. A draft model whose vocabulary differs from the target's (its size,
or any token's id in the two tokenizers) is refused at start.
"""

from pathlib import Path
from typing import NamedTuple

from graphllm.config import EngineConfig
from graphllm.models.loader import read_hf_config
from graphllm.models.registry import resolve_architecture
from graphllm.runtime.scheduler import ScheduledSeq
from graphllm.runtime.sequence import Sequence
from graphllm.runtime.setup import Runtime, RuntimeState, build_runtime, load_tokenizer
from graphllm.speculative_config import SpeculativeConfig


class DraftCopy(NamedTuple):
    target: Sequence
    seq: Sequence  # the draft's: token_ids is the target's, then its own proposals (its output list is unused)


class DraftModelProposer:
    def __init__(self, runtime: Runtime):
        self.pool, self.runner = runtime.pool, runtime.runner
        self.compiled = runtime.model is None  # its runner steps an artifact's compiled step (else the eager model)
        self.max_model_len = runtime.state.max_model_len  # the draft's positions (num_proposals caps k by it)
        self.max_num_seqs, self.budget = runtime.state.limits.max_num_seqs, runtime.state.limits.max_num_batched_tokens
        self.copies: dict[int, DraftCopy] = {}  # target seq_id -> its draft-side copy

    @classmethod
    def load(cls, spec: SpeculativeConfig, config: EngineConfig, target: RuntimeState,
             target_tokenizer) -> "DraftModelProposer":
        path = Path(spec.model).expanduser()
        _, draft_config = resolve_architecture(read_hf_config(path))
        check_same_vocabulary(path, draft_config.vocab_size, load_tokenizer(path), target, target_tokenizer)
        max_model_len = min(target.max_model_len, draft_config.max_position_embeddings)
        limits = target.limits
        compiled = config.compile or config.artifact is not None
        draft = EngineConfig(model=str(path), compile=compiled, dtype=config.dtype, device=config.device,
                             max_num_seqs=limits.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                             block_size=limits.block_size, max_model_len=max_model_len,
                             num_kv_blocks=max(target.num_kv_blocks, -(-max_model_len // limits.block_size)),
                             enable_prefix_caching=False, cuda_graphs=config.cuda_graphs, async_scheduling=False,
                             cudagraph_mode="FULL_DECODE_ONLY",  # its catch-up steps run un-graphed (above)
                             attention_backend=config.attention_backend, seed=config.seed, cache_dir=config.cache_dir)
        return cls(build_runtime(draft))

    # -- proposing --------------------------------------------------------------------------

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ks[i] greedy tokens of the draft after seqs[i]'s tokens."""
        keep = {seq.seq_id for seq in seqs}
        copies = [self._sync(seq, k, keep) for seq, k in zip(seqs, ks)]
        live = [(copy, k) for copy, k in zip(copies, ks) if copy is not None]
        bases = {id(copy): copy.num_tokens for copy, _ in live}
        self._catch_up([copy for copy, _ in live])
        for step in range(1, max((k for _, k in live), default=0)):
            self._decode([copy for copy, k in live if k > step])
        return [[] if copy is None else copy.token_ids[bases[id(copy)]:bases[id(copy)] + k]
                for copy, k in zip(copies, ks)]

    def _sync(self, target: Sequence, k: int, keep: set[int]) -> Sequence | None:
        """target's draft copy, cut back to the tokens that still agree, its blocks covering k - 1 more tokens
        than target's; None (copy dropped) where the draft pool has no room for them."""
        entry = self.copies.get(target.seq_id)
        if entry is None:
            copy = Sequence(target.seq_id, target.request_id, target.index, list(target.token_ids),
                            target.num_prompt_tokens, target.params)
            entry = self.copies[target.seq_id] = DraftCopy(target, copy)
        copy, tokens = entry.seq, target.token_ids
        # the target's last token is always run again: its logits give d_1 (a step may have left the copy
        # ahead of the target, when the target's proposals were not scheduled)
        valid = common_prefix(copy.token_ids, tokens, min(copy.num_computed_tokens, len(tokens) - 1))
        self.pool.truncate(copy, valid)
        del copy.token_ids[valid:]
        copy.token_ids.extend(tokens[valid:])
        needed = copy.num_uncomputed_tokens + k - 1
        while not self.pool.can_allocate(copy, needed) and self._drop_one(keep):
            pass
        if not self.pool.can_allocate(copy, needed):
            self._drop(target.seq_id)
            return None
        self.pool.allocate(copy, needed)
        return copy

    def _catch_up(self, copies: list[Sequence]) -> None:
        """Run the copies' uncomputed tokens, chunked to the draft's token budget and batch size; each copy's
        last chunk appends the draft's argmax (d_1)."""
        pending = list(copies)
        while pending:
            batch, budget = [], self.budget
            for copy in pending[:self.max_num_seqs]:
                n = min(copy.num_uncomputed_tokens, budget)
                if n == 0:
                    break
                batch.append(ScheduledSeq(copy, n))
                budget -= n
            done = self._run(batch)
            pending = [copy for copy in pending if not any(copy is d for d in done)]

    def _decode(self, copies: list[Sequence]) -> None:
        for start in range(0, len(copies), self.max_num_seqs):
            self._run([ScheduledSeq(copy, 1) for copy in copies[start:start + self.max_num_seqs]])

    def _run(self, batch: list[ScheduledSeq]) -> list[Sequence]:
        """One draft step; the copies whose last token it computed get the argmax appended (returned)."""
        sampling = [s.seq for s in batch if s.samples]
        logits = self.runner.execute(batch)  # [len(sampling), V]
        for copy, n in batch:
            copy.num_computed_tokens += n
        for copy, token in zip(sampling, logits.argmax(dim=-1).tolist()):
            copy.token_ids.append(token)
        return sampling

    # -- copies -----------------------------------------------------------------------------

    def release_finished(self) -> None:
        """Drop the copies of sequences that finished (or were aborted)."""
        for seq_id in [i for i, entry in self.copies.items() if entry.target.is_finished]:
            self._drop(seq_id)

    def _drop_one(self, keep: set[int]) -> bool:
        """Drop one copy of a sequence not in keep (oldest first); False when there is none."""
        victim = next((i for i in self.copies if i not in keep), None)
        if victim is None:
            return False
        self._drop(victim)
        return True

    def _drop(self, seq_id: int) -> None:
        self.pool.free(self.copies.pop(seq_id).seq)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens (at most limit) a and b share."""
    if a[:limit] == b[:limit]:
        return limit
    return next(i for i in range(limit) if a[i] != b[i])


def check_same_vocabulary(path: Path, vocab_size: int, tokenizer, target: RuntimeState, target_tokenizer) -> None:
    """Refuse a draft model that does not speak the target's token ids, saying how they differ."""
    if vocab_size != target.model_config.vocab_size:
        raise ValueError(f"draft model {path}: vocab_size {vocab_size} differs from the target's "
                         f"{target.model_config.vocab_size}; speculative decoding needs one vocabulary")
    if tokenizer is None or target_tokenizer is None:
        return
    mine, theirs = tokenizer.get_vocab(), target_tokenizer.get_vocab()
    differ = sorted(t for t in set(mine) | set(theirs) if mine.get(t) != theirs.get(t))
    if differ:
        raise ValueError(f"draft model {path}: its tokenizer differs from the target's ({len(differ)} tokens have "
                         f"other ids or are missing, e.g. {differ[0]!r}); speculative decoding needs one vocabulary")
