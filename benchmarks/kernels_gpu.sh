#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The decode-path Triton kernels (RuntimeConfig.attention_kernel "auto"/"triton": attention, GEMMs, sampling,
# gpt-oss attention/router, MXFP4 experts) checked and measured on one GPU, one or more stages per run (each < 10
# min on an H100; logs and JSON under $OUT):
#   tests_a    pytest -m gpu: attention, GEMM and sampling kernels vs torch and float64 in bf16 at real shapes,
#              graph replay, tiny pairs' tokens                                          -> gpu_tests_kernels_a.json
#   tests_b    pytest -m gpu: gpt-oss attention (sinks, window), router, norms, MXFP4 expert variants at
#              gpt-oss-20b/120b shapes                                                    -> gpu_tests_kernels_b.json
#   smollm2    the real SmolLM2 pair (converted by `bash benchmarks/gpu_smollm2.sh prep` into $TRTLLM_DFLASH_CACHE;
#              on a host without network from OFFLINE_DIR, see scripts/offline_host.sh):
#              greedy DFlash == AR in float32 with the kernels, bf16 under the divergence policy on the torch path
#                                                                                         -> gpu_tests_smollm2.json
#   bitexact   the batch-invariant mode (RuntimeConfig.batch_invariant: off by default, on in every run here), ~25 min in 4 runs of one
#              sub-stage each (BITEXACT=tests|check|step_on|step_off, then summary with no GPU work):
#              tests     kernel invariance in bf16 with rows anywhere (tests/gpu/test_batch_invariance_cuda.py)
#                        and SmolLM2 bf16 DFlash == AR exactly: blocks 16/8/4, adaptive, seeded T=1, alone ==
#                        among 8 (tests/gpu/test_smollm2_cuda.py)                       -> gpu_tests_bit_exact.json (~6 min)
#              check     trtllm_dflash/bench/cuda_check.py --smollm2: tiny Llama/Qwen3 6/6 in bf16, SmolLM2 8/8 at blocks
#                        16/8/4, alone == batched                                       -> cuda_check_bit_exact.json (~6 min)
#              step_on / step_off  step_bench.py smollm2-135m + qwen3-8b, batch 1 and 64, AR and DFlash, mode on /
#                        off (the same warm GPU for both)          -> step_bench_bi_on.json / step_bench_bi_off.json (~5 min each)
#              summary   trtllm_dflash/bench/bit_exact_summary.py (+ $SOAK_JSON from `gpu_smollm2.sh soak` if set)
#                                                                                         -> bit_exact_h100.json
#   step       trtllm_dflash/bench/step.py --profile at batch $BATCH (default 1): smollm2-135m, qwen3-8b, llama-3.1-8b with the
#              kernels, and llama-3.1-8b with the torch path (the earlier files hold the others' torch rows)
#                                                                     -> step_bench_triton.json, step_bench_torch.json
#   gptoss     trtllm_dflash/bench/gpt_oss_step.py at batch 1 (AR and DFlash), kernels on: gpt-oss-20b (block 8), then
#              gpt-oss-120b (block 10) when the GPU holds its 68 GB of weights  -> gpt_oss_{20b,120b}_step.json
# TEST_MAX_S (default 300) stops a test stage's pytest and reports the tests that finished.
# SMOKE=1 runs each stage's CPU twin (kernels in Triton's interpreter, tiny shapes). Exit status: non-zero if any
# part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kernels_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
  TRTLLM_DFLASH_CACHE=${TRTLLM_DFLASH_CACHE:-$PWD/work/cache}
