# SPDX-License-Identifier: Apache-2.0
"""The decode-path Triton GEMMs (runtime/kernels/gemm.py) on the CPU, in Triton's interpreter: each against the
path it replaces (F.linear + the torch epilogue) and a float64 reference, in both inner products (tl.dot tiles
and the block_m = 1 FMA path), ragged and even tiles; the routing rule (FP8 modules, row limit, tp > 1: the
residual joins after the all-reduce); and a tiny target/drafter pair whose greedy and sampled tokens are the
same with the kernels as without.

Tiny shapes (the interpreter runs each program in numpy); float32 and float16 only (the interpreter has no
bfloat16; tests/gpu/test_gemm_cuda.py covers bf16 at the real shapes). Tolerances, relative norm error:
float32 1e-5 (float32 accumulation in another order over K <= 96 is ~1e-7; an indexing mistake is O(1));
float16 2e-3 against float64 (exact fp16 inputs, float32 accumulation, one rounding of the output: 2^-11
relative) and 3e-3 against the torch path, which rounds the GEMM output, the SiLU and the product (or the
residual sum) separately. Skipped only where triton is not installed (scripts/setup_env.sh installs it for CI).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.runtime.compare import compile_for_h100, default_subset, rel
from tests.runtime.kernel_engine import GREEDY_AND_SAMPLED, TWO_PROMPTS, count_calls, same_generation
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.models import layers as L

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 3e-3)}   # (vs float64, vs the torch path)


def kernels():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.runtime.kernels import gemm
    return gemm


def operands(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    return x, w, torch.randn(N, generator=g).to(dtype), torch.randn(M, N, generator=g).to(dtype)


def configs(G):
    # default pick; FMA with ragged N and K tiles (and a narrow one); tl.dot with M over several row tiles
    return [None, G.Config(1, 16, 16), G.Config(1, 4, 32), G.Config(16, 32, 32, num_stages=2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,N,K", default_subset([(1, 48, 64), (5, 40, 24), (19, 32, 96)], keep=(0, 2)))
@pytest.mark.parametrize("bias,residual", [(False, False), (False, True), (True, True)])
def test_linear_equals_f_linear_and_float64(dtype, M, N, K, bias, residual):
    G = kernels()
    x, w, b, r = operands(M, N, K, dtype)
    b, r = (b if bias else None), (r if residual else None)
    want64 = x.double() @ w.double().T + (b.double() if bias else 0) + (r.double() if residual else 0)
    want = F.linear(x, w, b) + (r if residual else 0)
    tol64, tol = TOL[dtype]
    for cfg in configs(G):
        got = G.linear(x[None], w, b, r[None] if residual else None, cfg)[0]   # leading dims kept
        assert got.shape == (M, N) and got.dtype == dtype
        assert rel(got, want64) < tol64, cfg
        assert rel(got, want) < tol, cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,I,K", default_subset([(1, 48, 64), (5, 24, 40), (19, 32, 32)], keep=(0, 2)))
def test_gate_up_silu_equals_silu_mul_and_float64(dtype, M, I, K):
    G = kernels()
    x, w, _, _ = operands(M, 2 * I, K, dtype)
    y = x.double() @ w.double().T
    want64 = F.silu(y[:, :I]) * y[:, I:]
    want = L.silu_mul.eager(F.linear(x, w))
    tol64, tol = TOL[dtype]
    for cfg in configs(G):
        got = G.gate_up_silu(x, w, cfg)
        assert got.shape == (M, I) and got.dtype == dtype
        assert rel(got, want64) < tol64, cfg
        assert rel(got, want) < tol, cfg


def test_rows_do_not_depend_on_the_batch_up_to_16():
    G = kernels()
    x, w, _, r = operands(16, 32, 64, torch.float32)
    for m in (1, 5):
        assert torch.equal(G.linear(x[:m], w, None, r[:m]), G.linear(x, w, None, r)[:m])
        assert torch.equal(G.gate_up_silu(x[:m], w), G.gate_up_silu(x, w)[:m])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("dot", [True, False])
def test_split_k_equals_one_slice_and_float64(dtype, split, dot):
    """K split over 2 or 4 programs per tile (K = 200: the last slice partial, with 4 slices of 2 steps over 7 steps
    the fourth holds one masked step): the same result as no split within the accumulation order, against float64
    with bias and residual; the tile counters are back at 0 and a second call gives the same bits."""
    from trtllm_dflash.runtime.kernels.arrival import tile_counters
    G = kernels()
    M, N, K = 3, 40, 200
    cfg = G.Config(16, 16, 32, num_stages=2) if dot else G.Config(1, 16, 32)
    x, w, b, r = operands(M, N, K, dtype, seed=split)
    got = G.linear(x, w, b, r, cfg=cfg, split=split)
    want = x.double() @ w.double().T + b.double() + r.double()
    assert rel(got, want) < TOL[dtype][0]
    assert rel(got, G.linear(x, w, b, r, cfg=cfg, split=1)) < TOL[dtype][0]
    assert not tile_counters(x.device, 1)[:64].any()
    assert torch.equal(G.linear(x, w, b, r, cfg=cfg, split=split), got)


def test_split_for_rule():
    """K is split where a plain projection's tiles leave SMs short of programs, never in the batch-invariant mode or
    for the gated GEMM: gpt-oss-120b at one row on 132 SMs (o_proj 180 programs -> 4 slices, qkv 320 -> 2, the
    lm_head none), SmolLM2's K = 576 none (too few steps to share)."""
    G = kernels()
    def split(M, N, K, gated=False):
        return G.split_for(G.pick_config(M, N, K, gated, 2, 132), M, N, K, 132)
    assert (split(1, 2880, 4096), split(1, 5120, 2880), split(1, 201088, 2880)) == (4, 2, 1)
    assert split(1, 576, 576) == 1
    x, w, _, _ = operands(2, 16, 64, torch.float32)
    with pytest.raises(ValueError, match="split-K is for plain projections"):
        G.linear(x, w, split=2, invariant=True)


