#!/usr/bin/env bash
# AR vs DFlash concurrency sweep of a deployment directory (TP ranks under mpirun), then the Pareto plot.
# usage: scripts/sweep_mpirun.sh DEPLOYMENT_DIR [OUT_DIR] [dflash-sweep flags]   env: CONCURRENCY MPIRUN MPI_FLAGS PYTHON
set -euo pipefail
DEPLOYMENT=${1:?usage: scripts/sweep_mpirun.sh DEPLOYMENT_DIR [OUT_DIR] [dflash-sweep flags]}; OUT=${2:-benchmarks/results/$(basename "$DEPLOYMENT")}; PY=${PYTHON:-python}
TP=$("$PY" -c 'import sys; from trtllm_dflash.deployment import Deployment; print(Deployment.open(sys.argv[1]).tp_size)' "$DEPLOYMENT"); [ ! -e "$OUT/sweep.jsonl" ] || { echo "$OUT/sweep.jsonl exists: move it away first" >&2; exit 1; }
for MODE in ar dflash; do ${MPIRUN:-mpirun} ${MPI_FLAGS:-} -n "$TP" "$PY" -m trtllm_dflash.bench.sweep --deployment_dir "$DEPLOYMENT" --mode "$MODE" --concurrency "${CONCURRENCY:-1,2,4,8,16,32,64}" --out "$OUT/sweep.jsonl" "${@:3}"; done
"$PY" -m trtllm_dflash.bench.plot "$OUT/sweep.jsonl" --out_dir "$OUT"
