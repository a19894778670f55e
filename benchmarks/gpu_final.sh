#!/usr/bin/env bash
# The fourteenth session's last device call (about 300 s): the GPU tests of the Gemma norm fusion and the
# verify attention kernel, then Gemma 2 9B latency, then bench spec at batch 1, k = 4 (if time is left).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="/tmp/site:$PWD" || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 130 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
  tests/kernels/test_paged_verify_attention.py tests/kernels/test_rms_norm.py tests/kernels/test_skinny_matmul.py \
  tests/kernels/test_triton_backend.py tests/gpu/test_cuda_graphs.py \
  -k "verify or unit_offset or gemma or spec" 2>&1 | grep -v DEBUG | tee "$OUT/tests.log" | tail -15
bash benchmarks/gpu_run.sh fam-gemma-2-9b clean 2>&1 | grep -v DEBUG | tail -8
python3 -m graphllm.cli bench spec --preset llama-3-8b --batch-sizes 1 --num-speculative-tokens 4 \
  --acceptance-rates 1.0 --input-len 128 --output-len 128 --max-num-seqs 256 --max-model-len 2064 \
  --max-num-batched-tokens 8192 --work /tmp/bench-work --json "$OUT/spec-b1.json" 2>&1 | grep -v DEBUG | tail -6
