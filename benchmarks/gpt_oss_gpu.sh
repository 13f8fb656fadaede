#!/usr/bin/env bash
# gpt-oss with MXFP4 experts on the GPU host, one or more stages per run (logs under OUT, step JSON under RESULTS):
#   tests  (H100, ~2 min)  GPU tests of the MXFP4 kernels -> gpu_tests_mxfp4_<gpu>.json
#   mxfp4  (H100, ~2 min)  the expert variants (mma / swap / gemv) at real shapes: their GPU tests, then one MoE layer
#          timed per variant and tile config, 1..64 tokens, random and concentrated routing -> mxfp4_bench.json
#   probe  (H100 or H200, ~1 min) where the gemv experts' time goes: the gate_up kernel beside a load-only and a
#          load + decode twin on the same experts, and a plain copy of the bytes -> $RESULTS/mxfp4_probe_<gpu>.json
#   20b    (H100, ~4 min)  gpt-oss-20b steps at batch 1, 4, 16, 64 under uniform and skewed routing, MXFP4 kernels vs
#          bf16 dequantised in the same run, tile sweep, profile -> $RESULTS/gpt_oss_20b_step_<gpu>.json
#   120b   (H200 or H100, ~4 min) gpt-oss-120b steps, the same batches and routings with MXFP4 kernels (bf16 does not
#          fit: one MoE layer both ways), profile -> $RESULTS/gpt_oss_120b_step_<gpu>.json (h200, h100)
#   flashinfer (H100 or H200, ~3 min + FlashInfer's first-use compile) one MoE layer of gpt-oss-120b on our MXFP4
#          kernels and on flashinfer-python's fused MoE (needs it installed), both routings, every batch x block shape
#          -> $RESULTS/gpt_oss_120b_vs_flashinfer_<gpu>.json. On a host without network: the wheel set of
#          benchmarks/offline/flashinfer.txt (scripts/offline_host.sh wheels DIR flashinfer -r ..., install, env)
#   triton_kernels (H100 or H200, ~3 min) the same on the Triton MoE kernels vLLM runs gpt-oss on (triton_kernels,
#          importable: scripts/triton_kernels_wheel.sh DIR makes its wheel, offline_host.sh install / env DIR
#          triton_kernels put it on PYTHONPATH) -> $RESULTS/gpt_oss_120b_vs_triton_kernels_<gpu>.json
#   tp2    (2x H200, ~3 min) gpt-oss-120b TP 2 with EP 2 and EP 1 under mpirun (NCCL, CUDA graphs): tiny tokens == TP 1,
#          AR / DFlash (block 10) steps at batch 1 and 64, per-rank roofline, all-reduces per step, TP 1 reference
# SMOKE=1 runs the CPU paths instead (tiny shapes, no kernels). OUT: logs and test JSON (default /tmp/gpt_oss_gpu);
# RESULTS: the step JSON (default benchmarks/results, the files the README's tables and the goals read).
# Skewed routing: per-layer Zipf popularity ZIPF (default 1.0), per-slot reuse across block positions REUSE (0.5).
# EXPERTS=triton_kernels: the 20b / 120b / tp2 steps with RuntimeConfig.mxfp4_moe "triton_kernels" (our kernels at
# one token, the triton_kernels library from two: importable, sm90+; tp2 then at ep 1 only) -> ..._triton_kernels_*.json.
set -euo pipefail
OUT=${OUT:-/tmp/gpt_oss_gpu}
RESULTS=${RESULTS:-benchmarks/results}
mkdir -p "$OUT" "$RESULTS"
PY=${PYTHON:-python3}
# uniform: near the worst case for the experts a block touches; skewed: the parameters stated in the JSON
ROUTING=(--routing uniform,skewed --routing_zipf "${ZIPF:-1.0}" --routing_reuse "${REUSE:-0.5}")
EXPERTS_ARGS=() SUFFIX=""
if [ -n "${EXPERTS:-}" ]; then EXPERTS_ARGS=(--experts "$EXPERTS"); SUFFIX="_$EXPERTS"; fi
gpu_tag() {  # h100 / h200 / ..., from the first GPU's name ("NVIDIA H100 80GB HBM3" -> h100)
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  [ -n "$name" ] || { echo "gpt_oss_gpu.sh: nvidia-smi names no GPU; run on the GPU host or with SMOKE=1" >&2; return 1; }
  case $name in *H100*) echo h100 ;; *H200*) echo h200 ;; *) echo "$name" | tr 'A-Z ' 'a-z_' ;; esac
}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests 20b)
for stage in "${stages[@]}"; do
  case $stage in
    tests)
      if [ -n "${SMOKE:-}" ]; then $PY -m pytest -q -p no:cacheprovider tests/runtime/test_mxfp4_moe.py 2>&1 | tee "$OUT/tests.log"
      else $PY -m trtllm_dflash.bench.gpu_test_report tests/runtime/test_mxfp4_moe.py --out "$OUT/gpu_tests_mxfp4.json" 2>&1 | tee "$OUT/tests.log"; fi ;;
    probe)
      if [ -n "${SMOKE:-}" ]; then $PY -m trtllm_dflash.bench.mxfp4_probe --smoke --out "$OUT/mxfp4_probe_smoke.json"
      else $PY -m trtllm_dflash.bench.mxfp4_probe --out "$RESULTS/mxfp4_probe_$(gpu_tag).json" 2>&1 | tee "$OUT/probe.log"; fi ;;
    mxfp4)
      if [ -n "${SMOKE:-}" ]; then $PY -m trtllm_dflash.bench.mxfp4 --smoke --out "$OUT/mxfp4_bench_smoke.json"
      else rc=0  # the timings are wanted even when a test fails; the stage still fails afterwards
           $PY -m trtllm_dflash.bench.gpu_test_report tests/runtime/test_mxfp4_moe.py::test_variants_at_gpt_oss_shapes \
             tests/runtime/test_mxfp4_moe.py::test_kernel_under_cuda_graph_replays_new_routing \
             --out "$OUT/gpu_tests_mxfp4_variants.json" > "$OUT/mxfp4_tests.log" 2>&1 || rc=$?
           tail -40 "$OUT/mxfp4_tests.log"
           $PY -m trtllm_dflash.bench.mxfp4 --out "$OUT/mxfp4_bench.json" 2>&1 | tee "$OUT/mxfp4_bench.log"
           [ "$rc" -eq 0 ] || { echo "mxfp4 GPU tests failed (exit $rc): $OUT/mxfp4_tests.log" >&2; exit "$rc"; }; fi ;;
    20b)
      if [ -n "${SMOKE:-}" ]; then $PY -m trtllm_dflash.bench.gpt_oss_step --tiny --device cpu --batch_sizes 1,4,16,64 --blocks 8 --iters 2 \
             "${ROUTING[@]}" --profile --out "$OUT/gpt_oss_20b_step_smoke.json"
      else tag=$(gpu_tag)
           $PY -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-20b --batch_sizes 1,4,16,64 --blocks 8 --iters 15 --compare_dequant \
             "${ROUTING[@]}" "${EXPERTS_ARGS[@]}" --tile_sweep --profile --out "$RESULTS/gpt_oss_20b_step${SUFFIX}_$tag.json" 2>&1 | tee "$OUT/20b.log"; fi ;;
    120b)
      if [ -n "${SMOKE:-}" ]; then $PY -m trtllm_dflash.bench.gpt_oss_step --tiny --device cpu --batch_sizes 1,4,16,64 --blocks 10 --iters 2 \
             "${ROUTING[@]}" --profile --out "$OUT/gpt_oss_120b_step_smoke.json"
      else tag=$(gpu_tag)
           $PY -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-120b --batch_sizes 1,4,16,64 --blocks 10 --iters 15 --compare_layers 1 \
             "${ROUTING[@]}" "${EXPERTS_ARGS[@]}" --tile_sweep --profile --out "$RESULTS/gpt_oss_120b_step${SUFFIX}_$tag.json" 2>&1 | tee "$OUT/120b.log"; fi ;;
    flashinfer|triton_kernels)
      if [ -n "${SMOKE:-}" ]; then tests=tests/bench/test_flashinfer_moe.py
             [ "$stage" = flashinfer ] || tests=tests/runtime/test_triton_kernels_moe.py
             $PY -m pytest -q -p no:cacheprovider "$tests" 2>&1 | tee "$OUT/$stage.log"
      else tag=$(gpu_tag)
           $PY -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-120b --batch_sizes 1,4,16,64 --blocks 10 --iters 15 \
             "${ROUTING[@]}" --compare "$stage" --out "$RESULTS/gpt_oss_120b_vs_${stage}_$tag.json" 2>&1 | tee "$OUT/$stage.log"; fi ;;
    tp2)
      if [ -n "${SMOKE:-}" ]; then ${MPIRUN:-mpiexec} -n 2 $PY -m trtllm_dflash.bench.gpt_oss_tp --tiny --device cpu --iters 2 --warmup 1 --ctx 32 \
             --out "$OUT/gpt_oss_tp2_smoke.json" 2>&1 | tee "$OUT/tp2.log"
      else eps=2,1; [ -z "${EXPERTS:-}" ] || eps=1   # the library runs whole experts per rank
           ${MPIRUN:-mpirun --allow-run-as-root} -n 2 $PY -m trtllm_dflash.bench.gpt_oss_tp --target gpt-oss-120b --ep_sizes $eps --batch_sizes 1,64 \
             "${EXPERTS_ARGS[@]}" --block_size 10 --iters 10 --out "$OUT/gpt_oss_120b_tp2${SUFFIX}_h200x2.json" 2>&1 | tee "$OUT/tp2.log"; fi ;;
    *) echo "unknown stage $stage (tests, mxfp4, 20b, 120b, flashinfer, triton_kernels, tp2)" >&2; exit 2 ;;
  esac
done