def test_plain_config_rule():
    """The default launch of a plain projection up to 16 rows: 64-column, BLOCK_K 128 tiles split 4 ways where that
    keeps pick_config's programs in flight (gpt-oss-120b's qkv_proj, o_proj, down_proj; Qwen3-8B's), pick_config's
    tile unsplit where it would not (SmolLM2's down_proj: 9 tiles x 2 < 36), where K is too short to share (SmolLM2's
    576) or N already fills the GPU (lm_head), and above 16 rows; the same launch for every M <= 16."""
    G = kernels()
    split_tile = G.Config(16, 64, 128, 4, 4)
    for N, K in ((5120, 2880), (2880, 4096), (2880, 2880), (6144, 4096), (4096, 12288)):
        for M in (1, 10, 16):
            assert G.plain_config(M, N, K, 2, 132) == (split_tile, 4), (M, N, K)
    for M, N, K in ((1, 576, 1536), (1, 960, 576), (1, 201088, 2880), (1, 49152, 576), (64, 2880, 4096)):
        assert G.plain_config(M, N, K, 2, 132) == (G.pick_config(M, N, K, False, 2, 132), 1), (M, N, K)


def test_pick_config_decode_rule():
    """Up to 16 rows at K >= 2048: gate_up + SiLU and the lm_heads on 32-column BLOCK_K 128 tiles, the other plain
    projections (the batch-invariant mode's tile) on 16-column BLOCK_K 256 ones; SmolLM2's K = 576 by the general
    rule; above 16 rows BLOCK_K 128 (H200 timings: the docstring)."""
    G = kernels()
    pick = lambda M, N, K, gated: G.pick_config(M, N, K, gated, 2, 132)  # noqa: E731
    for M in (1, 10, 16):
        for N, K in ((2880, 2880), (3840, 2880), (12288, 4096), (14336, 4096)):   # gpt-oss, its drafter, Qwen3, Llama
            assert pick(M, N, K, True) == G.Config(16, 32, 128, 4, 4), (M, N, K)
        for N, K in ((201088, 2880), (151936, 4096)):                         # lm_heads
            assert pick(M, N, K, False) == G.Config(16, 32, 128, 4, 4), (M, N, K)
        for N, K in ((5120, 2880), (2880, 4096), (4096, 4096), (4096, 12288)):  # qkv, o, down
            assert pick(M, N, K, False) == G.Config(16, 16, 256, 4, 4), (M, N, K)
    assert pick(1, 1536, 576, True) == G.Config(16, 16, 128, 4, 4)           # SmolLM2 gate_up
    assert pick(1, 49152, 576, False) == G.Config(16, 64, 128, 4, 4)         # SmolLM2 lm_head
    assert pick(64, 12288, 4096, True).block_k == 128
    assert pick(1, 2880, 2880, True).smem(True, 4) <= G.MAX_SMEM             # float32 still fits


def test_the_default_launch_takes_the_split():
    """linear() with no cfg runs plain_config's tile and split: the same bits as asking for them, and within the
    accumulation order of one slice (K = 1,024 over BLOCK_K 128 with the interpreter's 4 SMs: 8 steps, 2 slices)."""
    G = kernels()
    x, w, _, r = operands(3, 256, 1024, torch.float32)
    cfg, split = G.plain_config(3, 256, 1024, 4, G.num_sms(x.device))
    assert split > 1
    got = G.linear(x, w, None, r)
    assert torch.equal(got, G.linear(x, w, None, r, cfg=cfg, split=split))
    assert rel(got, G.linear(x, w, None, r, cfg=cfg, split=1)) < TOL[torch.float32][0]


