"""ShardTP: the captured step of the unmodified model -> rank r's step of an N-way tensor-parallel one.

Megatron's split, applied to the graph's linears by their module names (before any fusion), with the
weights sliced in the graph's weight dict. Per attention layer (Hq query heads, Hkv KV heads, head
size D, N ranks) and MLP (intermediate size I):

    before (rank-independent)                          after (rank r)
    q = linear(x, q_proj.weight[Hq*D, H])              q = linear(x, q_proj.weight[Hq/N*D, H])   # heads r*Hq/N ..
    k = linear(x, k_proj.weight[Hkv*D, H])             k = linear(x, k_proj.weight[Hkv'*D, H])   # Hkv' = max(Hkv/N, 1)
    v = linear(x, v_proj.weight[Hkv*D, H])             v = linear(x, v_proj.weight[Hkv'*D, H])
    a = attention(q, k, v, kv_cache)                   a = attention(q, k, v, kv_cache)          # cache: Hkv' heads
    o = linear(a, o_proj.weight[H, Hq*D])              p = linear(a, o_proj.weight[H, Hq/N*D])
                                                       o = graphllm.all_reduce(p, group)
    g = linear(x, gate_proj.weight[I, H])              g = linear(x, gate_proj.weight[I/N, H])   (up_proj alike)
    d = linear(m, down_proj.weight[H, I])              d = all_reduce(linear(m, down_proj.weight[H, I/N]), group)

A mixture-of-experts layer (graphllm.fused_moe, stacked experts) splits every expert by its intermediate
size, as vLLM does; the router stays whole on every rank:

    y = fused_moe(x, logits, w13[E, 2I, H], w2[E, H, I])   y = all_reduce(fused_moe(x, logits, w13_r[E, 2I/N, H],
                                                                                    w2_r[E, H, I/N]), group)
    (w13_r: rows [r*I/N, (r+1)*I/N) of the gate half and of the up half; w2_r: those columns)

Column-parallel linears keep their bias slice; a row-parallel linear's bias is added by rank 0 only
(the other ranks' is zeroed), so the all-reduce adds it once. With fewer KV heads than ranks each
KV head is replicated on N/Hkv ranks: rank r reads KV head r // (N / Hkv), which serves its query
heads (GQA groups stay whole). The graph reads head counts from tensor shapes (views keep -1), so no
constant changes; the KV-cache inputs of rank r have Hkv' heads. Norms stay replicated.

Vocabulary-parallel (`vocab_parallel`, on by default; V padded up to a multiple of N, rows of V/N each):

    before                                       after (rank r holds vocabulary rows [r*V/N, (r+1)*V/N))
    e = embedding(embed_tokens.weight[V, H], ids)  i = ids - tp_vocab_ids[0];  out = i < 0 or i >= V/N
                                                   e = masked_fill(embedding(W_r, masked_fill(i, out, 0)), out, 0)
                                                   e = graphllm.all_reduce(e, group)
    logits = linear(x, lm_head.weight[V, H])       l = linear(x, W_r[V/N, H])                     # [T, V/N]
                                                   g = graphllm.all_gather(l, N, group)          # [N*T, V/N]
                                                   logits = reshape(permute(reshape(g, [N, T, V/N]), [1, 0, 2]),
                                                                    [T, V])        (sliced to V when padded)

Every rank ends with the full logits (rank 0's sampler reads them); a tied embedding / lm_head weight is
sliced once. r*V/N comes from a buffer (tp_vocab_ids), so the ranks' graphs differ only in their weights: one
compiled step serves every rank. After the rewrite, FakeTensor propagation of the rank's example inputs
checks every shape. The collectives are graphllm's ops (graphllm/ops/collectives.py says why).

`plan` records, per weight name, the part rank r keeps (a RankSlice): what a rank reads from the checkpoint
when the step was captured over placeholder weights (graphllm/runtime/tensor_parallel.py).

The pass drops export's input guards (written for the full head count) and narrows the example KV
caches, for re-export; it runs first, before quantization (which then quantizes each rank's slices) and
the fusions.

Refused with the numbers: heads or the intermediate size not divisible by N, N not a multiple of Hkv
when Hkv < N, already-quantized linears (a pre-quantized checkpoint's; not sharded yet), an expert
intermediate size that does not divide. Refused by name (for_model): mixtures of experts in eager tensor
parallelism (a rank reads its slices of the checkpoint's per-expert tensors: not written yet; compiled
artifacts shard them), the families that keep q/k/v fused or norm q/k over all heads, DeepSeek-V2 and
Gemma 2 / 3 (not checked yet).
"""

