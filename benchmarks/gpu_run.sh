#!/usr/bin/env bash
# One device call on the H200: install the carried wheels, then run the stages named in $@:
#   sweep      benchmarks/kernel_sweep.py (skinny_matmul vs cuBLAS, decode attention bandwidth); sweep-PART: one part;
#              ab-sweep-PART  this tree's sweep script over .ab/'s kernels (sweep-attention-launch ab-sweep-attention-launch:
#              the engine's decode launch at throughput shapes, this tree against .ab/); sweep-attention-flashinfer:
#              an fp8 cache's decode, this kernel against FlashInfer's (CUDA cores and tensor cores), same pages
#   overlap    benchmarks/overlap_probe.py: a decode layer's attention beside the other half-batch's GEMMs on a second
#              stream, against the serial step (issue 19: whether a NanoFlow-style executor pays)
#   waits      benchmarks/host_waits.py (where the host waits for the GPU under async scheduling; after a bench stage)
#   mixed      benchmarks/mixed_step_profile.py on the 8B preset (needs a latency/throughput stage before it)
#   noskinny1-B  latency1-B compiled with --no-skinny-linear (cuBLAS for every linear)
#   steps8-B / tput8-B  latency1-B / throughput-B with --num-decode-steps 8;  gpu-steps  its GPU tests
#   skinny     the skinny_matmul / row-kernel tests and the skinny_linear / linear_prologue pass tests alone
#   nofused8-B steps8-B compiled with --no-linear-prologue (norms and SwiGLU as their own kernels again)
#   latency1-B bench latency at batch 1 and 8 only, backend B
#   STAGE-sumsq  a bench stage compiled with --row-sumsq (o_proj / down store the next norm's row statistics at
#              2-8 rows);  sumsq-tests  its kernel tests on the GPU and its 8-row teacher-forced agreement
#   tests      GPU-marked tests (kernels against references, backends against transformers / eager); 540 s: with a
#              cold Triton cache tests/kernels alone took most of the old 330 s limit on 2026-11-24
#   tests-gpu-x  tests/gpu alone in TESTS_WORKERS=6 pytest-xdist processes (engines size their KV caches from the
#              free memory, so a later one gets less: six fit on the H200, 2026-12-06 s31 call 4; not yet tried on an
#              H100, where tests/kernels' engine tests ran out of memory in 8); TESTS_K=EXPR: only tests matching -k EXPR
#   tests-engines  tests/kernels' engine tests alone, one at a time (tests-gpu runs them before tests/gpu)
#   tests-kernels, tests-gpu  its two parts (tests/kernels in TESTS_WORKERS=8 processes where .whl has
#              pytest-xdist); TESTS_LIMIT=S in the environment: S seconds a part instead of 540
#   moe-shapes  the fused MoE kernels at Qwen3-30B-A3B's and Mixtral's shapes
#   latency-B  graphllm bench latency, 8B shape, attention backend B (flashinfer|triton|torch)
#   profile-B  bench latency at batch 1 with --profile, backend B;  profile8-B  the same at batch 8;
#              profile256-B  at batch 256 over 512-token prompts (a throughput run's decode steps: how much of
#              each is GEMMs and KV reads, and what the rest is)
#   throughput graphllm bench throughput, 8B shape, 1,024 requests, with --compare transformers
#   throughput-B  the same without the comparison, backend B
#   teacher    the bf16 teacher-forcing tests alone;  f32-K  float32 GPU tests matching K, CUDA_LAUNCH_BLOCKING=1
#   sync1-B / synctput-B  latency1-B / throughput-B with --no-async-scheduling (host and GPU take turns)
#   fp8-tests  the fp8 KV cache tests (kernels, backends, engine; ~5 min with a cold Triton cache since the
#              causal split: run attn-tests for the attention kernels and fp8-engine-tests for the rest)
#   full-tests (issue 19) the mixed-step CUDA graph tests (--cudagraph-mode FULL); full-tests-K  those matching K
#              alone, stopping at the first failure with its traceback;  full1-B / fulltput-B  latency1-B /
#              throughput-B with --cudagraph-mode FULL (the A/B against latency1-B / throughput-B in the same call)
#   rope1-B    latency1-B compiled with --no-fuse-rope-attention (the A/B against latency1-B, where it is on)
#   qprof256-fp8kv  profile256-triton with fp8 W8A8 weights and an fp8 KV cache (where issue 15's 1.4x goes)
#   recheck-tests  GPU tests that failed on 2026-12-02 for the tests' own reasons (CPU tensors, a reference
#              dividing by a Python float), after their fixes
#   unfused1-B latency1-B with --no-fuse-rope-decode (rope_store_kv before the decode kernel again: the A/B of the
#              decode kernel's own rotary + KV write, kernels/rope_decode.py; the same artifact)
#   fusion-tests  the decode kernel tests, its rotary tests and the engines with it on (GPU rows)
#   STAGE-noepi  any bench stage with --no-linear-epilogue (SwiGLU back in down's prologue / its own kernel: the
#              A/B of linear_epilogue), e.g. latency1-triton-noepi, fam-phi-3-mini-noepi; combines with -nopdl after it
#   STAGE-rs   any bench stage with --row-sumsq (bf16 pairs too; int4 takes its pairs by default since s44: the norms
#              between int4 linears split into the product before and the one after, no norm kernel at 1-16 rows;
#              before -epi / -nopdl if combined), e.g. latency1-triton-epi-rs; STAGE-nors with --no-row-sumsq
#   STAGE-mma  any bench stage with --int4-mma (int4 linears on kernels/int4_mma.py's tensor-core kernel up to 16
#              rows, without the int4 folds: the A/B is qlat-int4-mma against qlat-int4-nofold and qlat-int4)
#   STAGE-nofold  any bench stage with --no-row-sumsq --no-linear-epilogue (int4: the A/B of the default's folds,
#              e.g. qlat-int4-nofold against qlat-int4)
#   STAGE-snp  any bench stage with --shared-norm-prologue (a MoE layer's post-attention norm in the router's one-row
#              launch, which stores it for the experts: the A/B against the stage without it), e.g. moe-lat-snp;
#              snp-tests  its kernel tests and the Qwen3-MoE engine's one-row rows with and without it (and the
#              same for --fuse-moe-router, below)
#   STAGE-route  any bench stage with --fuse-moe-router (a MoE layer's router GEMV and expert choice in one launch at
#              one token: the A/B against the stage without it), e.g. moe-lat-route
#   STAGE-pn   any bench stage with --persistent-norms (Inductor's 4,096-wide norm rows, with an fp8 linear's
#              quantization, as persistent reductions: the A/B against the stage without it), e.g. qtput-fp8kv-pn,
#              qtput-fp8kv-big-pn
#   STAGE-xqa  any bench stage with --xqa-decode (decode attention by TensorRT-LLM's XQA kernel, flashinfer.xqa; a
#              run-time switch, so the stage's artifact is the one without it), e.g. qtput-fp8kv-big-xqa;
#              xqa-tests  its GPU tests (XQA is on by default over float8 caches since s37: STAGE-noxqa is the A/B)
#   STAGE-xm   any bench stage (and mixed-fp8) with --xqa-mixed: a mixed step's decodes through XQA
#              too (s37, off by default), e.g. qtput-fp8kv-xm, mixed-fp8-xm
#   STAGE-epi  any bench stage with --linear-epilogue (gate_up's rows interleaved, SwiGLU in its epilogue: the A/B
#              against the stage without it), e.g. latency1-triton-epi;  epi-tests  its kernel, op and engine tests
#   qtput-S-big  qtput-S with 512 sequences and 16,384 tokens a step (its own artifact; vLLM's offline defaults
#              on 70+ GiB GPUs are 1,024 and 16,384)
#   STAGE-nopdl  any bench stage with --no-enable-pdl (PDL is on by default since s25): e.g. qlat-int4-nopdl,
#              qtput-none-nopdl, moe-lat-nopdl; the pdl* stages name --enable-pdl, which is now the default
#   pdl1-B     latency1-B with --enable-pdl (the decode linears as programmatic dependents: the A/B against
#              latency1-B); pdlfam-P  fam-P with --enable-pdl; pdlq-S  qlat-S with --enable-pdl; moe-lat-pdl
#              moe-lat with --enable-pdl;  pdl-tests  its GPU tests
#   kernels    rope_store_kv, the triton backend, the rope pass and the sampler tests, one pytest per file
#   fp8lat-B / fp8tput-B  latency1-B / throughput-B with --kv-cache-dtype fp8;  gpu-async  tests/gpu/test_cuda_graphs.py
#   attn-tests the paged decode / prefill attention kernel tests (560 s: 189 s on 2026-12-01; on 2026-12-02 163 of
#              191 in 450 s with a cold Triton cache, the prefill file the slow part); prefill-tests  the prefill and
#              verify kernel tests alone (fusion-tests has the decode ones);  rope-teacher  teacher with pytest
#              --no-fuse-rope-attention
#   ab-throughput-B / ab-latency1-B  throughput-B / latency1-B from the tree in .ab/ (a checkout of an earlier
#              commit, carried beside this one: a same-run A/B; it shares the preset and the artifact cache);
#              ab-qtput-fp8kv  qtput-fp8kv from .ab/;  ab-qlat-S  qlat-S from .ab/ (S: none, fp8, int4, ...; -lmhead)
#   soak-start soak-S soak-stop  (issue 17) `graphllm serve` of the 8B preset as a daemon (setsid: it outlives
#              the call, so one server can take load across two calls), benchmarks/soak.py with 256 clients for
#              S seconds against it, then SIGTERM and its exit code; the KV pool's state is read after each soak
#   qsweep     benchmarks/quant_kernel_sweep.py (fp8 / int8 / int4 matmul kernels vs cuBLAS, 8B shapes, M 1..256);
#              qsweep-fp8q  the prequantized fp8 path alone, M 1..16 (qsweep-fp8q1: M 1, its winners applied); qsweep-int4  int4 alone at M 1, then its
#              best configs written into int4_matmul.CONFIGS on the device's copy (apply_sweep_configs.py), so
#              that later stages of the same call (qlat-int4) run them; qsweep-pairs  the same at 1, 4 and 16 rows
#              with the nibble-pair dot tiles first; qsweep-int4-16  the same at 16 rows (batch 16's bucket);
#              qtests-mma  int4_mma's tensor-core kernel against the reference and the int4 engine with --int4-mma
#              (s44, opt-in; qsweep-int4 times it beside the GEMV up to 16 rows: the sweep table's mma column);
#              qtests-int4  the int4 kernel tests (and the engine's int4 agreement); qtests-gemv  the one-row GEMV's
#              (F16, the 8B shapes) and the agreement alone; ncu-quant  hardware
#              counters (stall reasons, DRAM and issue use) of the int4 and fp8 kernels at the 8B shapes
#   ncu-attention  hardware counters of the decode attention kernel, bf16 and fp8 caches (ncu_attention.py)
#   qtests     the quantized-matmul kernel tests, the quantization pass tests and the quantized GPU tests;
#              qtests-fp8  the fp8 ones alone
#   qlat-S     bench latency at batch 1 and 16 with --quantization S (none: bf16), the same limits and artifact cache;
#              qlat-S-lmhead: with --quantize-lm-head; qlat-fp8-prologue: fp8 with --fp8-linear-prologue (the A/B
#              against qlat-fp8 in the same call);  qprof-S  profile-B's kernel table for scheme S (triton)
#   qtput-S    bench throughput, 1,024 requests, with --quantization S (none: bf16); qtput-fp8kv: fp8 weights
#              and an fp8 KV cache
#   qagree     benchmarks/quant_agreement.py: teacher-forced top-1 agreement of every quantized artifact of the
#              8B preset with the bf16 one, and each artifact's compile phases (run after the qlat stages)
#   pc-W-on / pc-W-off  (issue 18) bench throughput with prefix caching on / off, workload W: shared (1,024 requests,
#              8 system prompts of 2,048 tokens + 128 of their own, 128 out) or random (the standard one); one
#              artifact for all four (--max-model-len 2320);  pc-tests  tests/runtime/test_prefix_caching.py on
#              the GPU (its engines then run the triton and the torch attention backends)
#   so-tests   (issue 18) the structured-output tests (runtime and server, the demo model on the GPU)
#   so-tput-0 / so-tput-half  bench throughput, 1,024 requests, none / every second one constrained by a JSON
#              schema (--structured-fraction 0.5); the same artifact as qtput-*
#   startup    (issue 19) bench compile --no-decode: a cold compile in a fresh Inductor cache, two warm starts and a
#              cold-disk start (the artifact evicted from the page cache), each with its start-up phases
#   startup-q-S  startup with --quantization S (issue 15's compile time <= bf16's + 20%: run beside startup)
#   startup-full  startup with --cudagraph-mode FULL (the mixed-step graphs' capture time and memory)
#   startup-prof  benchmarks/startup_profile.py: cProfile of a cold compile and of Engine.load (issue 19)
#   norm-tests the decode kernel's folded q/k head norms (rope_decode NORM) on the GPU, and the Qwen3 / Gemma 3
#              engines through compiled graphs against transformers;  ab-moe-lat  moe-lat from .ab/ (its A/B)
#   fastacc-tests  the fp8 matmul kernel tests and the fp8 GPU engine tests (their agreement) alone
#   fp8gemm    benchmarks/fp8_gemm_large_m.py: row-wise and per-tensor _scaled_mm, with and without use_fast_accum,
#              against bf16 cuBLAS at 128-4,096 rows (issue 15's throughput)
#   moe-lat / moe-prof / moe-tput  (issue 20) bench latency (batch 1, 8, 32; moe-lat-fp8: float8 experts and
#              linears), its kernel profile at batch 32 (moe-prof1: at batch 1), and bench
#              throughput of qwen3-30b-a3b with 12 of its 48 layers (preset and artifact of all 48 would not fit the disk)
#   fam-tests  (issue 20) the new families (Gemma 2/3, OLMo 2, Phi-3, DeepSeek-V2) through compiled CUDA graphs
#              against transformers, the soft-capped and MLA attention kernel tests, Phi-3 LongRoPE;
#              clean  drop the presets and artifacts (disk)
#   moe-bench  benchmarks/moe_kernel_bench.py: the fused MoE op alone at Qwen3-30B-A3B's and Mixtral's layer shapes;
#              moe-bench1  Qwen3's alone at 1 and 8 tokens (the one-token tile candidates); moe-bench1-pdl at one
#              token with the graphs under PDL, as the engine's (with the down slabs fetched early and not: plan, early down)
#   moe-kernel-tests  the MoE kernels' tests on the GPU (routing, the one-token router, the experts, EARLY under PDL)
#   moe-router benchmarks/moe_router_bench.py: one token's routing, the router's matmul + topk_softmax against
#              --fuse-moe-router's one launch; ab-moe-router the same script over .ab/'s kernels
#   spec-bench / spec-tests  (issue 21) bench spec (oracle proposer: verify-step cost and speed-up for k 1, 2, 4, 8
#              at batch 1, 8, 32, acceptance 100% and 60%), and the speculative-decoding tests on the GPU;
#              spec-ngram  bench spec --method ngram (prompt lookup on the demo model's arithmetic questions)
#   moe-tests  (issue 20) the fused MoE kernel and op tests (float and float8 experts) and the MoE CUDA-graph tests
#   fam-P      (issue 20) bench latency at batch 1 and 8 of preset P (olmo-2-7b, phi-3-mini, ...), the usual limits;
#              famnp-P  the same compiled with --no-linear-prologue (the A/B of the prologue fusions: Gemma's
#              norms and GeGLU); fam12-P  the same with 12 of its layers (deepseek-v2-lite: preset and artifact of all 27 would not fit
#              the disk together)
#   famprof-P  (issue 20) bench latency --profile at batch 1 of preset P: its step's kernel table
#   spec-prof  (issue 21) bench spec --profile at batch 1, k = 4: kernel tables of plain and verify steps
#   spec-vk    (issue 21) spec-prof's bench with the verify attention kernel switched on (TritonBackend.verify_kernel),
#              under a 240 s timeout: run it under benchmarks/memwatch.sh, on a fresh disk (three calls that ran the
#              kernel from verify graphs lost their machine in the fifteenth session)
#   spec-long  (issue 21) bench spec at 1,900 prompt tokens, batch 1 and 8, k = 4: the verify attention kernel's
#              split over the keys at a long context
# Logs and results go to $OUT (tarred at the end: the tool brings back at most 8 files).
# Usage there: bash benchmarks/gpu_run.sh tests latency-flashinfer
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="/tmp/site:$PWD" || exit 1
export PYTHONUNBUFFERED=1 GRAPHLLM_CACHE_DIR=/tmp/graphllm-cache TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
# bytecode caches where they can be written (the carried wheels install with --no-compile): an installed
# package has its .pyc, and without them every process compiled ~2,300 modules' source (6.7 s of a start-up)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pycache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
WORK=/tmp/bench-work
LIMITS="--max-num-seqs 256 --max-model-len 2064 --max-num-batched-tokens 8192"  # one artifact for all stages
PCLIMITS="--max-num-seqs 256 --max-model-len 2320 --max-num-batched-tokens 8192"  # the pc-* stages' one artifact
BENCH_EXTRA=""  # a -nopdl stage's --no-enable-pdl
BENCH_TIMEOUT=0  # a -sumsq stage's limit: past it SIGABRT, and faulthandler prints every thread's stack
XM=""  # a -xm stage: --xqa-mixed (a mixed step's decodes through XQA; EngineConfig.xqa_mixed, off by default)
bench() {
  PYTHONFAULTHANDLER=1 timeout -s ABRT $BENCH_TIMEOUT python3 -m graphllm.cli bench "$@" $BENCH_EXTRA ${XM:+--xqa-mixed}
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/r/nvidia-smi.txt"
date -u +%FT%TZ | tee "$OUT/r/run.txt"  # the device copy's .git is not the working tree: record the commit where you launch
free_gb() { df -BG --output=avail /tmp | tail -1 | tr -dc 0-9; }
runs="" kept=""  # kept: the tags run since the presets and artifacts were last dropped
for tag in "$@"; do
  start=$(date +%s)
  stage=$tag BENCH_EXTRA="" BENCH_TIMEOUT=0 XM=""  # tag names the outputs; stage picks the commands below
  case $stage in *-xm) stage=${stage%-xm} XM=1 ;; esac
  case $tag in *-nopdl) stage=${tag%-nopdl} BENCH_EXTRA="--no-enable-pdl" ;; esac
  case $stage in *-mma) stage=${stage%-mma} BENCH_EXTRA="$BENCH_EXTRA --int4-mma" ;; esac
  case $stage in *-nofold) stage=${stage%-nofold} BENCH_EXTRA="$BENCH_EXTRA --no-row-sumsq --no-linear-epilogue" ;; esac
  case $stage in *-rs) stage=${stage%-rs} BENCH_EXTRA="$BENCH_EXTRA --row-sumsq" ;; esac
  case $stage in *-nors) stage=${stage%-nors} BENCH_EXTRA="$BENCH_EXTRA --no-row-sumsq" ;; esac
  case $stage in *-noepi) stage=${stage%-noepi} BENCH_EXTRA="$BENCH_EXTRA --no-linear-epilogue" ;; esac
  case $stage in *-epi) stage=${stage%-epi} BENCH_EXTRA="$BENCH_EXTRA --linear-epilogue" ;; esac
  case $stage in *-snp) stage=${stage%-snp} BENCH_EXTRA="$BENCH_EXTRA --shared-norm-prologue" ;; esac
  case $stage in *-route) stage=${stage%-route} BENCH_EXTRA="$BENCH_EXTRA --fuse-moe-router" ;; esac
  case $stage in *-pn) stage=${stage%-pn} BENCH_EXTRA="$BENCH_EXTRA --persistent-norms" ;; esac
  case $stage in *-xqa) stage=${stage%-xqa} BENCH_EXTRA="$BENCH_EXTRA --xqa-decode" ;; esac
  case $stage in *-noxqa) stage=${stage%-noxqa} BENCH_EXTRA="$BENCH_EXTRA --no-xqa-decode" ;; esac
  # qtput-S-big: vLLM's offline batch on a large GPU (its LLM class takes 1,024 sequences and 16,384 tokens a step
  # from 70 GiB up); 512 sequences here, what the H200's KV cache holds of this workload
  qlimits=$LIMITS; case $stage in qtput-*-big) stage=${stage%-big}
    qlimits="--max-num-seqs 512 --max-model-len 2064 --max-num-batched-tokens 16384" ;; esac
  # (the first 8B compile with --row-sumsq, 2026-12-06 on an H100, sat in Inductor's lowering for 7 minutes: 150 s, then
  # the stacks)
  case $stage in *-sumsq) stage=${stage%-sumsq} BENCH_EXTRA="$BENCH_EXTRA --row-sumsq" BENCH_TIMEOUT=150 ;; esac
  # a tag given again names its outputs TAG.2, TAG.3, ... (call 1 of 2026-12-06 ran A/B pairs twice under one tag,
  # and the second run's files replaced the first's)
  runs="$runs $tag"; n=$(echo $runs | tr ' ' '\n' | grep -cxF -- "$tag"); [ $n -gt 1 ] && tag="$tag.$n"
  # a stage that writes a preset and its artifact needs ~35 GB at the 8B-9B shapes: on a machine that already
  # holds others, drop them first (call 8 of 2026-11-29 lost fam-phi-3-mini to a full disk). A stage whose preset
  # is already there needs at most another artifact (~16 GB): it keeps them unless under 20 GB are free (every 8B
  # stage of 2026-12-01 rewrote the preset and recompiled, 34 GB being free after the first)
  case $stage in fam*-*|pdlfam-*) preset=${stage#*-} ;; moe-*|ab-moe-*) preset=qwen3-30b-a3b ;; startup*) preset=startup ;;
    *) preset=llama-3-8b ;; esac
  need=40; [ -d "$WORK/models/$preset" ] && need=20
  # a stage run again since the last drop finds its preset and artifact there (call 1 of 2026-12-06 dropped and rebuilt
  # them twice for A/B pairs run twice: ~80 s of 391)
  echo " $kept " | grep -qF " ${tag%.*} " && need=0
  # the ab- stages write the same presets and artifacts (call 2 of s37: ab-moe-lat was killed at 1 GB free, after a
  # call's 8B preset and three artifacts)
  case $stage in fam*|latency*|mixed*|full1-*|fulltput-*|pdl1-*|pdlfam-*|pdlq-*|qlat-*|qprof*|qtput-*|throughput*|profile*|steps8-*|tput8-*|startup*|moe-*|spec-*|ab-moe-*|ab-qtput-*|ab-qlat-*|ab-throughput-*|ab-latency1-*)
    [ "$(free_gb)" -lt $need ] && { echo "disk: $(free_gb) GB free before $stage: dropping presets and artifacts"; \
      rm -rf $WORK/models $WORK/startup "$GRAPHLLM_CACHE_DIR"; kept=""; } ;;
  esac
  kept="$kept ${tag%.*}"
  case $stage in
    sweep) timeout 400 python3 benchmarks/kernel_sweep.py "$OUT/r/sweep.json" ;;
    overlap) timeout 300 python3 benchmarks/overlap_probe.py "$OUT/r/overlap.json" ;;
    sweep-*) timeout 420 python3 benchmarks/kernel_sweep.py "$OUT/r/$tag.json" ${tag#sweep-} ;;  # tag: -xqa names a part
    ab-sweep-*) PYTHONPATH="/tmp/site:$PWD/.ab" timeout 420 python3 benchmarks/kernel_sweep.py "$OUT/r/$tag.json" \
        ${tag#ab-sweep-} ;;
    fp8-engine-tests) timeout 400 python3 -m pytest -q -rs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_store_kv.py tests/kernels/test_triton_backend.py tests/ops/test_kv_quant.py \
        tests/runtime/test_kv_cache_dtype.py "tests/kernels/test_paged_decode_attention.py::test_quantize_query_heads_rounds_as_torch" \
        "tests/kernels/test_paged_decode_attention.py::test_decode_fp8_qk_matches_reference" \
        "tests/gpu/test_attention_backends.py::test_fp8_cache_with_q_rounded_for_q_k_agrees_as_the_converted_keys_do" \
        2>&1 | grep -v DEBUG > "$OUT/r/fp8-engine-tests.full"; grep -v "^\.*$" "$OUT/r/fp8-engine-tests.full" | tail -40 ;;
    recheck-tests) timeout 200 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        "tests/kernels/test_paged_decode_attention.py::test_quantize_query_heads_rounds_as_torch" \
        "tests/kernels/test_paged_decode_attention.py::test_decode_fp8_qk_matches_reference" \
        "tests/kernels/test_paged_decode_attention.py::test_decode_tiling_rounds_q_where_the_gpu_has_float8_mma" \
        2>&1 | grep -v "^\.*$" | tail -30 ;;
    fp8-tests) timeout 540 python3 -m pytest -q -rs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_store_kv.py tests/kernels/test_paged_decode_attention.py tests/kernels/test_paged_prefill_attention.py \
        tests/kernels/test_triton_backend.py tests/ops/test_kv_quant.py tests/runtime/test_kv_cache_dtype.py 2>&1 \
        | grep -v "^\.*$" | grep -v DEBUG | tail -40 ;;
    waits) timeout 300 python3 benchmarks/host_waits.py $WORK/models/llama-3-8b "$OUT/r/waits.json" ;;
    mixed) timeout 200 python3 benchmarks/mixed_step_profile.py $WORK/models/llama-3-8b "$OUT/r/mixed.json" ;;
    # a throughput run's prefill / mixed step (~200 decodes + ~900 prompt tokens), bf16 or fp8 W8A8 + fp8 KV
    mixed-none|mixed-fp8) python3 -c "from pathlib import Path; from graphllm.bench.presets import write_preset
