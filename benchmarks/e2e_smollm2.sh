#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end with a SmolLM2 pair: AR vs DFlash at a fixed block vs DFlash under the adaptive policy, tokens/s per
# user and tokens/s at concurrency 1, 4, 16 and 64, on HumanEval and MT-Bench prompts, in-process (dflash-sweep
# on the engine) AND through dflash-openai (the sweep's OpenAI client, streaming). Every mode gets the same prompts
# (dflash-sweep's seeded workload) and the same budget (256 new tokens, greedy). ~8 min on an H100.
#   OUT=DIR bash benchmarks/e2e_smollm2.sh
#     -> $OUT/e2e_smollm2_<gpu>.json (rows + summary), e2e_<dataset>.jsonl, e2e_smollm2_<gpu>_<dataset>.png (Pareto),
#     <gpu> = h100, h200, ... from nvidia-smi (GPU_TAG= overrides)
#   DRAFTER: the drafter folder or shipped name [smollm2-135m-dflash]; SMOKE=1: the same on this CPU, 8 tokens,
#   levels 1 and 2, few requests (-> e2e_smollm2_smoke.json); SERVED=0 skips the dflash-openai half;
#   API_SERVERS: dflash-openai's --api_server_count [its default: one per 4 cores, 1 to 4] (frontend processes on
#   the port, one engine);
#   RESUME=1: keep $OUT's rows and run only the sweeps they lack (a run its time limit ended goes on);
#   GPUS=0,1: the datasets at the same time, the i-th on GPU i of the list (CUDA_VISIBLE_DEVICES) and port PORT + i,
#   one summary over all (each GPU runs one dataset's whole sweep alone; the host's cores are shared)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT}
DRAFTER=${DRAFTER:-smollm2-135m-dflash}
mkdir -p "$OUT"
if [[ ${SMOKE:-0} == 1 ]]; then
  export PATH=$PWD/.venv/bin:$PATH PYTHON=${PYTHON:-python}     # this checkout's environment, as the other recipes
  GPU=(--gpu h100 --max_batch_size 2); LOAD=(--max_new_tokens 8 --device cpu --warmup 0 --num_requests 2)
  LEVELS=1,2; NAME=e2e_smollm2_smoke; DATASETS=${DATASETS:-humaneval}
else
  # results are named by the GPU that ran them (h100, h200, ...), which also picks dflash-build's preset
  TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|b300' | tr A-Z a-z)}
  GPU=(--gpu "${TAG:-h100}" --max_batch_size 64); LOAD=(--max_new_tokens 256); LEVELS=1,4,16,64; NAME=e2e_smollm2_${TAG:-gpu}
  DATASETS=${DATASETS:-humaneval mtbench}
fi
PY=${PYTHON:-python3}
# the servers' frontend count, also recorded in the summary: dflash-openai's own default unless set
API_SERVERS=${API_SERVERS:-$($PY -c "from trtllm_dflash.serving.openai_server import default_api_server_count as n; print(n())")}
# two deployments of the same pair: the policy is the deployment's when served (AR = either with no drafting)
for policy in fixed adaptive; do
  $PY -m trtllm_dflash.build --target smollm2-135m --drafter "$DRAFTER" "${GPU[@]}" --backend torch \
    --max_seq_len 2048 --draft_policy $policy --out "$OUT/.deploy_$policy" --force
