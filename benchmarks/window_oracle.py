"""Gemma 2's sliding window in transformers on this machine: the tiny test model's greedy tokens for a prompt one
token longer than its window (8), on the CPU and on the GPU, next to the tokens with the window set to 7, 8 and 9
on the CPU (which window the GPU's transformers applies). Prints one line a run."""

import sys

import torch
import transformers

sys.path.insert(0, ".")
from tests.tiny_models import make_hf_model  # noqa: E402

PROMPT = list(range(90, 99))


def greedy(hf, device: str) -> list[int]:
    hf = hf.to(device)
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT], device=device), max_new_tokens=11, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def main() -> None:
    print("transformers", transformers.__version__, "torch", torch.__version__)
    hf = make_hf_model("gemma2")
    print("attn", hf.config._attn_implementation)
    if torch.cuda.is_available():
        print("cuda  window 8", greedy(hf, "cuda"))
    for window in (8, 7, 9):
        hf.config.sliding_window = window
        for m in hf.modules():
            if getattr(m, "sliding_window", None):
                m.sliding_window = window
        print("cpu   window", window, greedy(hf, "cpu"))


if __name__ == "__main__":
    main()
