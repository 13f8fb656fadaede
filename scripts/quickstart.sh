#!/usr/bin/env bash
# The main job on the embedded default backend: the real SmolLM2-135M-Instruct target (from PyPI),
# autoregressive and DFlash side by side on CPU, text + acceptance statistics. Both engines are loaded and warmed
# up first, then generate in turn for --rounds 5 (AR first, then DFlash first, ...): the summary's one
# DFlash/AR speed-up is the median of the rounds, with their range.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
# Both modes in one dtype: bfloat16 where this CPU multiplies bf16 in hardware (AMX), float32 elsewhere
# (trtllm_dflash/bench/quickstart_repeat.py: quickstart_dtype says why); DTYPE=float32 chooses.
DTYPE=${DTYPE:-$(python -c "from trtllm_dflash.bench.quickstart_repeat import quickstart_dtype; print(quickstart_dtype())")}
echo "quick start: --dtype $DTYPE (bfloat16 where this CPU has AMX-BF16, else float32; DTYPE=float32 to choose)" >&2
dflash-generate --target smollm2-135m --drafter "${DRAFTER:-smollm2-135m-dflash}" --mode both --max_new_tokens 64 \
  --prompt "What is the capital of France?" \
  --prompt "Write a Python function that returns the sum of a list." --dtype "$DTYPE" "$@"
