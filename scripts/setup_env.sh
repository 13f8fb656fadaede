#!/usr/bin/env bash
# Create (once) and reuse .venv with everything the quick start and the tests need, on a plain
# CPU machine with Python 3.11. torch is pinned to 2.13.0 because that is the local CPU build;
# a newer torch would pull several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
STAMP="$VENV/.trtllm_dflash_stamp"
want=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
echo "setting up $VENV (first time: ~3 min)..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q torch==2.13.0
# OpenAI Triton for the kernel tests, which run its interpreter on the CPU (TRITON_INTERPRET=1): the CPU torch
# wheel does not bring it (CUDA builds do). 3.6.0 is what the GPU hosts' torch 2.11 pins; ~190 MB, no dependencies.
"$VENV/bin/python" -m pip install -q triton==3.6.0
"$VENV/bin/python" -m pip install -q -e '.[gguf,mpi,triton,plot,modelopt,openai,dev]'
echo "$want" > "$STAMP"
echo "ready: $VENV" >&2