d = Path('$WORK/models/llama-3-8b'); d.is_dir() or write_preset('llama-3-8b', d)" ;;&
    mixed-none) timeout 240 python3 benchmarks/mixed_step_profile.py $WORK/models/llama-3-8b "$OUT/r/$tag.json" \
        --decoding 200 --context 800 --new 900 ;;
    mixed-fp8) timeout 240 python3 benchmarks/mixed_step_profile.py $WORK/models/llama-3-8b "$OUT/r/$tag.json" \
        --decoding 200 --context 800 --new 900 --quantization fp8 --kv-cache-dtype fp8 ${XM:+--xqa-mixed} ;;
    steps8-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --output-len 256 --num-decode-steps 8 \
        --attention-backend "${stage#steps8-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    nofused8-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --no-linear-prologue \
        --output-len 256 --num-decode-steps 8 --attention-backend "${stage#nofused8-}" $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json" ;;
    tput8-*) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --num-decode-steps 8 \
        --attention-backend "${stage#tput8-}" --json "$OUT/r/$tag.json" ;;
    gpu-steps) timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -p no:hypothesispytest tests/gpu \
        -k "queued_decode_steps or graphs_match" 2>&1 | grep -v "DEBUG" | tail -15 ;;
    sync1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --output-len 256 --no-async-scheduling \
        --attention-backend "${stage#sync1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    fp8lat-*) bench latency --preset llama-3-8b --batch-sizes 1,8,32,128 --input-len 128 --output-len 256 \
        --kv-cache-dtype fp8 --attention-backend "${stage#fp8lat-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    synctput-*) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --no-async-scheduling \
        --attention-backend "${stage#synctput-}" --json "$OUT/r/$tag.json" ;;
    fp8tput-*) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --kv-cache-dtype fp8 \
        --attention-backend "${stage#fp8tput-}" --json "$OUT/r/$tag.json" ;;
    gpu-async) timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu/test_cuda_graphs.py tests/gpu/test_attention_backends.py -k "not bf16" 2>&1 | grep -v "DEBUG" | tail -15 ;;
    noskinny1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --no-skinny-linear \
        --output-len 256 --attention-backend "${stage#noskinny1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    skinny) timeout 120 python3 -m pytest -q -rs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_skinny_matmul.py tests/kernels/test_rms_norm.py tests/kernels/test_silu_and_mul.py \
        tests/passes/test_skinny_linear.py tests/passes/test_linear_prologue.py tests/passes/test_linear_epilogue.py \
        tests/passes/test_row_sumsq.py 2>&1 | tail -8 ;;
    epi-tests) timeout 300 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_skinny_matmul.py tests/kernels/test_silu_and_mul.py tests/passes/test_linear_epilogue.py \
        tests/gpu/test_attention_backends.py -k "act_mul or interleaved or epilogue" 2>&1 | tail -12 ;;
    xqa-tests) timeout 400 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_xqa_decode.py tests/gpu/test_attention_backends.py -k "xqa" 2>&1 \
        | tee "$OUT/r/$tag-full.log" | grep -v DEBUG | tail -20 ;;
    snp-tests) timeout 300 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_skinny_matmul.py tests/kernels/test_moe_router.py tests/gpu/test_moe_one_row_passes.py -k "norm or rows_with or router" 2>&1 \
        | tee "$OUT/r/$tag-full.log" | grep -v DEBUG | tail -40 ;;
    sumsq-tests) timeout 300 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_skinny_matmul.py tests/gpu/test_attention_backends.py -k "sumsq or act_prologue" 2>&1 \
        | grep -E "agreement|passed|failed|FAIL|Error" | tail -12 ;;
    full-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu/test_mixed_graphs.py tests/runtime/test_mixed_graphs.py tests/gpu/test_cuda_graphs.py 2>&1 \
        | grep -v "DEBUG" | tail -30 ;;
    full-tests-*) timeout 200 python3 -m pytest -x -q --tb=short -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu/test_mixed_graphs.py -k "${stage#full-tests-}" 2>&1 | grep -v "DEBUG" | tail -80 ;;
    full1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --output-len 256 --cudagraph-mode FULL \
        --attention-backend "${stage#full1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    fulltput-*) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --cudagraph-mode FULL \
        --attention-backend "${stage#fulltput-}" --json "$OUT/r/$tag.json" ;;
    pdl1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --enable-pdl \
        --output-len 256 --attention-backend "${stage#pdl1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    pdl-tests) timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu/test_programmatic_launch.py tests/gpu/test_attention_backends.py tests/gpu/test_quantized.py \
        -k "programmatic" ;;
    pdlq-*) bench latency --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 $LIMITS --work $WORK \
        --quantization "${stage#pdlq-}" --enable-pdl --json "$OUT/r/$tag.json" ;;
    pdlfam-*) bench latency --preset "${stage#pdlfam-}" --batch-sizes 1,8 --input-len 128 --output-len 256 --enable-pdl \
        $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    rope1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --no-fuse-rope-attention \
        --output-len 256 --attention-backend "${stage#rope1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    kernels) for f in tests/kernels/test_rope_store_kv.py tests/kernels/test_triton_backend.py tests/passes/test_fuse_rope_attention.py \
        tests/runtime/test_sampler.py; do timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -p no:hypothesispytest "$f" 2>&1 \
        | grep -v "^\.*$" | tail -6; echo "-- $f: exit ${PIPESTATUS[0]}"; done ;;
    attn-tests) timeout 560 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_paged_decode_attention.py tests/kernels/test_paged_prefill_attention.py \
        tests/kernels/test_rope_decode.py 2>&1 | grep -v "^\.*$" | tail -20 ;;
    prefill-tests) timeout 450 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_paged_prefill_attention.py tests/kernels/test_paged_verify_attention.py 2>&1 \
        | grep -v "^\.*$" | tail -20 ;;
    rope-teacher) timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider \
        -p no:hypothesispytest tests/gpu -k teacher --no-fuse-rope-attention ;;
    ab-throughput-*) (cd .ab && PYTHONPATH="/tmp/site:$PWD" python3 -m graphllm.cli bench throughput --preset llama-3-8b \
        --num-requests 1024 $LIMITS --work $WORK --attention-backend "${stage#ab-throughput-}" --json "$OUT/r/$tag.json") ;;
    ab-qtput-fp8kv) (cd .ab && PYTHONPATH="/tmp/site:$PWD" python3 -m graphllm.cli bench throughput --preset llama-3-8b \
        --num-requests 1024 $LIMITS --work $WORK --quantization fp8 --kv-cache-dtype fp8 --json "$OUT/r/$tag.json") ;;
    ab-qlat-*) S=${stage#ab-qlat-}; (cd .ab && PYTHONPATH="/tmp/site:$PWD" python3 -m graphllm.cli bench latency \
        --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 $LIMITS --work $WORK $BENCH_EXTRA \
        $( [ "${S%-lmhead}" != none ] && echo --quantization "${S%-lmhead}" ) \
        $( [ "${S%-lmhead}" != "$S" ] && echo --quantize-lm-head ) --json "$OUT/r/$tag.json") ;;
    ab-latency1-*) (cd .ab && PYTHONPATH="/tmp/site:$PWD" python3 -m graphllm.cli bench latency --preset llama-3-8b \
        --batch-sizes 1,8 --input-len 128 --output-len 256 --attention-backend "${stage#ab-latency1-}" $LIMITS \
        --work $WORK --json "$OUT/r/$tag.json") ;;
    fusion-tests) timeout 400 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_rope_decode.py tests/kernels/test_paged_decode_attention.py \
        tests/kernels/test_triton_backend.py::test_decode_rope_fusion_over_splits_gives_the_reference_tokens \
        "tests/gpu/test_attention_backends.py::test_bf16_graphs_with_rope_in_the_decode_kernel_give_the_same_rows" \
        2>&1 | grep -v "^\.*$" | tail -30 ;;
    unfused1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --output-len 256 \
        --no-fuse-rope-decode --attention-backend "${stage#unfused1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    latency1-*) bench latency --preset llama-3-8b --batch-sizes 1,8 --input-len 128 --output-len 256 \
        --attention-backend "${stage#latency1-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    # the whole GPU suite (1,090 tests) ran past 540 s (2026-12-06, H100: 629 done), most of it Triton compiling
    # (the prefill attention tests 4-14 s each, cold): tests/kernels runs in TESTS_WORKERS processes (pytest-xdist,
    # from .whl: ../shared/device/wheels.sh pytest-xdist==3.8.0 execnet==2.1.2), tests/gpu after it in one (its
    # engines size their KV caches from the free memory). SIGINT at the limit: pytest still prints the failures so far
    # (test_triton_backend builds engines, which size their KV caches from the free memory: in 8 processes 15 of
    # them and the largest prefill case ran out of memory, 2026-12-06; they run with tests/gpu, one at a time)
    tests|tests-kernels|tests-gpu|tests-engines) pytest_q="python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest"
        workers=""; python3 -c "import xdist" 2>/dev/null && workers="-n ${TESTS_WORKERS:-8}"
        serial="tests/kernels/test_triton_backend.py tests/kernels/test_paged_prefill_attention.py::test_prefill_matches_reference_large"
        case $stage in tests|tests-kernels) timeout -s INT ${TESTS_LIMIT:-540} $pytest_q $workers \
          --junitxml="$OUT/r/$tag-kernels.xml" tests/kernels --ignore tests/kernels/test_triton_backend.py \
          --deselect tests/kernels/test_paged_prefill_attention.py::test_prefill_matches_reference_large 2>&1 | grep -v "^\.*$" ;; esac
        case $stage in tests|tests-gpu|tests-engines) [ $stage = tests-engines ] || serial="$serial tests/gpu"
          timeout -s INT ${TESTS_LIMIT:-540} $pytest_q --junitxml="$OUT/r/$tag-gpu.xml" $serial -s 2>&1 \
          | grep -v "^\.*$" ;; esac ;;
    tests-gpu-x) timeout -s INT ${TESTS_LIMIT:-540} python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        -n ${TESTS_WORKERS:-6} --junitxml="$OUT/r/$tag.xml" tests/gpu ${TESTS_K:+-k "$TESTS_K"} 2>&1 | grep -v "^\.*$" ;;
    moe-shapes) timeout -s INT 200 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_fused_moe.py -k "model_shapes" 2>&1 | tail -60 ;;
    teacher) timeout 300 python3 -m pytest -q -rfs -s -p no:cacheprovider -p no:hypothesispytest tests/gpu -k teacher 2>&1 \
        | grep -v "^DEBUG" ;;
    f32-*) CUDA_LAUNCH_BLOCKING=1 timeout 200 python3 -m pytest -x -q -rs -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu -k "float32 and ${stage#f32-}" 2>&1 | grep -v "Assertion .ind" ;;
    throughput-*) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK \
        --attention-backend "${stage#throughput-}" --json "$OUT/r/$tag.json" ;;
    latency-*) bench latency --preset llama-3-8b --batch-sizes 1,8,32,128,256 --input-len 128 --output-len 256 \
        --attention-backend "${stage#latency-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" --plot "$OUT/r/$tag.png" ;;
    profile256-*) bench latency --preset llama-3-8b --batch-sizes 256 --input-len 512 --output-len 64 \
        --attention-backend "${stage#profile256-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    qprof256-fp8kv) bench latency --preset llama-3-8b --batch-sizes 256 --input-len 512 --output-len 64 $LIMITS \
        --quantization fp8 --kv-cache-dtype fp8 --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" \
        --profile-steps 3 ;;
    profile8-*) bench latency --preset llama-3-8b --batch-sizes 8 --input-len 128 --output-len 64 \
        --attention-backend "${stage#profile8-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    profile-*) bench latency --preset llama-3-8b --batch-sizes 1 --input-len 128 --output-len 64 \
        --attention-backend "${stage#profile-}" $LIMITS --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    throughput) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK \
        --compare transformers --compare-num-requests 128 --json "$OUT/r/throughput.json" --plot "$OUT/r/throughput.png" ;;
    soak-start) python3 -c "import sys; from pathlib import Path; from graphllm.bench.presets import write_preset
