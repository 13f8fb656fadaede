#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end with a SmolLM2 pair (issue #24 item 4): AR vs DFlash at a fixed block vs DFlash under the adaptive
# policy, tokens/s per user at concurrency 1, 4 and 16, on HumanEval and MT-Bench prompts. Every mode gets the
# same prompts (dflash-sweep's seeded workload) and the same budget (256 new tokens, greedy). ~3 min on an H100.
#   OUT=DIR bash benchmarks/e2e_smollm2.sh     # -> $OUT/e2e_smollm2_h100.json (rows + summary), e2e.jsonl
#   DRAFTER: the drafter folder or shipped name [smollm2-135m-dflash]; SMOKE=1: the same on this CPU, 8 tokens,
#   2 levels, few requests (-> e2e_smollm2_smoke.json)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
DRAFTER=${DRAFTER:-smollm2-135m-dflash}
mkdir -p "$OUT"
if [[ ${SMOKE:-0} == 1 ]]; then
  GPU=(--gpu h100 --max_batch_size 2); LOAD=(--max_new_tokens 8 --device cpu --warmup 0); LEVELS=("1 1" "2 2"); NAME=e2e_smollm2_smoke
else
  GPU=(--gpu h100 --max_batch_size 16); LOAD=(--max_new_tokens 256); LEVELS=("1 16" "4 32" "16 64"); NAME=e2e_smollm2_h100
fi
DEPLOY=$OUT/.deploy
$PY -m trtllm_dflash.build --target smollm2-135m --drafter "$DRAFTER" "${GPU[@]}" --backend torch --max_seq_len 2048 \
  --out "$DEPLOY" --force
rm -f "$OUT/e2e.jsonl"
for dataset in humaneval mtbench; do
  for mode in ar dflash adaptive; do
    for lv in "${LEVELS[@]}"; do
      set -- $lv
      $PY -m trtllm_dflash.bench.sweep --engine "$DEPLOY" --mode $mode --concurrency "$1" --num_requests "$2" \
        --dataset $dataset "${LOAD[@]}" --out "$OUT/e2e.jsonl"
    done
  done
done
$PY benchmarks/e2e_summary.py --sweep "$OUT/e2e.jsonl" --out "$OUT/$NAME.json"
rm -rf "$DEPLOY"
