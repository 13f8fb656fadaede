# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/mxfp4_probe.py: its partial kernels read exactly the bytes the gemv gate_up kernel reads."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# not imported here: Triton reads TRITON_INTERPRET once, and the kernel tests of this process set it after
# collection has imported this module (both cases run in subprocesses of their own)
if importlib.util.find_spec("triton") is None:
    pytest.skip("OpenAI Triton is not installed (pip install triton)", allow_module_level=True)

CHECK = r"""
import functools, operator, torch
from trtllm_dflash.bench.mxfp4 import make_experts, routing
from trtllm_dflash.bench.mxfp4_probe import part_fn
from trtllm_dflash.bench.mxfp4_probe_kernels import probe_kernel
from trtllm_dflash.runtime import mxfp4_moe as mx
E, H, I, k, N = 8, 64, 96, 2, 3
w = make_experts(E, H, I, torch.device("cpu"))
ids, weights = routing("random", N, E, k, torch.device("cpu"), seed=1)
tiles = mx.TileConfig(variant="gemv", block_m=16, block_n=16, block_k=32, split_k=1)
fn, split, out = part_fn("stream", torch.randn(N, H), ids, weights, w, tiles, probe_kernel)
assert split == 1
fn()
got = functools.reduce(operator.xor, out.tolist())
want = 0
for e in ids.unique().tolist():
    words = w["gu_blocks"][e].contiguous().view(torch.int32).reshape(-1)
    want ^= functools.reduce(operator.xor, words.tolist()) ^ functools.reduce(operator.xor, w["gu_scales"][e].reshape(-1).int().tolist())
assert got == want, (got, want)
other = next(e for e in range(E) if e not in ids.unique().tolist())     # an expert the call did not choose
w["gu_blocks"][other] ^= 1
fn()
assert functools.reduce(operator.xor, out.tolist()) == got
chosen = ids.unique().tolist()[0]                                         # and one it did: the fold moves
w["gu_blocks"][chosen, 0, 0, 0] ^= 1
fn()
assert functools.reduce(operator.xor, out.tolist()) == got ^ 1
print("ok")
"""


def _run(code_or_args, interpret=True):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, *code_or_args], env=env, capture_output=True, text=True, timeout=600)


def test_the_stream_probe_folds_every_byte_of_the_chosen_experts_and_no_other():
    proc = _run(["-c", CHECK])
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]


def test_smoke_run_reports_every_part(tmp_path):
    out = tmp_path / "probe.json"
    proc = _run(["-m", "trtllm_dflash.bench.mxfp4_probe", "--smoke", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["tokens"] for r in rows] == [1, 3]
    for r in rows:
        assert r["gate_up_bytes"] > 0 and all(r[f"{p}_us"] > 0 for p in ("copy", "stream", "decode", "gate_up"))