done
BASE_PORT=${PORT:-$((20000 + RANDOM % 20000))}
# dflash-openai in the background for one sweep: started in its own session, waited for, stopped by its group
served() {   # mode deployment [server flags...]
  local mode=$1 deploy=$2 log=$OUT/openai_$1_$dataset.log; shift 2
  have "$label via dflash-openai" && return 0
  setsid $PY -m trtllm_dflash.serving.openai_server "$deploy" --port $PORT --served_model_name smollm2 \
    --api_server_count "$API_SERVERS" "$@" \
    > "$log" 2>&1 &
  local pid=$! t=0 rc=0
  until grep -q "dflash-openai: ready" "$log"; do
    sleep 1; t=$((t + 1))
    if ! kill -0 $pid 2>/dev/null || [ $t -gt 300 ]; then
      echo "dflash-openai ($mode): not ready (see $log)"; tail -20 "$log"; kill -TERM -- -$pid 2>/dev/null; return 1
    fi
  done
  $PY -m trtllm_dflash.bench.sweep --server openai --url 127.0.0.1:$PORT --deployment_dir "$deploy" --mode $mode \
    --concurrency $LEVELS --dataset $dataset "${LOAD[@]}" --label "$label via dflash-openai" \
    --out "$OUT/e2e_$dataset.jsonl" || rc=$?
  kill -TERM -- -$pid; wait $pid || true
  return $rc
}
# RESUME=1: a run cut short goes on where it stopped: a sweep whose rows are in the dataset's JSONL at every level
# is skipped, the rows of one it did not finish are dropped and it runs again
have() {   # label: true when RESUME=1 and $OUT/e2e_$dataset.jsonl holds it at every level
  [[ ${RESUME:-0} == 1 ]] && $PY -m trtllm_dflash.bench.resume "$OUT/e2e_$dataset.jsonl" "$1" "$LEVELS"
}
one_dataset() {   # dataset [port]: its sweeps in-process and served, its Pareto plot
  local dataset=$1 mode label
  PORT=${2:-$BASE_PORT}
  [[ ${RESUME:-0} == 1 ]] || rm -f "$OUT/e2e_$dataset.jsonl"
  for mode in ar dflash adaptive; do
    label=$(case $mode in ar) echo AR ;; dflash) echo DFlash ;; *) echo "DFlash adaptive" ;; esac)
    have "$label" && continue
    $PY -m trtllm_dflash.bench.sweep --deployment_dir "$OUT/.deploy_fixed" --mode $mode --concurrency $LEVELS \
      --dataset $dataset "${LOAD[@]}" --label "$label" --out "$OUT/e2e_$dataset.jsonl"
  done
  if [[ ${SERVED:-1} == 1 ]]; then
    label=AR; served ar "$OUT/.deploy_fixed" --max_draft_len 0
    label=DFlash; served dflash "$OUT/.deploy_fixed"
    label="DFlash adaptive"; served adaptive "$OUT/.deploy_adaptive"
  fi
  mkdir -p "$OUT/plot_$dataset"
  $PY -m trtllm_dflash.bench.plot "$OUT/e2e_$dataset.jsonl" --out_dir "$OUT/plot_$dataset" --baseline AR \
    --title "SmolLM2-135M, $dataset: AR vs DFlash, in-process and through dflash-openai"
  cp "$OUT/plot_$dataset/pareto.png" "$OUT/${NAME}_$dataset.png"
}
if [[ -n ${GPUS:-} ]]; then
  IFS=, read -ra gpus <<< "$GPUS"
  read -ra sets <<< "$DATASETS"
  [[ ${#gpus[@]} -ge ${#sets[@]} ]] || { echo "GPUS=$GPUS: one GPU per dataset ($DATASETS)"; exit 2; }
  pids=()
  for i in "${!sets[@]}"; do
    CUDA_VISIBLE_DEVICES=${gpus[$i]} one_dataset "${sets[$i]}" $((BASE_PORT + i)) > "$OUT/e2e_${sets[$i]}.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { rc=$?; echo "${sets[$i]} failed (see $OUT/e2e_${sets[$i]}.log)"; }; done
  [[ $rc == 0 ]] || exit $rc
else
  for dataset in $DATASETS; do one_dataset $dataset; done
fi
sweeps=(); for dataset in $DATASETS; do sweeps+=("$OUT/e2e_$dataset.jsonl"); done
cat "${sweeps[@]}" > "$OUT/e2e.jsonl"
$PY -m trtllm_dflash.bench.e2e_summary --sweep "${sweeps[@]}" --out "$OUT/$NAME.json" \
  --api_server_count "$API_SERVERS" --deployment_dir "$OUT/.deploy_fixed"
rm -rf "$OUT"/.deploy_fixed "$OUT"/.deploy_adaptive