d = Path('$WORK/models/llama-3-8b'); d.is_dir() or write_preset('llama-3-8b', d)"
        rm -f /tmp/soak-server.exit /tmp/soak-server.pid; setsid nohup bash -c "python3 -m graphllm.cli serve --model $WORK/models/llama-3-8b \
          $LIMITS --port 8123 --max-queued-requests 4096 & echo \$! > /tmp/soak-server.pid; wait \$!; \
          echo \$? > /tmp/soak-server.exit" > /tmp/soak-server.log 2>&1 < /dev/null &
        for i in $(seq 50); do [ -s /tmp/soak-server.pid ] && break; sleep 0.2; done
        for i in $(seq 600); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
        echo "server pid $(cat /tmp/soak-server.pid), up after ${i} s"; tail -3 /tmp/soak-server.log ;;
    soak-stop) kill -TERM "$(cat /tmp/soak-server.pid)"; for i in $(seq 90); do [ -s /tmp/soak-server.exit ] && break; \
          sleep 1; done; echo "server stopped after ${i} s, exit code $(cat /tmp/soak-server.exit)"; \
          echo "log lines with Traceback/ERROR: $(grep -c -E 'Traceback|ERROR' /tmp/soak-server.log)"; \
          cp /tmp/soak-server.log "$OUT/r/" ;;
    soak-*) python3 benchmarks/soak.py --base-url http://127.0.0.1:8123/v1 --clients 256 --duration "${stage#soak-}" \
          --max-tokens 128 --chat-rate 0 --token-prompts 1 --server-pid "$(cat /tmp/soak-server.pid)" --json "$OUT/r/$tag.json" ;;
    qsweep) timeout 400 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/qsweep.json" ;;
    qsweep-int4) timeout 420 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/qsweep-int4.json" 240 int4 1 \
        && python3 benchmarks/apply_sweep_configs.py "$OUT/r/qsweep-int4.json" int4 \
        && cp graphllm/kernels/int4_matmul.py "$OUT/r/int4_matmul.applied.py" ;;
    startup) bench compile --preset llama-3-8b --max-num-seqs 256 --no-decode --work $WORK/startup \
        --json "$OUT/r/$tag.json"; rm -rf $WORK/startup ;;
    startup-q-*) bench compile --preset llama-3-8b --max-num-seqs 256 --no-decode --work $WORK/startup \
        --quantization "${stage#startup-q-}" --json "$OUT/r/$tag.json"; rm -rf $WORK/startup ;;
    startup-full) bench compile --preset llama-3-8b --max-num-seqs 256 --no-decode --work $WORK/startup \
        --cudagraph-mode FULL --json "$OUT/r/$tag.json"; rm -rf $WORK/startup ;;
    ab-moe-lat) (cd .ab && PYTHONPATH="/tmp/site:$PWD" python3 -m graphllm.cli bench latency --preset qwen3-30b-a3b \
        --preset-layers 12 --batch-sizes 1,8,32 --input-len 128 --output-len 256 $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json") ;;
    norm-tests) timeout 400 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_rope_decode.py "tests/gpu/test_attention_backends.py::test_float32_graphs_match_transformers" \
        tests/gpu/test_cuda_graphs.py -k "qwen3 or gemma3 or rope_decode or head_norms or fused" 2>&1 | grep -v "^\.*$" | tail -30 ;;
    fastacc-tests) timeout 240 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_fp8_matmul.py tests/gpu/test_quantized.py -k "fp8" 2>&1 \
        | grep -E "FAILED|ERROR|Error|agreement|passed|failed|^E " | tail -30 ;;
    fp8gemm) timeout 300 python3 benchmarks/fp8_gemm_large_m.py "$OUT/r/$tag.json" ;;
    moe-lat) bench latency --preset qwen3-30b-a3b --preset-layers 12 --batch-sizes 1,8,32 --input-len 128 \
        --output-len 256 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    moe-lat-pdl) bench latency --preset qwen3-30b-a3b --preset-layers 12 --batch-sizes 1,8,32 --input-len 128 \
        --output-len 256 --enable-pdl $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    moe-lat-fp8) bench latency --preset qwen3-30b-a3b --preset-layers 12 --batch-sizes 1,8,32 --input-len 128 \
        --output-len 256 --quantization fp8 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    moe-prof1) bench latency --preset qwen3-30b-a3b --preset-layers 12 --batch-sizes 1 --input-len 128 --output-len 64 \
        $LIMITS --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    moe-prof) bench latency --preset qwen3-30b-a3b --preset-layers 12 --batch-sizes 32 --input-len 128 --output-len 64 \
        $LIMITS --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    moe-tput) bench throughput --preset qwen3-30b-a3b --preset-layers 12 --num-requests 1024 $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json" ;;
    startup-prof) python3 -c "from pathlib import Path; from graphllm.bench.presets import write_preset
