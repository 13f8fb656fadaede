# SPDX-License-Identifier: Apache-2.0
"""The runtime's GPU paths against references: CUDA-graph replay == the eager step, inductor-fused chains ==
the same math run eagerly and in float64, the FP8 GEMM == a float64 product, TP 2 over NCCL == TP 1.
Random weights at small shapes: these run on any CUDA GPU in seconds (`pytest -m gpu tests/gpu`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.test_engine import eager_at_graph_shapes
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


def prompts(n=6):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, 90, (k,), generator=g).tolist() for k in (3, 17, 1, 40, 9, 25)[:n]]


PARAMS = [SamplingParams(max_new_tokens=48, ignore_eos=True)] * 3 + [
    SamplingParams(max_new_tokens=48, ignore_eos=True, temperature=1.0, seed=1),
    SamplingParams(max_new_tokens=48, ignore_eos=True, temperature=0.8, top_k=5, seed=2),
    SamplingParams(max_new_tokens=48, ignore_eos=True, temperature=1.2, top_p=0.8, seed=3)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pair_name", ["tiny_pair", "tiny_qwen3_pair"])
@pytest.mark.parametrize("block", [None, 1])   # DFlash (the drafter's block 8) and AR
def test_cuda_graph_replay_equals_the_eager_step(request, pair_name, dtype, block):
    """A graph replays each step padded to its bucket (rows rounded up to a power of two, the KV length to
    >= 256; Runner.graph_shape). The eager engine compared with it first runs those same padded shapes: the
    same kernels on the same operands, so any dtype must agree token for token, and a difference can only
    come from the graph machinery (capture, static buffers, replay, the warm-up not advancing requests).

    Eager at the unpadded shapes is a different computation: cuBLAS picks its GEMM kernel (tiling, split-K)
    by M, and a sum in another order rounds differently. In bf16 (8 mantissa bits) that flipped a near-tie
    argmax at token 31 of 48 (tiny Qwen3 pair, DFlash, H100); in float32 (24 bits) it has not, and that
    comparison, kept for float32, also checks that the padding rows never leak into the real ones."""
    pair = request.getfixturevalue(pair_name)
    cfg = dict(max_seq_len=256, max_batch_size=4, dtype=dtype, device="cuda", block_size=block)
    graphed = Engine.from_dirs(pair[0], pair[1], RuntimeConfig(cuda_graphs=True, **cfg))
    padded = eager_at_graph_shapes(Engine.from_dirs(pair[0], pair[1], RuntimeConfig(cuda_graphs=False, **cfg)))
    ps = prompts()   # 6 requests over 4 slots: several batch buckets, greedy and sampled rows side by side
    a, b = graphed.generate(ps, PARAMS), padded.generate(ps, PARAMS)
    assert graphed.metrics()["graphs"] >= 2 and padded.metrics()["graphs"] == 0   # the graphs really ran
    for x, y in zip(a, b):
        assert x.output_ids == y.output_ids
        assert x.stats.acceptance_lengths == y.stats.acceptance_lengths
    if dtype == "float32":
        eager = Engine.from_dirs(pair[0], pair[1], RuntimeConfig(cuda_graphs=False, **cfg))
        for x, y in zip(a, eager.generate(ps, PARAMS)):
            assert x.output_ids == y.output_ids
            assert x.stats.acceptance_lengths == y.stats.acceptance_lengths


def _fused_cases(dtype):
    from trtllm_dflash.runtime.models import layers
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)

    cases = []
    for T in (1, 5, 16):   # dynamic shapes: one compiled kernel serves decode, verify and prefill sizes
        cos, sin = r(2, T, 1, 64).cos(), r(2, T, 1, 64).sin()
        cases += [("rms_norm", layers.rms_norm, (r(2, T, 256), r(256), 1e-5)),
                  ("add_rms_norm", layers.add_rms_norm, (r(2, T, 256), r(2, T, 256), r(256), 1e-6)),
                  ("norm_rope", layers.norm_rope, (r(2, T, 4, 64), cos, sin, r(64), 1e-6)),
                  ("norm_rope_no_norm", layers.norm_rope, (r(2, T, 4, 64), cos, sin, None, 1e-6)),
                  ("qk_norm_rope", layers.qk_norm_rope, (r(2, T, 8, 64), r(2, T, 2, 64), cos, sin, r(64), r(64), 1e-6)),
                  ("masked_softmax", layers.masked_softmax,
                   (r(2, 4, T, 40), torch.rand(2, 1, T, 40, device="cuda", generator=g) > 0.3, 0.125)),
                  ("silu_mul", layers.silu_mul, (r(2, T, 512),))]
    return cases


def _flat(x):
    return list(x) if isinstance(x, tuple) else [x]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_equal_reference_ops(dtype, monkeypatch):
    from torch._dynamo.utils import counters

    from trtllm_dflash.runtime.models import layers
    monkeypatch.setattr(layers, "_FUSE", True)
    torch._dynamo.reset()   # compile afresh here, so the counter below proves the fused path ran
    before = counters["stats"]["unique_graphs"]
    # relative error over the whole output: a wrong fusion (sign, rotation half, missing norm) is off by O(1);
    # bf16 rounding (2**-8 per rounding, a few roundings per chain) stays well under 1e-2
    bound = 1e-5 if dtype == torch.float32 else 1e-2

    def rel(a, b):
        return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()

    for name, fn, args in _fused_cases(dtype):
        fused = _flat(fn(*args))                                  # inductor kernel on CUDA
        eager = _flat(fn.eager(*args))                            # the same math, one torch op at a time
        ref = _flat(fn.eager(*[a.double().cpu() if isinstance(a, torch.Tensor) and a.is_floating_point() else
                               a.cpu() if isinstance(a, torch.Tensor) else a for a in args]))   # float64 on CPU
        for f, e, x in zip(fused, eager, ref):
            assert f.dtype == e.dtype and f.shape == e.shape, name
            assert rel(f, e) < bound, f"{name} {tuple(f.shape)}: fused vs eager, relative error {rel(f, e):.2e}"
            assert rel(f, x) < bound, f"{name} {tuple(f.shape)}: fused vs float64, relative error {rel(f, x):.2e}"
    assert counters["stats"]["unique_graphs"] > before, "nothing was compiled: the fused path did not run"


@pytest.mark.parametrize("M", [1, 16, 64, 300])
def test_fp8_gemm_matches_a_float64_product(M):
    from trtllm_dflash.runtime import fp8
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability >= 8.9")
    K, N = 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(M)
    w = torch.randn(N, K, device="cuda", generator=g) * 0.02
    w_scale = w.abs().amax(-1) / fp8.FP8_MAX                         # [N] per-row weight scales
    layer = fp8.Fp8Linear(K, N).cuda()
    layer.weight.data = (w / w_scale[:, None]).to(fp8.FP8)
    layer.weight_scale.data = w_scale.float()
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    y = layer(x)                                                      # [M, N] bf16, torch._scaled_mm
    xq, xs = fp8.quantize_rows(x)
    # the product of exactly the quantised operands, in float64: only the GEMM's accumulation and the bf16
    # output rounding separate it from y
    exact = (xq.double() * xs.double()) @ (layer.weight.double() * w_scale.double()[:, None]).T
    torch.testing.assert_close(y.double(), exact, atol=1e-3, rtol=1e-2)
    # and against the unquantised product: within FP8's rounding (e4m3: 3 mantissa bits on both operands)
    full = x.double() @ w.double().T
    rel = ((y.double() - full).norm() / full.norm()).item()
    assert rel < 0.06, rel


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL TP 2 needs 2 GPUs")
def test_tp2_over_nccl_equals_tp1(tiny_qwen3_pair, tmp_path):
    from tests.runtime import tp_run
    target, drafter = tiny_qwen3_pair
    expected = tp_run.run(target, drafter, 1, dtype="float32")
    out = tmp_path / "tp2.json"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "tp_run_cuda.py"), str(target), str(drafter), str(out), "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["dflash"] == expected
