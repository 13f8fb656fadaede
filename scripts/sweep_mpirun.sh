#!/usr/bin/env bash
# AR vs DFlash concurrency sweep of a deployment directory (TP ranks under mpirun), then the Pareto plot.
# usage: scripts/sweep_mpirun.sh ENGINE_DIR [OUT_DIR] [dflash-sweep flags]   env: CONCURRENCY MPIRUN MPI_FLAGS PYTHON
set -euo pipefail
ENGINE=${1:?usage: scripts/sweep_mpirun.sh ENGINE_DIR [OUT_DIR] [dflash-sweep flags]}; OUT=${2:-benchmarks/results/$(basename "$ENGINE")}; PY=${PYTHON:-python}
TP=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1] + "/manifest.json"))["tp_size"])' "$ENGINE"); [ ! -e "$OUT/sweep.jsonl" ] || { echo "$OUT/sweep.jsonl exists: move it away first" >&2; exit 1; }
for MODE in ar dflash; do ${MPIRUN:-mpirun} ${MPI_FLAGS:-} -n "$TP" "$PY" -m trtllm_dflash.bench.sweep --engine "$ENGINE" --mode "$MODE" --concurrency "${CONCURRENCY:-1,2,4,8,16,32,64}" --out "$OUT/sweep.jsonl" "${@:3}"; done
"$PY" -m trtllm_dflash.bench.plot "$OUT/sweep.jsonl" --out_dir "$OUT"
