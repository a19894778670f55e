"""Shared by the GPU tests: transformers' greedy tokens, the oracle."""

import torch


def transformers_greedy(hf, prompts: list[list[int]], max_new_tokens: int, device: str = "cuda") -> list[list[int]]:
    """Each prompt alone through transformers' generate on `device` (the GPU by default), EOS ignored: the new
    tokens."""
    hf = hf.to(device)
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt], device=device), max_new_tokens=max_new_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        expected.append(out[0, len(prompt):].tolist())
    return expected


def sharpened_model_folder(model_class, config, folder):
    """A random-weight transformers model of config (seed 0), its output head scaled by 8 so that its top-1 is
    better defined than flat random logits allow, saved to folder: the bf16 tests' models."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    return folder
