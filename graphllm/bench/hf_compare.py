"""`--compare transformers`: the same workload through transformers' batched `generate`, same process.

The caller frees its engine first. The model loads with the engine's dtype on the engine's
device; prompts are left-padded with an attention mask; decoding is greedy with no EOS token
(eos_token_id=None), so every row generates exactly what was asked.
Time stamps come from a stopping criterion that runs after each new token (device synced), so
prefill (to the first token) and decode are split as they are for the engine.
"""

import time
from pathlib import Path

import torch

from graphllm.bench.workload import BenchRequest, free_engine, summarize_run, synchronizer


class TokenClock:
    """A stopping criterion that never stops: it records when each new token was appended."""

    def __init__(self, device: torch.device):
        self.sync, self.stamps = synchronizer(device), []

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.sync()
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def load_model(model_dir: Path, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    return model


def pad_id(model) -> int:
    config = model.generation_config
    for token in (config.pad_token_id, config.eos_token_id, 0):
        if token is not None:
            return token[0] if isinstance(token, list) else token


def left_pad(prompts: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)  # [B, S]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)  # [B, S]
    return ids, mask


@torch.inference_mode()
def generate(model, prompts: list[list[int]], new_tokens: int, device: torch.device) -> dict:
    """One batched greedy generate of exactly `new_tokens` per row, with its timing."""
    from transformers import StoppingCriteriaList
    ids, mask = left_pad(prompts, pad_id(model), device)
    clock = TokenClock(device)
    clock.sync()
    start = time.perf_counter()
    # eos_token_id=None: no EOS check at all (min_new_tokens would only mask EOS logits, and a row
    # whose every likely token is EOS would still stop)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=None, do_sample=False,
                         pad_token_id=pad_id(model), stopping_criteria=StoppingCriteriaList([clock]))
    first, end = clock.stamps[0], clock.stamps[-1]
    return {"prefill_s": first - start, "decode_s": end - first, "e2e_s": end - start,
            "generated": out.shape[1] - ids.shape[1]}


def latency_entry(run: dict, batch_size: int, input_len: int, output_len: int) -> dict:
    per_seq = (output_len - 1) / run["decode_s"] if run["decode_s"] > 0 else None
    return {"prefill_s": run["prefill_s"], "prefill_tok_s": batch_size * input_len / run["prefill_s"],
            "decode_s": run["decode_s"], "decode_tok_s_per_seq": per_seq,
            "decode_tok_s": per_seq and batch_size * per_seq,
            "e2e_s": run["e2e_s"], "e2e_tok_s": batch_size * output_len / run["e2e_s"],
            "generated_tokens": [run["generated"]] * batch_size}


def ratios(ours: dict, theirs: dict, keys: tuple[str, ...]) -> dict:
    """ours / theirs for each rate; above 1 means the engine is faster."""
    return {k: ours[k] / theirs[k] if ours.get(k) and theirs.get(k) else None for k in keys}


def compare_latency(results: list[dict], model_dir: Path, dtype: torch.dtype, device: torch.device,
                    prompt_sets: list[list[list[int]]], output_len: int) -> None:
    """Adds "transformers" and "ratio" to each batch size's result."""
    model = load_model(model_dir, dtype, device)
    generate(model, prompt_sets[0][:1], 2, device)  # warm-up
    for result, prompts in zip(results, prompt_sets):
        b, input_len = len(prompts), len(prompts[0])
        theirs = latency_entry(generate(model, prompts, output_len, device), b, input_len, output_len)
        result["transformers"] = theirs
        result["ratio"] = ratios(result, theirs, ("prefill_tok_s", "decode_tok_s", "e2e_tok_s"))
        print(f"transformers batch {b}: prefill {theirs['prefill_s'] * 1e3:.1f} ms, "
              f"decode {theirs['decode_tok_s'] or 0:.1f} tok/s", flush=True)
    del model
    free_engine()


def throughput(model_dir: Path, dtype: torch.dtype, device: torch.device, requests: list[BenchRequest],
               batch_size: int) -> dict:
    """Requests in order, `batch_size` at a time; a batch runs to its longest requested output and
    only each request's requested tokens count as output."""
    model = load_model(model_dir, dtype, device)
    generate(model, [requests[0].prompt], 2, device)  # warm-up
    sync, generated, per_batch = synchronizer(device), [], []
    sync()
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        chunk = requests[i:i + batch_size]
        run = generate(model, [r.prompt for r in chunk], max(r.output_len for r in chunk), device)
        generated += [min(run["generated"], r.output_len) for r in chunk]  # useful tokens only
        per_batch.append(run["generated"])
    wall = time.perf_counter() - start
    del model
    free_engine()
    return summarize_run(requests, generated, wall) | {"hf_batch_size": batch_size, "batch_generated_tokens": per_batch}

