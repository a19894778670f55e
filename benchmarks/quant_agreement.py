"""Teacher-forced top-1 agreement of each quantized artifact with the bf16 one (issue 15, GPU).

    python benchmarks/quant_agreement.py CACHE_DIR MODEL_DIR OUT.json

Finds the artifacts `graphllm bench latency` compiled for MODEL_DIR under CACHE_DIR/artifacts
(one per --quantization, the bf16 one without), loads each in turn (compiled, CUDA graphs), and
feeds all of them the same 8 random token histories (40-token prompts, 88 forced positions; the
engine's sampler records its top-1 and hands back the history's token). Agreement = the share of
positions where a scheme's top-1 equals bf16's. The random-weight preset has nearly flat logits
(N(0, 0.02) weights), where small rounding flips the top-1: a pessimistic measure of what
quantization changes, not of a trained model's quality loss (the demo eval measures that).
"""

import gc
import json
import sys
from pathlib import Path

import torch

from graphllm import Engine
from tests.gpu.test_attention_backends import FORCED_LEN, NUM_SEQS, PROMPT_LEN, agreement, teacher_forced_top1


def artifacts_by_scheme(cache_dir: Path, model_dir: Path) -> dict[str, Path]:
    found = {}
    for manifest_file in sorted((cache_dir / "artifacts").glob("*/manifest.json")):
        manifest = json.loads(manifest_file.read_text())
        if Path(manifest["model"]["source"]).resolve() != model_dir.resolve():
            continue
        scheme = (manifest.get("quantization") or {}).get("scheme") or "bf16"
        found.setdefault(scheme, manifest_file.parent)
    return found


def main(cache_dir: str, model_dir: str, out: str) -> None:
    arts = artifacts_by_scheme(Path(cache_dir), Path(model_dir))
    if "bf16" not in arts:
        raise SystemExit(f"no bf16 artifact of {model_dir} under {cache_dir}: run bench latency without --quantization first")
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    histories = torch.randint(3, vocab, (NUM_SEQS, PROMPT_LEN + FORCED_LEN), generator=gen).tolist()
    picked = {}
    for scheme in ["bf16"] + sorted(s for s in arts if s != "bf16"):
        engine = Engine.load(str(arts[scheme]), async_scheduling=False, max_num_seqs=NUM_SEQS,
                             kv_cache_memory_gib=4)
        picked[scheme] = teacher_forced_top1(engine, histories)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    result = {"agreement_with_bf16": {s: agreement(picked["bf16"], p) for s, p in picked.items() if s != "bf16"},
              "positions": NUM_SEQS * FORCED_LEN,
              "compile_phases_s": {s: json.loads((a / "manifest.json").read_text())["timings"] for s, a in arts.items()}}
    Path(out).write_text(json.dumps(result, indent=2))
    for scheme, value in result.items():
        print(f"{scheme:>10}: {value}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