d = Path('$WORK/models/llama-3-8b'); d.is_dir() or write_preset('llama-3-8b', d)" && \
        TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-prof timeout 400 python3 benchmarks/startup_profile.py \
        $WORK/models/llama-3-8b /tmp/startup-prof "$OUT/r/$tag.json" 30 ;;
    fam-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/gpu/test_cuda_graphs.py tests/kernels/test_paged_decode_attention.py tests/kernels/test_paged_prefill_attention.py \
        tests/kernels/test_mla_attention.py tests/models/test_deepseek_v2.py tests/models/test_phi3_longrope.py \
        -k "gemma or olmo2 or phi3 or softcap or soft_cap or mla or deepseek or longrope" ;;
    clean) rm -rf $WORK/models $WORK/startup "$GRAPHLLM_CACHE_DIR"; df -h /tmp | tail -1 ;;
    moe-bench) timeout 200 python3 benchmarks/moe_kernel_bench.py "$OUT/r/$tag.json" ;;
    moe-kernel-tests) timeout 400 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_fused_moe.py tests/kernels/test_moe_routing.py tests/kernels/test_moe_router.py 2>&1 \
        | grep -v DEBUG | tail -12 ;;
    moe-router) timeout 150 python3 benchmarks/moe_router_bench.py "$OUT/r/$tag.json" ;;
    ab-moe-router) PYTHONPATH="/tmp/site:$PWD/.ab" timeout 150 python3 benchmarks/moe_router_bench.py "$OUT/r/$tag.json" ;;
    moe-bench1) timeout 200 python3 benchmarks/moe_kernel_bench.py "$OUT/r/$tag.json" 1,8 qwen3 ;;
    moe-bench1-pdl) timeout 200 python3 benchmarks/moe_kernel_bench.py "$OUT/r/$tag.json" 1 qwen3 pdl ;;
    spec-bench) bench spec --preset llama-3-8b --batch-sizes 1,8,32 --num-speculative-tokens 1,2,4,8 \
        --acceptance-rates 1.0,0.6 --input-len 128 --output-len 128 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    spec-ngram) bench spec --method ngram --batch-sizes 1,8,32 --num-speculative-tokens 2,4 --output-len 64 \
        --work $WORK --json "$OUT/r/$tag.json" ;;
    spec-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/runtime/test_spec_decode.py tests/runtime/test_spec_decode_parts.py tests/bench/test_spec_bench.py \
        tests/runtime/test_spec_decode_structured.py tests/gpu/test_cuda_graphs.py -k "spec or verify or structured" ;;
    moe-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_fused_moe.py tests/kernels/test_moe_*.py tests/ops/test_moe.py tests/gpu/test_cuda_graphs.py \
        tests/passes/test_quantize_fp8_experts.py tests/models/test_moe.py -k "moe or mixtral or fp8" ;;
    qsweep-int4-16) timeout 420 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/$tag.json" 270 int4 16 \
        && python3 benchmarks/apply_sweep_configs.py "$OUT/r/$tag.json" int4 \
        && cp graphllm/kernels/int4_matmul.py "$OUT/r/int4_matmul.applied.py" ;;
    qsweep-pairs) timeout 400 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/qsweep-pairs.json" 240 int4 1,4,16 \
        && python3 benchmarks/apply_sweep_configs.py "$OUT/r/qsweep-pairs.json" int4 \
        && cp graphllm/kernels/int4_matmul.py "$OUT/r/int4_matmul.applied.py" ;;
    ncu-quant) N=$(python3 benchmarks/ncu_quant.py count); timeout 300 ncu \
        --clock-control none --csv -k "regex:_int4|_fp8_matmul" --launch-skip "$N" --launch-count "$N" \
        --metrics "$(python3 benchmarks/ncu_quant.py metrics)" python3 benchmarks/ncu_quant.py launch \
        > "$OUT/r/ncu-quant.csv" 2> "$OUT/r/ncu-quant.err"; tail -5 "$OUT/r/ncu-quant.err"
        python3 benchmarks/ncu_quant.py table "$OUT/r/ncu-quant.csv" | tee "$OUT/r/ncu-quant.txt" ;;
    ncu-attention) N=$(python3 benchmarks/ncu_attention.py count); timeout 300 ncu \
        --clock-control none --csv -k "regex:_decode_split_kernel" --launch-skip "$N" --launch-count "$N" \
        --metrics "$(python3 benchmarks/ncu_attention.py metrics)" python3 benchmarks/ncu_attention.py launch \
        > "$OUT/r/ncu-attention.csv" 2> "$OUT/r/ncu-attention.err"; tail -5 "$OUT/r/ncu-attention.err"
        python3 benchmarks/ncu_attention.py table "$OUT/r/ncu-attention.csv" | tee "$OUT/r/ncu-attention.txt" ;;
    qtests-mma) timeout 300 python3 -m pytest -q -rfE -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_int4_mma.py tests/gpu/test_quantized.py::test_int4_mma_keeps_the_agreement 2>&1 \
        | grep -E "FAILED|ERROR|Error|agreement|passed|failed|^E " | tail -40 ;;
    qtests-int4) timeout 400 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_int4_matmul.py tests/passes/test_quantize_int4.py \
        "tests/gpu/test_quantized.py::test_quantized_teacher_forced_agreement[int4]" tests/gpu/test_quantized.py::test_int4_folds_keep_the_agreement 2>&1 \
        | grep -E "FAILED|ERROR|Error|agreement|passed|failed|^E " | tail -40 ;;
    qtests-gemv) timeout 300 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_int4_matmul.py -k "f16 or llama_8b or tile_paths or groups_of_any or epilogue or add_norm or rstd or agreement" \
        "tests/gpu/test_quantized.py::test_quantized_teacher_forced_agreement[int4]" tests/gpu/test_quantized.py::test_int4_folds_keep_the_agreement 2>&1 \
        | grep -E "FAILED|ERROR|Error|agreement|passed|failed|^E " | tail -40 ;;
    qsweep-fp8q1) timeout 240 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/$tag.json" 150 fp8q 1 \
        && python3 benchmarks/apply_sweep_configs.py "$OUT/r/$tag.json" fp8q \
        && cp graphllm/kernels/fp8_matmul.py "$OUT/r/fp8_matmul.applied.py" ;;
    qsweep-fp8q) timeout 330 python3 benchmarks/quant_kernel_sweep.py "$OUT/r/qsweep-fp8q.json" 240 fp8q 1,2,4,8,16 ;;
    qtests) timeout 400 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest tests/kernels/test_fp8_matmul.py \
        tests/kernels/test_int4_matmul.py tests/kernels/test_int8_matmul.py tests/kernels/test_int4_dequant.py \
        tests/ops/test_quantized_linear.py tests/passes/test_quantize_fp8.py tests/passes/test_quantize_int4.py \
        tests/passes/test_quantize_int8.py tests/passes/test_quantized_fusion.py tests/passes/test_quantize_fp8_activations.py tests/kernels/test_silu_and_mul_fp8.py tests/gpu/test_quantized.py 2>&1 \
        | grep -v -E "^\.*$|DEBUG|^\s*$" | grep -E "FAILED|ERROR|Error|agreement|passed|failed|SKIPPED|^E " | tail -60 ;;
    qtests-fp8) timeout 300 python3 -m pytest -q -rfEs -s -p no:cacheprovider -p no:hypothesispytest \
        tests/kernels/test_fp8_matmul.py tests/kernels/test_fp8_prologue.py tests/kernels/test_silu_and_mul_fp8.py \
        tests/passes/test_quantize_fp8_activations.py tests/gpu/test_quantized.py 2>&1 | grep -E "FAILED|ERROR|Error|agreement|rows|passed|failed|^E " | tail -40 ;;
    qlat-none) bench latency --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json" ;;
    qprof-*) bench latency --preset llama-3-8b --batch-sizes 1 --input-len 128 --output-len 64 $LIMITS --work $WORK \
        --quantization "${stage#qprof-}" --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 \
        && python3 benchmarks/trace_by_shape.py "$OUT/r/$tag/trace.json" | tee "$OUT/r/$tag-by-shape.md" | head -24 ;;
    qlat-fp8-prologue) bench latency --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 $LIMITS \
        --work $WORK --quantization fp8 --fp8-linear-prologue --json "$OUT/r/$tag.json" ;;
    qlat-*-lmhead) S=${stage#qlat-}; bench latency --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 \
        $LIMITS --work $WORK --quantization "${S%-lmhead}" --quantize-lm-head --json "$OUT/r/$tag.json" ;;
    qlat-*) bench latency --preset llama-3-8b --batch-sizes 1,16 --input-len 128 --output-len 256 $LIMITS --work $WORK \
        --quantization "${stage#qlat-}" --json "$OUT/r/$tag.json" ;;
    qtput-fp8kv) bench throughput --preset llama-3-8b --num-requests 1024 $qlimits --work $WORK --quantization fp8 \
        --kv-cache-dtype fp8 --json "$OUT/r/$tag.json" ;;
    qtput-none) bench throughput --preset llama-3-8b --num-requests 1024 $qlimits --work $WORK --json "$OUT/r/$tag.json" ;;
    qtput-*) bench throughput --preset llama-3-8b --num-requests 1024 $qlimits --work $WORK \
        --quantization "${stage#qtput-}" --json "$OUT/r/$tag.json" ;;
    pc-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/runtime/test_prefix_caching.py ;;
    famnp-*) bench latency --preset "${stage#famnp-}" --batch-sizes 1,8 --input-len 128 --output-len 256 \
        --no-linear-prologue $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    fam12-*) bench latency --preset "${stage#fam12-}" --preset-layers 12 --batch-sizes 1,8 --input-len 128 \
        --output-len 256 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    spec-prof) bench spec --preset llama-3-8b --batch-sizes 1 --num-speculative-tokens 4 --acceptance-rates 1.0 \
        --input-len 128 --output-len 128 $LIMITS --work $WORK --profile "$OUT/r/spec-prof" --profile-steps 6 \
        --json "$OUT/r/$tag.json" ;;
    spec-vk) timeout 240 python3 -c "import sys; from graphllm.backends.triton_backend import TritonBackend
