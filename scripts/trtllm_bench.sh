#!/usr/bin/env bash
# The same concurrency sweep with TensorRT-LLM's own tools, for a deployment built with --backend trtllm:
# trtllm-bench (offline, in-process) and benchmark_serving against trtllm-serve (online). Prints the commands;
# RUN=1 also runs them (start the printed trtllm-serve first for the online part). The reports plot with
# dflash-plot next to dflash-sweep JSONL (the last line printed).
# usage: scripts/trtllm_bench.sh DEPLOYMENT_DIR [OUT_DIR]
#   env: CONCURRENCY (1,2,4,...) ISL OSL LABEL MODEL (hf name) OPTIONS (llm_api_options.yaml, e.g. an EAGLE-3 or AR one) PORT
set -euo pipefail
DEPLOYMENT=$(cd "${1:?usage: scripts/trtllm_bench.sh DEPLOYMENT_DIR [OUT_DIR]}" && pwd); OUT=${2:-benchmarks/results/$(basename "$DEPLOYMENT")/trtllm}
read -r TP EP SRC < <(${PYTHON:-python} -c 'import sys; from trtllm_dflash.deployment import Deployment; d = Deployment.open(sys.argv[1]); print(d.tp_size, d.ep_size, d.target.get("source", ""))' "$DEPLOYMENT")
MODEL=${MODEL:-${SRC:?the manifest names no target: set MODEL=<hf model name>}} OPTIONS=${OPTIONS:-$DEPLOYMENT/llm_api_options.yaml} LABEL=${LABEL:-DFlash} ISL=${ISL:-1024} OSL=${OSL:-1024} PORT=${PORT:-8000}
LEVELS=${CONCURRENCY:-1,2,4,8,16,32,64}; LEVELS=${LEVELS//,/ }; MAXC=$(printf '%s\n' $LEVELS | sort -n | tail -1)
n() { echo $(($1 * 5 > 8 ? $1 * 5 : 8)); }   # requests per level, as dflash-sweep: 5 x concurrency, at least 8
show() { for a; do if [[ $a =~ ^[][A-Za-z0-9_./:=,+*-]+$ ]]; then printf '%s ' "$a"; else printf '%q ' "$a"; fi; done; echo; }
run() { show "$@"; if [ "${RUN:-0}" = 1 ]; then mkdir -p "$OUT" && "$@"; fi; }
echo "# offline: trtllm-bench (dataset once, then one run per concurrency)"
run trtllm-bench --model "$MODEL" --model_path "$DEPLOYMENT/target" prepare-dataset --output "$OUT/dataset_${ISL}_${OSL}.jsonl" token-norm-dist --input-mean "$ISL" --output-mean "$OSL" --input-stdev 0 --output-stdev 0 --num-requests "$(n "$MAXC")"
for C in $LEVELS; do
  run trtllm-bench --model "$MODEL" --model_path "$DEPLOYMENT/target" throughput --backend pytorch --dataset "$OUT/dataset_${ISL}_${OSL}.jsonl" --tp "$TP" --ep "$EP" --concurrency "$C" --streaming --num_requests "$(n "$C")" --warmup "$C" --extra_llm_api_options "$OPTIONS" --report_json "$OUT/${LABEL}_bench_c$C.json"
done
echo "# online: start the server first (this script never starts it):"
show trtllm-serve "$DEPLOYMENT/target" --backend pytorch --tp_size "$TP" --ep_size "$EP" --extra_llm_api_options "$OPTIONS" --port "$PORT"
for C in $LEVELS; do
  run python -m tensorrt_llm.serve.scripts.benchmark_serving --model "$MODEL" --tokenizer "$DEPLOYMENT/target" --backend openai --host localhost --port "$PORT" --dataset-name random --random-input-len "$ISL" --random-output-len "$OSL" --num-prompts "$(n "$C")" --max-concurrency "$C" --ignore-eos --percentile-metrics ttft,tpot,itl,e2el --save-result --result-dir "$OUT" --result-filename "${LABEL}_serving_c$C.json"
done
echo "# plot with the dflash-sweep rows (benchmark_serving files do not record the GPU count):"
show dflash-plot sweep.jsonl "$LABEL trtllm-bench=$OUT/${LABEL}_bench_c*.json" "$LABEL serving=$OUT/${LABEL}_serving_c*.json" --num_gpus "$TP" --out_dir "$OUT"
