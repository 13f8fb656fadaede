#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Triton decode kernels (RuntimeConfig.attention_kernel, runtime/kernels/) checked and measured on one GPU in
# one call (~5-6 min on an H100; logs and JSON under $OUT):
#   1. pytest -m gpu: the kernels against the torch path and float64 at SmolLM2 / Qwen3-8B shapes in bf16, CUDA-graph
#      replay, a tiny pair's tokens (tests/gpu/test_decode_attention_cuda.py), and the real SmolLM2 pair's greedy
#      DFlash == AR with the kernels (tests/gpu/test_smollm2_cuda.py -k triton) when its converted copy is in
#      $TRTLLM_DFLASH_CACHE (bash benchmarks/gpu_smollm2.sh prep)                -> gpu_tests_kernels.json
#   2. benchmarks/step_bench.py --profile at batch 1 for smollm2-135m, qwen3-8b and llama-3.1-8b, with
#      attention_kernel torch, then triton (step times, kernels per step and per layer) -> step_bench_{torch,triton}.json
# SMOKE=1 runs the same on this machine's CPU: the kernels in Triton's interpreter (tests/runtime/test_decode_attention.py;
# the gpu tests are collected and skip) and step_bench --smoke (tiny layers). Exit status: non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kernels_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
  TRTLLM_DFLASH_CACHE=${TRTLLM_DFLASH_CACHE:-$PWD/.carry/cache}
MODELS=${MODELS:-smollm2-135m,qwen3-8b,llama-3.1-8b}
GPU_TESTS=(tests/gpu/test_decode_attention_cuda.py)
if [ -n "${SMOKE:-}" ]; then
  export TRITON_INTERPRET=1   # before anything imports the kernels
  BENCH=(--smoke --ctx 16 --steps 2)
else
  BENCH=(--ctx 512 --steps 15)
fi
if [ -f "$TRTLLM_DFLASH_CACHE/smollm2-135m-instruct/.complete" ]; then
  GPU_TESTS+=("tests/gpu/test_smollm2_cuda.py::test_greedy_dflash_equals_ar_in_float32[triton]"
              "tests/gpu/test_smollm2_cuda.py::test_greedy_dflash_vs_ar_in_bf16_within_the_tolerance_policy[triton]")
else
  echo "note: no converted SmolLM2 under $TRTLLM_DFLASH_CACHE: tests/gpu/test_smollm2_cuda.py not run"
fi
rc=0
t0=$(date +%s)
if [ -n "${SMOKE:-}" ]; then
  "$PY" -m pytest -q -p no:cacheprovider tests/runtime/test_decode_attention.py 2>&1 | tail -3 | tee "$OUT/cpu_tests_kernels.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
"$PY" benchmarks/gpu_test_report.py "${GPU_TESTS[@]}" --out "$OUT/gpu_tests_kernels.json" > "$OUT/gpu_tests_kernels.log" 2>&1 || rc=1
tail -5 "$OUT/gpu_tests_kernels.log"
echo "tests: $(( $(date +%s) - t0 )) s"
for kernel in torch triton; do
  t0=$(date +%s)
  "$PY" benchmarks/step_bench.py --models "$MODELS" --batch 1 --profile --attention_kernel "$kernel" "${BENCH[@]}" \
    --out "$OUT/step_bench_$kernel.json" > "$OUT/step_bench_$kernel.log" 2>&1 || { rc=1; tail -20 "$OUT/step_bench_$kernel.log"; }
  grep -E "^(smollm2|qwen3|llama)|^kernels per layer|^profile" "$OUT/step_bench_$kernel.log" | cut -c1-200
  echo "step_bench $kernel: $(( $(date +%s) - t0 )) s"
done
exit $rc