[ -n "${SMOKE:-}" ] && export TRITON_INTERPRET=1   # before anything imports the kernels
rc=0
run() {   # name, command...: output to $OUT/<name>.log, its tail and time here
  local name=$1 t0
  shift
  t0=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1 || { rc=1; echo "FAILED: $name"; }
  grep -vE "^DEBUG|^\s*$" "$OUT/$name.log" | tail -${TAIL:-6} | cut -c1-220
  echo "$name: $(( $(date +%s) - t0 )) s"
}
report() {   # out.json, "CPU twins", GPU tests...: the GPU tests on CUDA; under SMOKE the CPU twins instead
  local out=$1 twins=$2
  shift 2
  if [ -n "${SMOKE:-}" ]; then [ -z "$twins" ] || "$PY" -m pytest -q -p no:cacheprovider $twins
  else "$PY" -m trtllm_dflash.bench.gpu_test_report "$@" --out "$out" --max_s "${TEST_MAX_S:-300}"; fi
}
for stage in "$@"; do
  case $stage in
    tests_a)
      run tests_a report "$OUT/gpu_tests_kernels_a.json" \
        "tests/runtime/test_decode_attention.py tests/runtime/test_gemm_kernels.py tests/runtime/test_sample_kernels.py" \
        tests/gpu/test_decode_attention_cuda.py \
        tests/gpu/test_gemm_cuda.py tests/gpu/test_sample_cuda.py ;;
    tests_b)
      run tests_b report "$OUT/gpu_tests_kernels_b.json" \
        "tests/runtime/test_gpt_oss_kernels.py tests/runtime/test_mxfp4_moe.py" tests/gpu/test_gpt_oss_kernels_cuda.py \
        tests/runtime/test_mxfp4_moe.py::test_variants_at_gpt_oss_shapes \
        tests/runtime/test_mxfp4_moe.py::test_kernel_under_cuda_graph_replays_new_routing ;;
    smollm2)
      if [ -z "${SMOKE:-}" ] && [ ! -f "$TRTLLM_DFLASH_CACHE/smollm2-135m-instruct/.complete" ]; then
        echo "FAILED: smollm2: no converted SmolLM2 under $TRTLLM_DFLASH_CACHE (bash benchmarks/gpu_smollm2.sh prep)"; rc=1
      else
        run smollm2 report "$OUT/gpu_tests_smollm2.json" "" \
          "tests/gpu/test_smollm2_cuda.py::test_greedy_dflash_equals_ar_in_float32[triton]" \
          "tests/gpu/test_smollm2_cuda.py::test_greedy_dflash_vs_ar_in_bf16_within_the_tolerance_policy"
      fi ;;
    bitexact)
      if [ -n "${SMOKE:-}" ]; then BENCH=(--smoke --ctx 16 --steps 2 --batch 1,2); else BENCH=(--ctx 512 --steps 15 --batch 1,64); fi
      case ${BITEXACT:-tests} in
        tests) run bitexact_tests report "$OUT/gpu_tests_bit_exact.json" \
                 "tests/runtime/test_batch_invariance.py tests/runtime/test_bit_exact_engine.py" \
                 tests/gpu/test_batch_invariance_cuda.py tests/gpu/test_smollm2_cuda.py ;;
        check) if [ -n "${SMOKE:-}" ]; then CC=(--cpu_smoke); else CC=(--smollm2); fi
               CC+=(--batch_invariant on)   # the engines' default is off: this stage checks the mode
               run bitexact_check "$PY" -m trtllm_dflash.bench.cuda_check "${CC[@]}" --out "$OUT/cuda_check_bit_exact.json" ;;
        step_on|step_off)
               run "bitexact_$BITEXACT" "$PY" -m trtllm_dflash.bench.step --models "${MODELS:-smollm2-135m,qwen3-8b}" \
                 --attention_kernel triton --batch_invariant "${BITEXACT#step_}" "${BENCH[@]}" \
                 --out "$OUT/step_bench_bi_${BITEXACT#step_}.json" ;;
        summary) run bitexact_summary "$PY" -m trtllm_dflash.bench.bit_exact_summary --cuda_check "$OUT/cuda_check_bit_exact.json" \
                   --step_on "$OUT/step_bench_bi_on.json" --step_off "$OUT/step_bench_bi_off.json" \
                   ${SOAK_JSON:+--soak "$SOAK_JSON"} --out "$OUT/bit_exact_h100.json" ;;
        *) echo "FAILED: bitexact: BITEXACT=$BITEXACT (use tests, check, step_on, step_off or summary)"; rc=1 ;;
      esac ;;
    step)
      if [ -n "${SMOKE:-}" ]; then BENCH=(--smoke --ctx 16 --steps 2 --batch 1); else BENCH=(--ctx 512 --steps 15 --batch ${BATCH:-1}); fi
      run step_triton "$PY" -m trtllm_dflash.bench.step --models "${MODELS:-smollm2-135m,qwen3-8b,llama-3.1-8b}" --profile \
        --attention_kernel triton "${BENCH[@]}" --out "$OUT/step_bench_triton.json"
      [ -n "${SMOKE:-}" ] || run step_torch "$PY" -m trtllm_dflash.bench.step --models llama-3.1-8b --profile \
        --attention_kernel torch "${BENCH[@]}" --out "$OUT/step_bench_torch.json" ;;
    gptoss)
      if [ -n "${SMOKE:-}" ]; then
        run gptoss_smoke "$PY" -m trtllm_dflash.bench.gpt_oss_step --tiny --device cpu --batch_sizes 1 --blocks 10 --iters 2 \
          --out "$OUT/gpt_oss_smoke.json"
      else
        run gptoss20b "$PY" -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-20b --batch_sizes 1 --blocks 8 --iters 15 \
          --profile --out "$OUT/gpt_oss_20b_step.json"
        run gptoss120b "$PY" -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-120b --batch_sizes 1 --blocks 10 --iters 15 \
          --profile --out "$OUT/gpt_oss_120b_step.json"
      fi ;;
    *) echo "unknown stage $stage (tests_a, tests_b, smollm2, step, gptoss)" >&2; exit 2 ;;
  esac
done
exit $rc