def test_strided_rows_and_errors():
    """x rows with a stride (a view of a wider tensor) are read in place; unsupported inputs are clear errors."""
    G = kernels()
    x, w, _, _ = operands(3, 16, 32, torch.float32)
    wide = torch.cat([x, torch.ones(3, 8)], 1)[:, :32]           # [3, 32], row stride 40
    assert rel(G.linear(wide, w), x @ w.T) < 1e-5
    with pytest.raises(ValueError, match="share K"):
        G.linear(x[:, :16], w)
    with pytest.raises(ValueError, match="residual"):
        G.linear(x, w, residual=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="even number of rows"):
        G.gate_up_silu(x, w[:15])
    with pytest.raises(ValueError, match=">= 16"):
        G.linear(x, w, cfg=G.Config(8, 16, 16))
    with pytest.raises(ValueError, match=">= 16"):
        G.linear(x, w, cfg=G.Config(16, 8, 16))
    with pytest.raises(ValueError, match="powers of two"):
        G.linear(x, w, cfg=G.Config(1, 12, 16))
    assert G.linear(x[:0], w).shape == (0, 16)


@pytest.mark.parametrize("M", [1, 16, 64, 128])
@pytest.mark.parametrize("N,K,gated", [(576, 576, False), (1536, 576, True), (576, 1536, False),
                                       (4096, 4096, False), (12288, 4096, True), (4096, 12288, False),
                                       (14336, 4096, True), (4096, 14336, False)])
def test_pick_config_is_valid_at_the_real_shapes(M, N, K, gated):
    """SmolLM2 / Qwen3-8B / Llama-3.1-8B shapes on an H100 (132 SMs): power-of-two tiles tl.dot accepts, within
    shared memory, and at the 8B shapes enough programs to cover the SMs at M = 1."""
    G = kernels()
    cfg = G.pick_config(M, N, K, gated, 2, 132)
    G.check_config(cfg, gated, 2)
    assert cfg.smem(gated, 2) <= G.SMEM_BUDGET
    programs = -(-N // cfg.block_n) * -(-M // cfg.block_m)
    if N >= 4096:
        assert programs >= 132, (cfg, programs)


def test_kernels_compile_for_the_h100(tmp_path):
    """Triton's compiler and ptxas (no GPU needed) build every config gemm_bench tries, the default launch's (the
    split tile at one row), pick_config's and the batch-invariant mode's (its compute tile above 128 rows), at Qwen3-8B shapes for sm_90, within the H100's shared
    memory and without register spills."""
    kernels()
    import json
    out = tmp_path / "cc.json"
    compile_for_h100(["-m", "trtllm_dflash.bench.gemm", "--compile_only", "90", "--models", "qwen3-8b", "--M", "1,64,256",
                      "--out", str(out)],
                     timeout=600)
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) >= 4 * 2 * 4 and all(r["stack"] == 0 for r in rows)
    assert all(r["pipelined"] for r in rows if r["default"])   # the default tiles stream weights through cp.async
    # the invariant mode's tiles: pick_config's (unsplit) up to 128 rows, then the compute tile on wgmma
    assert all(r["pick"] for r in rows if r["invariant"] and r["M"] <= 64)
    assert any(r["default"] and r["split"] == 4 and r["config"] == "m16n64k128w4s4" for r in rows if r["M"] == 1)
    compute = [r for r in rows if r["invariant"] and r["M"] == 256]
    assert compute and all(r["config"].startswith("m128") and r["pipelined"] and r["wgmma"] for r in compute), compute


def test_routing_rule():
    from trtllm_dflash.runtime.fp8 import Fp8Linear
    from trtllm_dflash.runtime.kernels import GATED_GEMM_MAX_ROWS, GEMM_MAX_ROWS, TORCH, Kernels
    triton = Kernels(triton=True)
    lin = nn.Linear(8, 4, bias=False)
    x = torch.zeros(2, 3, 8)
    assert L.uses_gemm_kernel(triton, lin, x)
    assert not L.uses_gemm_kernel(TORCH, lin, x)
    assert not L.uses_gemm_kernel(triton, Fp8Linear(8, 4), x)   # FP8 weights keep torch._scaled_mm
    assert not L.uses_gemm_kernel(triton, nn.Linear(8, 4, dtype=torch.float64), x.double())   # no fp64 tl.dot
    assert L.uses_gemm_kernel(triton, lin, torch.zeros(GEMM_MAX_ROWS, 8))
    assert not L.uses_gemm_kernel(triton, lin, torch.zeros(1, GEMM_MAX_ROWS + 1, 8))
    assert GATED_GEMM_MAX_ROWS > GEMM_MAX_ROWS   # gate_up + SiLU stays on Triton where the plain ones leave it
    assert L.uses_gemm_kernel(triton, lin, torch.zeros(GATED_GEMM_MAX_ROWS, 8), gated=True)
    assert not L.uses_gemm_kernel(triton, lin, torch.zeros(GATED_GEMM_MAX_ROWS + 1, 8), gated=True)


