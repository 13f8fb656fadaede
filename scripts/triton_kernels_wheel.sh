#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A wheel of triton_kernels (triton-lang/triton's python/triton_kernels: the MoE kernels vLLM runs gpt-oss's MXFP4
# experts on) for `gpt_oss_step --compare triton_kernels`. It is not on PyPI; vLLM ships it inside its own wheel
# (vllm/third_party/triton_kernels) next to the Triton it was tested with: vllm 0.26.0 pins torch 2.11 (Triton 3.6)
# and carries the kernels of triton v3.5.1. This takes that copy out of the vllm wheel (downloaded without dependencies) and
# packs it as a wheel of its own, into an offline folder's wheel set (scripts/offline_host.sh) or any folder.
#   scripts/triton_kernels_wheel.sh DIR          -> DIR/wheels/triton_kernels/triton_kernels-*.whl (+ SHA256SUMS)
#   VLLM_VERSION=0.26.0 (default) picks the vllm release to take it from.
set -euo pipefail
DIR=${1:?usage: $0 DIR (an offline folder, see scripts/offline_host.sh)}
VLLM_VERSION=${VLLM_VERSION:-0.26.0}
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "downloading vllm==$VLLM_VERSION (no dependencies) for its vendored triton_kernels"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$work/dl" "vllm==$VLLM_VERSION"
mkdir -p "$work/src"
"$PY" - "$work/dl"/vllm-*.whl "$work/src" <<'PYEOF'
import os, sys, zipfile
prefix = "vllm/third_party/"
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.startswith(prefix + "triton_kernels/") and n.endswith(".py"):
            out = os.path.join(sys.argv[2], n[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(n))
if not os.path.isdir(os.path.join(sys.argv[2], "triton_kernels")):
    sys.exit(f"error: {sys.argv[1]} has no {prefix}triton_kernels/ (pick a vllm release that vendors it: VLLM_VERSION)")
PYEOF
cat > "$work/src/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=70.1"]   # bdist_wheel built in
build-backend = "setuptools.build_meta"

[project]
name = "triton_kernels"
version = "0+vllm$VLLM_VERSION"
description = "triton-lang/triton python/triton_kernels as vendored in vllm $VLLM_VERSION (vllm/third_party/triton_kernels)"
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["triton_kernels*"]
TOML
"$PY" -m pip wheel -q --no-deps "$work/src" -w "$work/whl"
bash "$(dirname "$0")/offline_host.sh" wheel "$DIR" triton_kernels "$work"/whl/triton_kernels-*.whl