TritonBackend.verify_kernel = True  # switched off by default since the fifteenth session: this stage tries it
from graphllm.cli.main import main; sys.exit(main(sys.argv[1:]))" bench spec --preset llama-3-8b --batch-sizes 1,8 \
        --num-speculative-tokens 4 --acceptance-rates 1.0 --input-len 128 --output-len 64 $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json" ;;
    spec-long) bench spec --preset llama-3-8b --batch-sizes 1,8 --num-speculative-tokens 4 --acceptance-rates 1.0,0.6 \
        --input-len 1900 --output-len 128 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    famprof-*) bench latency --preset "${stage#famprof-}" --batch-sizes 1 --input-len 128 --output-len 64 $LIMITS \
        --work $WORK --json "$OUT/r/$tag.json" --profile "$OUT/r/$tag" --profile-steps 3 ;;
    fam-*) bench latency --preset "${stage#fam-}" --batch-sizes 1,8 --input-len 128 --output-len 256 $LIMITS --work $WORK \
        --json "$OUT/r/$tag.json" ;;
    so-tests) timeout 300 python3 -m pytest -q -rfEs -p no:cacheprovider -p no:hypothesispytest \
        tests/runtime/test_structured_output.py tests/server/test_structured_output.py tests/server/test_tool_calls.py ;;
    so-tput-0) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --json "$OUT/r/$tag.json" ;;
    so-tput-half) bench throughput --preset llama-3-8b --num-requests 1024 $LIMITS --work $WORK --structured-fraction 0.5 \
        --json "$OUT/r/$tag.json" ;;
    pc-shared-*) bench throughput --preset llama-3-8b --workload shared-prefix --num-requests 1024 --num-prefixes 8 \
        --prefix-len 2048 --suffix-len 128 --output-len 128 $PCLIMITS --work $WORK --json "$OUT/r/$tag.json" \
        $( [ "${stage##*-}" = off ] && echo --no-enable-prefix-caching ) ;;
    pc-random-*) bench throughput --preset llama-3-8b --num-requests 1024 $PCLIMITS --work $WORK --json "$OUT/r/$tag.json" \
        $( [ "${stage##*-}" = off ] && echo --no-enable-prefix-caching ) ;;
    qagree) timeout 400 python3 benchmarks/quant_agreement.py "$GRAPHLLM_CACHE_DIR" $WORK/models/llama-3-8b "$OUT/r/qagree.json" ;;
    *) echo "unknown stage $stage" ;;
  esac 2>&1 | tee "$OUT/r/$tag.log" | grep -v "^\s*$" | tail -40
  echo "== stage $tag: exit ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s"
done
find "$OUT/r" -name trace.json.gz -delete; find "$OUT/r" -name trace.json -exec gzip -q {} \;
tar -C "$OUT" -czf "$OUT/results.tgz" r && rm -rf "$OUT/r"