import torch
from torch import fx

import graphllm.ops.collectives  # noqa: F401  (registers graphllm.all_reduce / all_gather)
from graphllm.ir.graph import StepGraph, attr_tensor, copy_source_meta, new_node
from graphllm.models.loader import RankSlice
from graphllm.passes.base import GraphPass

LINEAR = torch.ops.aten.linear.default
FUSED_MOE = "graphllm::fused_moe"  # its overload's name (the op registers when an MoE model is imported)
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
QUANTIZED = ("fp8_linear", "int8_linear", "int4_linear", "fused_moe_fp8")  # quantization runs after sharding
VOCAB = ("lm_head", "embed_tokens")  # a linear over the vocabulary rows (embed_tokens: lm_head tied to it)
VOCAB_IDS = "tp_vocab_ids"  # the buffer of the token ids whose rows rank r holds
TP_GROUP = "0"  # the name torch.distributed gives the default (WORLD) group, which the ranks form
NOT_CHECKED = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")  # refused by for_model until a TP parity test covers them


class ShardTP(GraphPass):
    """rank's shard of an N-way tensor-parallel step; counts {"column": n, "row": n, "all_reduce": n}."""

    name = "shard_tp"
    version = 1

    def __init__(self, rank: int, world_size: int, group_name: str, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, vocab_parallel: bool = True):
        check_divisible(world_size, num_heads, num_kv_heads, intermediate_size)
        self.rank, self.world_size, self.group_name = rank, world_size, group_name
        self.vocab_parallel = vocab_parallel
        self.heads = (num_heads, num_kv_heads, head_dim)
        self.intermediate_size = intermediate_size

    def apply(self, graph: StepGraph) -> dict[str, int]:
        counts = {"column": 0, "row": 0, "all_reduce": 0, "vocab": 0, "experts": 0}
        _drop_input_guards(graph)
        self._sharded: dict[str, int] = {}  # get_attr target -> vocabulary size, once sliced
        self.plan: dict[str, RankSlice] = {}  # weight name -> the part of it this rank holds
        for node in list(graph.graph.nodes):
            if node.op == "call_function" and getattr(node.target, "__name__", "").split(".")[0] in QUANTIZED:
                raise ValueError(f"tensor parallelism over quantized linears or experts ({node.target}) is not "
                                 "supported yet: shard before quantizing, or use --tensor-parallel-size 1")
            member = _member(node)
            if member in COLUMN:
                self._shard_column(graph, node, member)
                counts["column"] += 1
            elif member in ROW:
                self._shard_row(graph, node)
                self._all_reduce_after(graph, node)
                counts["row"] += 1
                counts["all_reduce"] += 1
            elif _is_fused_moe(node):
                self._shard_experts(graph, node)
                self._all_reduce_after(graph, node)
                counts["experts"] += 1
                counts["all_reduce"] += 1
            elif member in VOCAB and self.vocab_parallel:  # embed_tokens: a tied lm_head
                self._shard_lm_head(graph, node)
                counts["vocab"] += 1
            elif _is_embedding(node) and self.vocab_parallel:
                self._shard_embedding(graph, node)
                counts["vocab"] += 1
                counts["all_reduce"] += 1
        *inputs, caches = graph.example_inputs  # rank r's caches hold its KV heads (for re-export)
        graph.example_inputs = (*inputs, [self.local_kv(c) for c in caches])
        graph.gm.recompile()
        check_shapes(graph)
        return counts

    @classmethod
    def for_model(cls, config, rank: int, world_size: int, group_name: str, eager: bool = False) -> "ShardTP":
        """The pass for rank `rank` of a ModelConfig's model; eager: for a step whose ranks read their slices of
        the checkpoint themselves (runtime/tensor_parallel.shard_step), not a compiled artifact."""
        if getattr(config, "kv_lora_rank", 0):
            raise ValueError(f"{config.architecture} uses multi-head latent attention (MLA, DeepSeek-V2): tensor "
                             "parallelism does not split its latent projections or cache yet; use "
                             "--tensor-parallel-size 1")
        if getattr(config, "num_experts", 0) and eager:
            raise ValueError(f"{config.architecture} is a mixture of experts: eager tensor parallelism does not read "
                             "a rank's slices of its experts yet; compile it (graphllm compile --tensor-parallel-size "
                             "N, or compile=True), which shards them, or use --tensor-parallel-size 1")
        if getattr(config, "num_experts", 0) and getattr(config, "moe_intermediate_size", 0) % world_size:
            raise ValueError(f"tensor parallelism splits each expert's intermediate size: "
                             f"moe_intermediate_size {config.moe_intermediate_size} does not divide by {world_size}")
        if getattr(config, "fused_qkv_gate_up", False):
            raise ValueError(f"{config.architecture} keeps q/k/v and gate/up fused as its checkpoint stores them: "
                             "tensor parallelism does not split those yet")
        if getattr(config, "architecture", "") in NOT_CHECKED:
            raise ValueError(f"{config.architecture}: tensor parallelism has not been checked against Gemma's blocks "
                             "(the tied lm_head split over the vocabulary under the sqrt(hidden)-scaled embedding and "
                             "the final-logit soft cap); use --tensor-parallel-size 1")
        if getattr(config, "qk_norm_whole", False):
            raise ValueError(f"{config.architecture} normalises q and k over all heads at once: with heads "
                             "split across ranks that norm would need an all-reduce of its own; tensor "
                             "parallelism is not supported for it yet")
        return cls(rank, world_size, group_name, config.num_attention_heads, config.num_key_value_heads,
                   config.head_dim, config.intermediate_size)

    def kv_heads(self) -> slice:
        """The KV heads rank r holds: its share, or with fewer KV heads than ranks the one (replicated)
        that serves its query heads."""
        num_kv_heads, n, r = self.heads[1], self.world_size, self.rank
        if num_kv_heads >= n:
            per = num_kv_heads // n
            return slice(r * per, (r + 1) * per)
        head = r // (n // num_kv_heads)
        return slice(head, head + 1)

    def local_kv(self, cache: torch.Tensor) -> torch.Tensor:
        """Rank r's heads of a full [2, blocks, block_size, Hkv, D] cache (a copy)."""
        return cache[:, :, :, self.kv_heads()].clone()

    def _rows_of(self, member: str) -> slice:
        """The output rows (of a column-parallel weight) rank r keeps."""
        num_heads, num_kv_heads, d = self.heads
        n, r = self.world_size, self.rank
        if member == "q_proj":
            per = num_heads // n
            return slice(r * per * d, (r + 1) * per * d)
        if member in ("k_proj", "v_proj"):
            heads = self.kv_heads()
            return slice(heads.start * d, heads.stop * d)
        per = self.intermediate_size // n
        return slice(r * per, (r + 1) * per)

    def _shard_column(self, graph: StepGraph, node: fx.Node, member: str) -> None:
        rows = self._rows_of(member)
        part = RankSlice(0, rows.start, rows.stop - rows.start)
        self._slice(graph, node.args[1], part, lambda w: w[rows].contiguous())
        if len(node.args) > 2 and node.args[2] is not None:
            self._slice(graph, node.args[2], part, lambda b: b[rows].contiguous())

    def _shard_row(self, graph: StepGraph, node: fx.Node) -> None:
        member = _member(node)
        width = self.heads[0] * self.heads[2] if member == "o_proj" else self.intermediate_size
        per = width // self.world_size
        cols = slice(self.rank * per, (self.rank + 1) * per)
        self._slice(graph, node.args[1], RankSlice(1, cols.start, per), lambda w: w[:, cols].contiguous())
        if len(node.args) > 2 and node.args[2] is not None and self.rank != 0:
            bias = attr_tensor(graph.gm, node.args[2])
            self._slice(graph, node.args[2], RankSlice(0, 0, bias.shape[0], zeros=True), torch.zeros_like)

    def _shard_experts(self, graph: StepGraph, node: fx.Node) -> None:
        """Rank r's rows of each expert's gate and up halves (w13 [E, 2I, H]) and its columns of w2 [E, H, I].
        No RankSlice: the two halves are not one range (eager ranks refuse MoE: for_model)."""
        size = attr_tensor(graph.gm, node.args[3]).shape[2]  # I
        if size % self.world_size:
            raise ValueError(f"tensor parallelism splits each expert's intermediate size: {size} does not divide by "
                             f"{self.world_size}")
        per = size // self.world_size
        lo, hi = self.rank * per, (self.rank + 1) * per
        _replace_weight(graph, node.args[2],
                        lambda w: torch.cat([w[:, lo:hi], w[:, size + lo:size + hi]], 1).contiguous())
        _replace_weight(graph, node.args[3], lambda w: w[:, :, lo:hi].contiguous())

    def _slice(self, graph: StepGraph, attr: fx.Node, part: RankSlice, shard) -> None:
        """Swap attr's weight for rank r's part of it, and note the part in `plan` (what a rank reads)."""
        self.plan[attr.target] = part
        _replace_weight(graph, attr, shard)

    def _all_reduce_after(self, graph: StepGraph, node: fx.Node) -> None:
        users = list(node.users)
        with graph.graph.inserting_after(node):
            reduced = graph.graph.call_function(torch.ops.graphllm.all_reduce.default, (node, self.group_name))
        copy_source_meta(reduced, node)
        if "val" in node.meta:
            reduced.meta["val"] = node.meta["val"]
        for user in users:
            user.replace_input_with(node, reduced)

    def vocab_rows(self, vocab_size: int) -> tuple[int, int]:
        """(first row, rows) of the vocabulary rank r holds: the vocabulary padded up to a multiple of N,
        split evenly; the last ranks' shares may run past vocab_size (their padding rows are zero)."""
        per = -(-vocab_size // self.world_size)
        return self.rank * per, per

    def _vocab_shard(self, graph: StepGraph, attr: fx.Node) -> tuple[int, int, int]:
        """Slice the [V, H] weight of attr to rank r's rows (zero-padded); returns (V, first row, rows)."""
        if attr.target not in self._sharded:  # a tied weight comes here twice: slice it once
            self._sharded[attr.target] = attr_tensor(graph.gm, attr).shape[0]
            start, per = self.vocab_rows(self._sharded[attr.target])
            self._slice(graph, attr, RankSlice(0, start, per), lambda w: _padded_rows(w, start, per))
        vocab_size = self._sharded[attr.target]
        return (vocab_size, *self.vocab_rows(vocab_size))

    def _shard_lm_head(self, graph: StepGraph, node: fx.Node) -> None:
        """logits = linear(x, W[V, H]) -> rank r's [T, V/N] logits, all-gathered into the full [T, V] on every
        rank (the sampler reads rank 0's)."""
        vocab_size, _, per = self._vocab_shard(graph, node.args[1])
        n, g = self.world_size, graph.graph
        users = list(node.users)
        steps = [(torch.ops.graphllm.all_gather.default, (n, self.group_name)),  # [N*T, V/N]
                 (torch.ops.aten.reshape.default, ([n, -1, per],)),
                 (torch.ops.aten.permute.default, ([1, 0, 2],)),
                 (torch.ops.aten.reshape.default, ([-1, n * per],))]  # [T, N*V/N]: rank 0's rows first
        if n * per != vocab_size:
            steps.append((torch.ops.aten.slice.Tensor, (1, 0, vocab_size)))
        last = node
        for target, rest in steps:  # no fake values yet: check_shapes propagates them over the rank's shapes
            with g.inserting_after(last):
                last = g.call_function(target, (last, *rest))
            copy_source_meta(last, node)
        for user in users:
            user.replace_input_with(node, last)

    def _shard_embedding(self, graph: StepGraph, node: fx.Node) -> None:
        """embedding(W[V, H], ids) -> rank r looks up the ids in its rows (others read row 0 and are zeroed),
        then an all-reduce sums the ranks' rows: each id's row comes from exactly one rank."""
        weight, ids = node.args[:2]
        _, start, per = self._vocab_shard(graph, weight)
        g, aten = graph.graph, torch.ops.aten
        users = list(node.users)
        if not hasattr(graph.gm, VOCAB_IDS):
            # the ids rank r holds, as a weight, so every rank's code is the same; a 0-d start would be
            # inlined into the code by Inductor (it inlines tensor constants of up to 8 elements)
            graph.gm.register_buffer(VOCAB_IDS, torch.arange(start, start + per, dtype=torch.int64))
        with g.inserting_before(node):
            rows = g.get_attr(VOCAB_IDS)
            rows.meta["val"] = torch.empty((per,), dtype=torch.int64)
            first = new_node(g, aten.select.int, (rows, 0, 0), node)
            local = new_node(g, aten.sub.Tensor, (ids, first), node)
            outside = new_node(g, aten.logical_or.default, (new_node(g, aten.lt.Scalar, (local, 0), node),
                                                             new_node(g, aten.ge.Scalar, (local, per), node)), node)
            safe = new_node(g, aten.masked_fill.Scalar, (local, outside, 0), node)
        node.replace_input_with(ids, safe)
        with g.inserting_after(node):
            mask = new_node(g, aten.unsqueeze.default, (outside, -1), node)
        with g.inserting_after(mask):
            zeroed = new_node(g, aten.masked_fill.Scalar, (node, mask, 0.0), node)
        for user in users:
            user.replace_input_with(node, zeroed)
        self._all_reduce_after(graph, zeroed)


def check_divisible(world_size: int, num_heads: int, num_kv_heads: int, intermediate_size: int) -> None:
    """The shapes an N-way split can hold, else a ValueError with the numbers."""
    problems = []
    if num_heads % world_size:
        problems.append(f"{num_heads} attention heads")
    if num_kv_heads >= world_size and num_kv_heads % world_size:
        problems.append(f"{num_kv_heads} KV heads")
    if num_kv_heads < world_size and world_size % num_kv_heads:
        problems.append(f"{num_kv_heads} KV heads (fewer than the ranks: the ranks must be a multiple)")
    if intermediate_size % world_size:
        problems.append(f"intermediate size {intermediate_size}")
    if problems:
        raise ValueError(f"tensor-parallel size {world_size} does not divide {', '.join(problems)}")


def local_kv_heads(num_kv_heads: int, world_size: int) -> int:
    """KV heads in each rank's cache."""
    return max(num_kv_heads // world_size, 1)


def _drop_input_guards(graph: StepGraph) -> None:
    """torch.export's `_guards_fn` checks the inputs against the full model's shapes (the KV caches'
    head count): rank r's caches differ, and a re-export writes the guards anew."""
    for node in list(graph.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.graph.erase_node(node)
            delattr(graph.gm, "_guards_fn")
    hooks = graph.gm._forward_pre_hooks  # the unlifted module's input-constraint check, the same guards
    for key in [k for k, hook in hooks.items() if "input_constraints" in getattr(hook, "__name__", "")]:
        del hooks[key]


def check_shapes(graph: StepGraph) -> None:
    """Propagate FakeTensors of the rank's example inputs through the sharded graph: a head count or width
    the slices left inconsistent fails here, naming the node, not at run time."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = torch.utils._pytree.tree_map_only(torch.Tensor, mode.from_tensor, graph.example_inputs)
    try:
        FakeTensorProp(graph.gm, mode).propagate(*fake)
    except Exception as exc:
        raise ValueError(f"shard_tp: the sharded graph does not type-check with rank shapes: {exc}") from exc


def _is_embedding(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is torch.ops.aten.embedding.default
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr")


def _padded_rows(weight: torch.Tensor, start: int, rows: int) -> torch.Tensor:
    """weight[start:start + rows], zero rows past its end."""
    out = weight.new_zeros((rows, *weight.shape[1:]))
    have = max(0, min(rows, weight.shape[0] - start))
    out[:have] = weight[start:start + have]
    return out


def _is_fused_moe(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "name", lambda: "")() == FUSED_MOE


def _member(node: fx.Node) -> str | None:
    """'q_proj' for node = aten.linear(x, get_attr <p>.q_proj.weight, ...), else None."""
    if node.op != "call_function" or node.target is not LINEAR or len(node.args) < 2:
        return None
    weight = node.args[1]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr" or not weight.target.endswith(".weight"):
        return None
    return weight.target.removesuffix(".weight").rpartition(".")[2]


def _replace_weight(graph: StepGraph, attr: fx.Node, shard) -> None:
    """Swap the parameter a get_attr node reads for shard(parameter) (a tied weight is left alone:
    the split linears never share theirs)."""
    path, _, name = attr.target.rpartition(".")
    owner = graph.gm.get_submodule(path)
    old = getattr(owner, name)
    owner.register_parameter(name, torch.nn.Parameter(shard(old.detach()), requires_grad=False))
