#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole served path under tensor parallelism: a Qwen3-8B-shaped pair with random weights written to disk
# (python -m trtllm_dflash.bench.random_pair; the drafter has the public z-lab drafter's shape), dflash-build at
# each TP size, then dflash-sweep under mpirun -n TP (the engine on every rank, rank 0 schedules), AR and DFlash,
# random token ids, the same requests at every TP size. A random drafter accepts ~1 token: the DFlash rows are the
# cost of a verify step, not a speed-up; the point is what each TP size does to latency and cost per GPU.
#   OUT=DIR bash benchmarks/tp_sweep.sh
#     -> $OUT/tp_sweep_<gpu>.jsonl (rows labelled "AR TP 2" ...), tp_sweep_<gpu>.json (summary: tokens/s per user
#        and per GPU by mode, TP size and concurrency; TP N / TP 1 ratios), tp_sweep_<gpu>.png (Pareto)
#   TP_SIZES ["1 2 4"; the GPUs must be there], MODEL [qwen3-8b], LEVELS [1,4,16,64], INPUT_LEN [512], NEW [128]
#   WORK [work/tp_sweep]: the random pair (written once, ~16 GB for qwen3-8b) and the deployments
#   MPIRUN [mpirun], MPI_FLAGS [--allow-run-as-root]; RESUME=1 keeps $OUT's rows and runs only the sweeps they lack
#   SMOKE=1: tiny widths on this CPU (gloo), TP 1 and 2, levels 1,2, 8 new tokens -> tp_sweep_smoke.*
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
WORK=${WORK:-$PWD/work/tp_sweep}
MODEL=${MODEL:-qwen3-8b}
mkdir -p "$OUT" "$WORK"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1   # NVLink multicast off, as every TP figure here
if [[ ${SMOKE:-0} == 1 ]]; then
  export PATH=$PWD/.venv/bin:$PATH
  PY=python; GPU=cpu; NAME=tp_sweep_smoke; TP_SIZES=${TP_SIZES:-1 2}; LEVELS=${LEVELS:-1,2}
  PAIR=(--smoke --dtype float32 --device cpu); LOAD=(--input_len 16 --max_new_tokens 8 --num_requests 4 --device cpu)
  MPI=(${MPIRUN:-mpiexec} ${MPI_FLAGS:-})
else
  PY=${PYTHON:-python3}
  GPU=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|b300' |
                   tr A-Z a-z)}
  NAME=tp_sweep_${GPU:-gpu}; TP_SIZES=${TP_SIZES:-1 2 4}; LEVELS=${LEVELS:-1,4,16,64}
  PAIR=(); LOAD=(--input_len "${INPUT_LEN:-512}" --max_new_tokens "${NEW:-128}")
  MPI=(${MPIRUN:-mpirun} ${MPI_FLAGS:---allow-run-as-root})
fi
[ -d "$WORK/pair/target" ] || $PY -m trtllm_dflash.bench.random_pair --model "$MODEL" --out "$WORK/pair" "${PAIR[@]}"
[[ ${RESUME:-0} == 1 ]] || rm -f "$OUT/$NAME.jsonl"
for tp in $TP_SIZES; do
  $PY -m trtllm_dflash.build --target "$WORK/pair/target" --drafter "$WORK/pair/drafter" --tp_size "$tp" \
    --gpu "${GPU:-h100}" --backend torch --max_batch_size 64 --max_seq_len 2048 --out "$WORK/deploy_tp$tp" --force \
    > "$OUT/build_tp$tp.log"
  for mode in ar dflash; do
    label="$(case $mode in ar) echo AR ;; *) echo DFlash ;; esac) TP $tp"
    if [[ ${RESUME:-0} == 1 ]] && $PY -m trtllm_dflash.bench.resume "$OUT/$NAME.jsonl" "$label" "$LEVELS"; then
      continue
    fi
    "${MPI[@]}" -n "$tp" $PY -m trtllm_dflash.bench.sweep --deployment_dir "$WORK/deploy_tp$tp" --mode $mode \
      --concurrency "$LEVELS" --dataset random "${LOAD[@]}" --ignore_eos --label "$label" --out "$OUT/$NAME.jsonl"
  done
done
$PY -m trtllm_dflash.bench.plot "$OUT/$NAME.jsonl" --out_dir "$OUT/plot_$NAME" \
  --title "$MODEL shapes, random weights: AR and DFlash at TP $(echo $TP_SIZES | tr ' ' '/')"
cp "$OUT/plot_$NAME/pareto.png" "$OUT/$NAME.png"
$PY -m trtllm_dflash.bench.tp_sweep_summary "$OUT/$NAME.jsonl" --out "$OUT/$NAME.json"
