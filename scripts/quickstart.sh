#!/usr/bin/env bash
# The main job on the embedded default backend: the real SmolLM2-135M-Instruct target (from PyPI),
# autoregressive and DFlash side by side on CPU, text + acceptance statistics. Both engines are loaded and warmed
# up first, then generate in turn for --rounds 5 (AR first, then DFlash first, ...): the summary's one
# DFlash/AR speed-up is the median of the rounds, with their range.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
dflash-generate --target smollm2-135m --drafter "${DRAFTER:-smollm2-135m-dflash}" --mode both --max_new_tokens 64 \
  --prompt "What is the capital of France?" \
  --prompt "Write a Python function that returns the sum of a list." "$@"
