#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The SmolLM2 GPU work on a host without network, from files carried into .carry/ (see the device notes in
# benchmarks/README-gpu.md):  train | sweep  -> results under $OUT (few files, each < 16 MB).
#   .carry/w1 w2 w3  wheels (ModelOpt stack, transformers 5.14.1, tokenizers 0.22.2, gguf, data packages)
#   .carry/cache     TRTLLM_DFLASH_CACHE holding the converted SmolLM2 folder
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?usage: $0 train|sweep}
SITE=/tmp/dflash_site
[ -d "$SITE/modelopt" ] || python3 -m pip install -q --no-index --no-deps --target "$SITE" .carry/w*/*.whl
export PYTHONPATH=$SITE:$PWD TRTLLM_DFLASH_CACHE=$PWD/.carry/cache PYTHONUNBUFFERED=1 PYTHON=python3
RUN=$PWD/.carry/run
if [ "$STAGE" = train ]; then
  DATA=$PWD/.carry/w3/sharegpt_prompts.jsonl bash benchmarks/train_smollm2_gpu.sh "$RUN"
  # the drafter travels back as two safetensors shards (< 16 MB each) plus an index
  python3 - "$RUN/train/drafter" "$OUT" <<'PY'
import json, sys
from safetensors.torch import load_file, save_file
src, out = sys.argv[1], sys.argv[2]
sd = load_file(f"{src}/model.safetensors")
keys = sorted(sd)
half = len(keys) // 2
index = {"metadata": {}, "weight_map": {}}
for i, part in enumerate((keys[:half], keys[half:]), 1):
    name = f"model-0000{i}-of-00002.safetensors"
    save_file({k: sd[k] for k in part}, f"{out}/{name}")
    index["weight_map"].update({k: name for k in part})
json.dump(index, open(f"{out}/model.safetensors.index.json", "w"))
PY
  tar czf "$OUT/train_reports.tgz" -C "$RUN" train/report.json train/loss.csv train/drafter/config.json \
    $(cd "$RUN" && ls acceptance_smollm2.* 2>/dev/null)
else
  python3 -m trtllm_dflash.build --target smollm2-135m --drafter "$RUN/train/drafter" --gpu h100 --backend torch \
    --max_batch_size 64 --max_seq_len 2048 --out "$RUN/deploy" --force
  for mode in ar dflash; do
    python3 -m trtllm_dflash.bench.sweep --engine "$RUN/deploy" --mode $mode --concurrency 1,2,4,8,16,32,64 \
      --dataset humaneval --max_new_tokens 256 --label "SmolLM2-135M $mode" --out "$OUT/sweep_smollm2_h100.jsonl"
  done
fi