class _TwoEqualRanks(TPGroup):
    """tp = 2 where both ranks hold the same shard: the all-reduce doubles (in place, as dist.all_reduce).
    A residual added before the all-reduce would be doubled too, so the test below can tell."""

    def __init__(self):
        super().__init__(0, 2)

    def all_reduce(self, x):
        return x.mul_(2)


def _tiny_target(tp, kernels_):
    from trtllm_dflash.model_config import LlamaConfig
    from trtllm_dflash.runtime.models.llama import LlamaTarget
    c = LlamaConfig(architecture="Qwen3ForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=96, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                    rope={"rope_theta": 10000.0, "rope_type": "default"}, max_position_embeddings=64,
                    tie_word_embeddings=False, attention_bias=False, qk_norm=True)
    torch.manual_seed(0)
    model = LlamaTarget(c, tp, 64, capture_layers=(0, 1), kernels=kernels_)
    for p in model.parameters():
        if p.dim() == 1:   # norm weights away from 1, so a mixed-up norm shows
            p.data.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tp", [TPGroup(), _TwoEqualRanks()], ids=["tp1", "tp2"])
def test_target_layers_with_the_gemm_kernels(tp, monkeypatch):
    """Prefill then a decode step of 3 tokens through the target (float32): hidden states and the feature taps
    with the kernels == the torch path. What the decode step runs: at tp 1 o_proj and down add the residual in
    their epilogue and every norm is a plain RMSNorm (8 kernels per layer, no cuBLAS, no silu_mul); at tp 2 the
    residual must join after the all-reduce, in the add + norm."""
    G = kernels()
    from trtllm_dflash.runtime.kv_cache import KVCache
    from trtllm_dflash.runtime.kernels import Kernels
    calls = {}
    count_calls(monkeypatch, G, ["linear"], calls,
           lambda name, args, kw: "gemm+residual" if (args[3:4] or [kw.get("residual")])[0] is not None else "gemm")
    count_calls(monkeypatch, G, ["gate_up_silu"], calls)
    count_calls(monkeypatch, L, ["silu_mul", "rms_norm", "add_rms_norm"], calls)
    count_calls(monkeypatch, F, ["linear"], calls, lambda name, args, kw: "F.linear")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    out = {}
    for kernel in ("torch", "triton"):
        model = _tiny_target(tp, Kernels.choose(kernel, False, "cpu", torch.float32))   # seeded: the same weights
        n_layers, kvh, d = model.kv_shape()
        cache = KVCache(n_layers, 2, kvh, 64, d, torch.float32, "cpu")
        model(ids[:, :9], torch.arange(9).expand(2, 9), cache, slice(0, 2), None)
        calls.clear()
        out[kernel] = model(ids[:, 9:], torch.arange(9, 12).expand(2, 3), cache, slice(0, 2), 12)
    assert rel(out["triton"][0], out["torch"][0]) < 1e-5 and rel(out["triton"][1], out["torch"][1]) < 1e-5
    n = n_layers   # the triton decode step's calls
    if tp.size == 1:   # qkv plain; o_proj and down with the residual; norms: the first input norm + 2 per layer
        assert calls == {"gemm": n, "gemm+residual": 2 * n, "gate_up_silu": n, "rms_norm": 1 + 2 * n}
    else:              # qkv, o_proj and down plain, then all-reduce, then add + norm
        assert calls == {"gemm": 3 * n, "gate_up_silu": n, "rms_norm": 1, "add_rms_norm": 2 * n}


@pytest.mark.exhaustive   # ~70 s: test_decode_attention's engine test runs the same kernels (GEMMs included)
def test_engine_tokens_are_the_same_with_the_gemm_kernels(tiny_qwen3_pair, monkeypatch):
    """Greedy and sampled DFlash generation of a tiny Qwen3 pair with the decode path in the Triton kernels
    (GEMMs included, target and drafter) == the torch path, float32."""
    calls = count_calls(monkeypatch, kernels(), ["linear", "gate_up_silu"], {})
    same_generation(*tiny_qwen3_pair, dict(max_seq_len=64, max_batch_size=2), TWO_PROMPTS, GREEDY_AND_SAMPLED)
    assert calls["linear"] > 0 and calls["gate_up_silu"] > 0, calls
