# SPDX-License-Identifier: Apache-2.0
"""The batch-invariant mode (RuntimeConfig.batch_invariant, DESIGN.md decision 10): a row's bits depend on that row
alone, never on how many rows share the launch, where the row sits among them, how many query rows its request
verifies or how long the longest context beside it is.

Per kernel: the GEMM (plain, residual, gate_up + SiLU) over row counts from 1 to prefill's hundreds, attention
over query blocks, batches, KV lengths and both ways of running its key chunks (one program, or one per chunk),
the row-wise norm, and the sampling kernels (argmax ties to the lowest id, per-request seeds) over batches and
split plans. On a GPU (``pytest -m gpu`` or plainly on the GPU host) in bfloat16 too, with rows anywhere.
On the CPU, in Triton's interpreter (float32 and float16: the interpreter has no bfloat16 tl.dot), whose tl.dot
is numpy's BLAS matmul: there a row's result depends on its place in the tile (the BLAS's register micro-tiles;
an MMA computes every element of a tile alike), so rows keep their place in their tile (offsets by whole tiles,
a request's block starting at its first row) while the row counts, batches and key ranges change around them.
The torch path on the CPU in bfloat16 (the embedded default): the matmul properties it rests on.
Engines: tests/runtime/test_bit_exact_engine.py.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.runtime.compare import attend_f64, compile_for_h100, random_cache, rel
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models import layers as L

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}   # vs float64 (test_gemm_kernels' reasons)


def kernels(name):
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    import importlib
    return importlib.import_module(f"trtllm_dflash.runtime.kernels.{name}")


def _rows_alone_and_among(f, x, counts=(1, 3, 17, 64, 65, 130), align=1, tol=None):
    """f(x[a:a + m]) for m rows at offsets a (0, the last m rows, rounded down to ``align``) == the rows of f(x):
    bits, not tolerance, unless ``tol`` (the GEMM in the interpreter, whose bits follow the tile)."""
    full = f(x)
    for m in counts:
        for a in {0, (x.shape[0] - m) // align * align}:
            got = f(x[a:a + m])
            if tol is not None:
                assert rel(got, full[a:a + m]) < tol, f"{m} rows at offset {a}"
                continue
            assert torch.equal(got, full[a:a + m]), f"{m} rows at offset {a}: max diff {(got - full[a:a + m]).abs().max()}"
    return full


# ---- GEMM ------------------------------------------------------------------------------------------------

def _gemm_tol(dtype):
    """None (bits) on the GPU, where no tl.dot tile changes a row's bits (kernels/gemm.py); in the interpreter the
    tile does (numpy's BLAS), and the row counts below get different tiles: a tolerance there."""
    return None if DEVICE == "cuda" else TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_rows_do_not_depend_on_the_row_count(dtype):
    """An AR step's row, a verify block's row and a prefill chunk's row project to the same bits on the GPU: the row
    counts span the decode tiles (pick_config's, which change at 17 and 33 rows) and the compute tile (130 and 131
    rows, above INVARIANT_DECODE_ROWS)."""
    G = kernels("gemm")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(131, 96, generator=g).to(DEVICE, dtype)
    w = (torch.randn(80, 96, generator=g) / 10).to(DEVICE, dtype)
    b = torch.randn(80, generator=g).to(DEVICE, dtype)
    tol = _gemm_tol(dtype)
    full = _rows_alone_and_among(lambda x: G.linear(x, w, b, invariant=True), x, tol=tol)
    assert rel(full, F.linear(x.double(), w.double(), b.double())) < TOL[dtype]
    _rows_alone_and_among(lambda x: G.gate_up_silu(x, w, invariant=True), x, tol=tol)
    # x and its residual row side by side: slices keep them paired
    xr = torch.cat([x, torch.randn(131, 80, generator=g).to(DEVICE, dtype)], 1)
    _rows_alone_and_among(lambda xr: G.linear(xr[:, :96].contiguous(), w, None, xr[:, 96:].contiguous(),
                                              invariant=True), xr, tol=tol)


# (name, hidden, intermediate, vocab, q heads x head_dim, kv heads x head_dim) of the public configs
MODEL_SHAPES = [("smollm2-135m", 576, 1536, 49152, 9 * 64, 3 * 64),
                ("qwen3-8b", 4096, 12288, 151936, 32 * 128, 8 * 128),
                ("llama-3.1-8b", 4096, 14336, 128256, 32 * 128, 8 * 128)]


def _model_gemms():
    """(model, N, K, gated) of a decoder layer's GEMMs and its lm_head."""
    for name, hidden, inter, vocab, q, kv in MODEL_SHAPES:
        for N, K, gated in ((q + 2 * kv, hidden, False), (hidden, q, False), (inter, hidden, True),
                            (hidden, inter, False), (vocab, hidden, False)):
            yield name, N, K, gated


@pytest.mark.parametrize("elem", [2, 4])
def test_invariant_tile_is_the_decode_tile_then_the_compute_tile(elem):
    """The rule the GPU fact allows (tests/gpu/test_gemm_tile_bits_cuda.py: no tl.dot tile changes a row's bits):
    always tl.dot (BLOCK_M >= 16, never the FMA path) and one program per output tile (no split-K to order); up to
    INVARIANT_DECODE_ROWS rows pick_config's decode tile, above it the compute tile (128 rows on 8 warps, BLOCK_K
    64, 128 columns where the programs still cover the SMs, else 64, within SMEM_BUDGET); every tile launchable
    (check_config) at the real shapes, gated and not, in bf16 and float32."""
    from trtllm_dflash.runtime.kernels import GATED_GEMM_MAX_ROWS
    G = kernels("gemm")
    for sms in (132, 4):
        for model, N, K, gated in _model_gemms():
            where = f"{model} N={N} K={K} gated={gated} elem={elem} sms={sms}"
            for M in (1, 2, 16, 17, 64, 65, 128, 129, 256, 300, 1024, 8192):
                c = G.invariant_config(M, N, K, gated, elem, sms)
                G.check_config(c, gated, elem)
                assert c.block_m >= 16, (where, M)
                if M <= G.INVARIANT_DECODE_ROWS:
                    assert c == G.pick_config(M, N, K, gated, elem, sms), (where, M)
                    continue
                assert (c.block_m, c.block_k, c.num_warps) == (128, 64, 8), (where, M)
                assert c.smem(gated, elem) <= G.SMEM_BUDGET, (where, M)
                want = min(128 if -(-M // 128) * -(-N // 128) >= sms else 64, G.pow2(N))
                assert c.block_n == want or (c.block_n < want and G.Config(128, 2 * c.block_n, 64, 8, 2).smem(
                    gated, elem) > G.SMEM_BUDGET), (where, M, c)
    assert G.INVARIANT_DECODE_ROWS == GATED_GEMM_MAX_ROWS
    assert G.invariant_config(1024, 4096, 4096, False, 2, 132) == G.Config(128, 128, 64, 8, 4)   # Qwen3-8B o_proj
    assert G.invariant_config(256, 4096, 4096, False, 2, 132) == G.Config(128, 64, 64, 8, 4)     # 64 programs at 128
    assert G.invariant_config(1024, 12288, 4096, True, 2, 132) == G.Config(128, 128, 64, 8, 3)   # Qwen3-8B gate_up
    assert G.invariant_config(1024, 12288, 4096, True, 4, 132) == G.Config(128, 64, 64, 8, 2)    # float32 gate_up
    assert G.invariant_config(1024, 576, 576, False, 2, 132) == G.Config(128, 64, 64, 8, 4)      # SmolLM2 o_proj


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compute_invariant_tile_computes_the_gemm(dtype):
    """M = 300 > INVARIANT_DECODE_ROWS runs the compute tile (128 rows: two full row tiles and a masked one) against
    float64, with the bias, the residual and the gate_up epilogues; the column count is not a multiple of its
    BLOCK_N and K (96) not of its BLOCK_K (64). A tolerance: the interpreter's bits follow the tile."""
    G = kernels("gemm")
    g = torch.Generator().manual_seed(1)
    M, K, N = 300, 96, 80
    x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    w = (torch.randn(N, K, generator=g) / 10).to(DEVICE, dtype)
    b, r = torch.randn(N, generator=g).to(DEVICE, dtype), torch.randn(M, N, generator=g).to(DEVICE, dtype)
    elem = x.element_size()
    for gated in (False, True):
        cols = N // 2 if gated else N
        c = G.invariant_config(M, cols, K, gated, elem, G.num_sms(x.device))
        assert (c.block_m, c.block_k) == (128, 64) and cols % c.block_n and K % c.block_k, c
    x64, w64 = x.double(), w.double()
    assert rel(G.linear(x, w, b, invariant=True), F.linear(x64, w64, b.double())) < TOL[dtype]
    assert rel(G.linear(x, w, None, r, invariant=True), F.linear(x64, w64) + r.double()) < TOL[dtype]
    y = F.linear(x64, w64)
    assert rel(G.gate_up_silu(x, w, invariant=True), F.silu(y[:, :N // 2]) * y[:, N // 2:]) < TOL[dtype]


def test_routing_takes_every_row_count_in_the_invariant_mode():
    """The Triton GEMM for any rows (cuBLAS picks its tiles by M), the attention kernel for any block (prefill):
    a prompt's cache must not depend on its chunking. A plain "triton" keeps the row limits."""
    from torch import nn
    from trtllm_dflash.runtime.kernels import GEMM_MAX_ROWS, Kernels
    lin = nn.Linear(8, 4, bias=False)
    big = torch.zeros(4 * GEMM_MAX_ROWS, 8)
    assert L.uses_gemm_kernel(Kernels(triton=True, batch_invariant=True), lin, big)
    assert L.uses_gemm_kernel(Kernels(triton=True, batch_invariant=True), lin, big, gated=True)
    assert not L.uses_gemm_kernel(Kernels(triton=True), lin, big)
    assert not L.uses_gemm_kernel(Kernels(batch_invariant=True), lin, big)

    class Attn:
        h, kvh = 8, 2
    a = Attn()
    for kernels_, T, kv_len, runs in ((Kernels(triton=True), 512, 512, False),
                                      (Kernels(triton=True, batch_invariant=True), 512, 512, True),
                                      (Kernels(triton=True, batch_invariant=True), 512, None, False),
                                      (Kernels(batch_invariant=True), 1, 64, False)):
        a.kernels = kernels_
        assert L.uses_attention_kernel(a, T, kv_len) is runs


# ---- attention -------------------------------------------------------------------------------------------

def _attention_case(dtype, d=16, S=700, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hq, Hkv = 4, 2
    cache = random_cache(3, Hkv, S, d, dtype, S, g)
    if DEVICE == "cuda":
        cache.k, cache.v = cache.k.to(DEVICE), cache.v.to(DEVICE)
    q = torch.randn(2, 40, Hq, d, generator=g).to(DEVICE, dtype)
    pos = torch.stack([torch.arange(600, 640), torch.arange(100, 140)]).to(DEVICE)   # [2, 40]: two requests' blocks
    return cache, q, pos, torch.tensor([0, 2], device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_rows_do_not_depend_on_the_block_the_batch_or_the_kv_length(dtype):
    """A query row's output is the same bits when its request verifies 1, 3 or 40 rows (an AR step, a block,
    a prefill chunk), alone or beside a request with a longer context, over any KV length the step was bucketed
    to, with its key chunks in one program or one program each; and it is right (float64 reference). On a GPU
    also as any row of a block (the AR step's row is the block's first; a verify's token can sit anywhere)."""
    K = kernels("decode_attention")
    cache, q, pos, rows = _attention_case(dtype)
    d = q.shape[-1]

    def run(i, t0, T, kv_len, **kw):
        return K.attend(q[i, t0:T][None], cache.k[0], cache.v[0], rows[i:i + 1], kv_len,
                        torch.zeros_like(pos[i:i + 1, t0:T]), pos[i, t0:T][None], d ** -0.5, invariant=True, **kw)

    full = K.attend(q, cache.k[0], cache.v[0], rows, 700, torch.zeros_like(pos), pos, d ** -0.5, invariant=True)
    starts = (0,) if DEVICE == "cpu" else (0, 1, 2)
    for kw in (dict(splits=1), dict(splits=8), dict()):
        for T in (1, 3, 40):
            for t0 in starts:
                for i in (0, 1):
                    for kv_len in (int(pos[i, T - 1]) + 1, 640):
                        if t0 < T:
                            assert torch.equal(run(i, t0, T, kv_len, **kw), full[i:i + 1, t0:T]), (kw, T, t0, i, kv_len)
    k, v = cache.read(0, rows, 700)
    ref = attend_f64(q.cpu(), k.cpu(), v.cpu(), L.KeyRange.causal(pos.cpu()).mask(700), d ** -0.5)
    assert rel(full.cpu(), ref) < TOL[dtype]


def test_attention_with_sinks_and_a_window_is_invariant_and_right():
    """gpt-oss's sliding layers: the window moves the first chunk a tile walks; chunks stay at fixed positions."""
    K = kernels("decode_attention")
    cache, q, pos, rows = _attention_case(torch.float32, seed=1)
    d, window = q.shape[-1], 300
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    keys = L.KeyRange.causal(pos, window)

    def run(sl, T, kv_len, **kw):
        return K.attend(q[sl, :T], cache.k[0], cache.v[0], rows[sl], kv_len, keys.lo[sl, :T], keys.hi[sl, :T],
                        d ** -0.5, sinks=sinks, span=window + T - 1, invariant=True, **kw)

    full = run(slice(0, 2), 40, 700)
    for kw in (dict(splits=1), dict(splits=8)):
        for T in (1, 16):
            assert torch.equal(run(slice(0, 1), T, 640, **kw), full[:1, :T]), (kw, T)
    k, v = cache.read(0, rows, 700)
    ref = attend_f64(q.cpu(), k.cpu(), v.cpu(), keys.mask(700).cpu(), d ** -0.5, sinks.cpu())
    assert rel(full.cpu(), ref) < 1e-5


# ---- norm ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_rows_do_not_depend_on_the_row_count(dtype):
    N = kernels("norm")
    g = torch.Generator().manual_seed(0)
    x, delta = torch.randn(131, 72, generator=g).to(DEVICE, dtype), torch.randn(131, 72, generator=g).to(DEVICE, dtype)
    w = (torch.rand(72, generator=g) + 0.5).to(DEVICE, dtype)
    out = _rows_alone_and_among(lambda x: N.rms_norm(x, w, 1e-6), x)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]   # the mean in another order
    assert rel(out, L.rms_norm.eager(x, w, 1e-6)) < tol
    xd = torch.cat([x, delta], 1)
    both = _rows_alone_and_among(lambda xd: torch.cat(N.rms_norm(xd[:, :72], w, 1e-6, delta=xd[:, 72:]), 1), xd)
    total, normed = L.add_rms_norm.eager(x, delta, w, 1e-6)
    assert torch.equal(both[:, :72], total) and rel(both[:, 72:], normed) < tol


def test_norm_module_switches_to_the_kernel_in_the_invariant_mode(monkeypatch):
    from trtllm_dflash.runtime.kernels import Kernels
    N = kernels("norm")
    calls = []
    monkeypatch.setattr(N, "rms_norm", lambda *a, **kw: calls.append(kw) or (a[0], a[0]))
    x = torch.randn(2, 8)
    for kernels_, used in ((Kernels(), 0), (Kernels(triton=True), 0), (Kernels(triton=True, batch_invariant=True), 2)):
        norm = L.RMSNorm(8, 1e-6, kernels_)
        norm(x), norm(x, x)
        assert len(calls) == used, kernels_
        calls.clear()


# ---- sampling --------------------------------------------------------------------------------------------

def test_sampled_and_greedy_tokens_do_not_depend_on_the_batch_and_ties_go_to_the_lowest_id():
    """The vocab split of the argmax follows the batch (split_plan), the result does not: max is exact, ties go
    to the lowest id, the noise is a function of (seed, position, id)."""
    K = kernels("sample")
    from trtllm_dflash.config import SamplingParams
    from trtllm_dflash.runtime.sampling import SamplingBatch
    g = torch.Generator().manual_seed(0)
    n, T, V = 6, 3, 200
    logits = torch.randn(n, T, V, generator=g).round(decimals=1)   # coarse: many exact ties
    logits[0, 0, 7] = logits[0, 0, 150] = logits[0, 0].max() + 1      # a tie across vocab splits
    pos = torch.arange(n * T).view(n, T) + 40
    logits, pos = logits.to(DEVICE), pos.to(DEVICE)
    params = [SamplingParams(temperature=t, seed=s) for t, s in ((0, 0), (1.0, 5), (0, 0), (0.7, 2**63 + 3),
                                                                (0, 0), (1.3, 11))]

    def tokens(sl, programs):
        sb = SamplingBatch.from_params(params[sl], DEVICE)
        k = len(params[sl])
        t, a = torch.full((k, T), -1, device=DEVICE), torch.full((k,), -1, device=DEVICE)
        K.sample_accept(logits[sl], sb, pos[sl], torch.zeros(k, T - 1, dtype=torch.long, device=DEVICE), t, a,
                        block_v=16, programs=programs)
        return t

    full = tokens(slice(0, n), 1)
    assert full[0, 0] == 7
    for programs in (1, 40, 500):
        for i in range(n):
            assert torch.equal(tokens(slice(i, i + 1), programs), full[i:i + 1]), (i, programs)
        assert torch.equal(tokens(slice(0, n), programs), full)


# ---- the torch path on the CPU (bfloat16) -----------------------------------------------------------------

def test_cpu_bf16_matmuls_give_a_row_the_same_bits_whatever_shares_it():
    """What the CPU's torch path rests on in bfloat16: F.linear's row does not depend on the rows beside it, and
    a product over keys does not depend on masked (zero) keys past it. A CPU whose BLAS breaks this fails here."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 96, generator=g).to(torch.bfloat16)
    x = torch.randn(70, 96, generator=g).to(torch.bfloat16)
    _rows_alone_and_among(lambda x: F.linear(x, w), x, counts=(1, 2, 16, 17, 64))
    p = torch.rand(4, 600, generator=g).to(torch.bfloat16)
    v = torch.randn(600, 64, generator=g).to(torch.bfloat16)
    for S in (40, 64, 257, 600):
        pp = p[:, :S].clone()
        pp[:, 37:] = 0
        assert torch.equal(pp @ v[:S], p[:, :37] @ v[:37]), S


def test_cpu_torch_attention_rows_do_not_depend_on_the_block_or_the_keys():
    """layers.attend with ``invariant``: a prefill chunk's rows (G * T > 16, where SDPA ran) == the same rows
    attended one at a time over a longer, masked key range, in bfloat16."""
    g = torch.Generator().manual_seed(0)
    n, Hq, Hkv, d, T = 1, 4, 2, 16, 24
    cache = KVCache(1, 1, Hkv, 64, d, torch.bfloat16, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    q = torch.randn(n, Hq, T, d, generator=g).to(torch.bfloat16)
    pos = torch.arange(T)[None]

    def run(qq, pp, kv_len):
        k, v = cache.read(0, slice(0, 1), kv_len)
        mask = L.group_mask(L.KeyRange.causal(pp).mask(kv_len), Hq // Hkv)
        return L.attend(qq, k, v, mask, d ** -0.5, invariant=True)

    full = run(q, pos, T)
    for t in (0, 5, 23):
        for kv_len in (t + 1, 64):
            assert torch.equal(run(q[:, :, t:t + 1], pos[:, t:t + 1], kv_len), full[:, t:t + 1]), (t, kv_len)



def test_cpu_torch_attention_row_alone_equals_it_in_a_batch():
    """layers.attend with ``invariant``: a decode row alone == the same row among two other requests' rows. The
    tensors are the layer-1 attention of test_bit_exact_engine's request 5 at its fourth token (tiny Llama pair,
    bfloat16), where a request alone and among others first parted on an AVX512-BF16 CPU: there the bfloat16 batched
    matmul of 6 matrices summed the row's probabilities x values in another order than that of 2, and one output
    fell on the other side of a bfloat16 rounding edge. Random data rarely sits that close to an edge."""
    from safetensors import safe_open
    with safe_open(str(Path(__file__).parent / "data" / "attend_rows_at_a_rounding_edge.safetensors"), "pt") as f:
        t = {name: f.get_tensor(name) for name in f.keys()}
        scale, r = float(f.metadata()["scale"]), int(f.metadata()["row"])
    q, k, v, visible = t["q"], t["k"], t["v"], t["visible"].bool()   # [3, 4, 1, 16], [3, 2, 28, 16] x 2, [3, 1, 2, 28]
    together = L.attend(q, k, v, visible, scale, invariant=True)
    alone = L.attend(q[r:r + 1], k[r:r + 1], v[r:r + 1], visible[r:r + 1], scale, invariant=True)
    assert torch.equal(alone[0], together[r])
    for other in range(3):   # and every row of the batch against itself alone
        assert torch.equal(L.attend(q[other:other + 1], k[other:other + 1], v[other:other + 1], visible[other:other + 1],
                                    scale, invariant=True)[0], together[other])

# ---- compiled for the H100 ---------------------------------------------------------------------------------

INVARIANT_SM90 = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trtllm_dflash.runtime.kernels import decode_attention as A, gemm as G, norm as N
target = GPUTarget("cuda", 90, 32)
k = A._attend_kernel
types = {"q_ptr": "*bf16", "ck_ptr": "*bf16", "cv_ptr": "*bf16", "row_ptr": "*i64", "lo_ptr": "*i64", "hi_ptr": "*i64",
         "sink_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "ml_ptr": "*fp32", "cnt_ptr": "*i32",
         "scale_log2": "fp32"}
# (G, head_dim, BLOCK_N, splits, sinks, warps): SmolLM2, Qwen3-8B, gpt-oss; chunks in one program or one each
for G_, D, BN, splits, sink, warps in [(3, 64, 64, 1, False, 4), (3, 64, 64, 4, False, 4), (4, 128, 32, 1, False, 8),
                                       (4, 128, 32, 8, False, 8), (8, 64, 64, 2, True, 4)]:
    consts = dict(G=G_, D=D, BLOCK_M=A.INVARIANT_BLOCK_M, BLOCK_N=BN, SPLITS=splits, IEEE=False, SINK=sink,
                  INVARIANT=True, KEY_CHUNK=A.KEY_CHUNK)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if sig[n].startswith("*")}
    triton.compile(ASTSource(k, sig, consts, attrs), target=target, options={"num_warps": warps})
k = N._rms_norm_kernel
for H, add in ((576, False), (576, True), (4096, True), (5120, False)):
    consts = dict(BLOCK=1 << (H - 1).bit_length(), ADD=add)
    sig = {n: "constexpr" if n in consts else {"x_ptr": "*bf16", "d_ptr": "*bf16", "w_ptr": "*bf16", "sum_ptr": "*bf16",
                                              "out_ptr": "*bf16", "eps": "fp32"}.get(n, "i32") for n in k.arg_names}
    triton.compile(ASTSource(k, sig, consts), target=target, options={"num_warps": N._warps(H)})
k = G._gemm_kernel
GEMMS = ((576, 576, False), (1536, 576, True), (6144, 4096, False), (12288, 4096, True), (151936, 4096, False))
cfgs = {(G.invariant_config(m, *shape, 2, 132), *shape) for shape in GEMMS for m in (1, 64, 1024)}   # decode, compute
for cfg, N_, K_, gated in sorted(cfgs, key=str):
    consts = G.constexprs(cfg, N_, K_, gated, False, not gated, __import__("torch").bfloat16)
    sig = {n: "constexpr" if n in consts else {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "r_ptr": "*bf16",
                                              "out_ptr": "*bf16"}.get(n, "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if sig[n].startswith("*")}
    triton.compile(ASTSource(k, sig, consts, attrs), target=target,
                   options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
'''


def test_invariant_kernels_compile_for_the_h100():
    """The batch-invariant launches (attention's chunk loop and merge, the norm, the GEMM's decode and compute tiles
    at the real shapes) compiled to sm_90 cubins: the interpreter accepts code the compiler refuses."""
    kernels("gemm")
    compile_for_h100(INVARIANT_SM90)
