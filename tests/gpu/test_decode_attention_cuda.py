# SPDX-License-Identifier: Apache-2.0
"""The Triton decode-path kernels (runtime/kernels/decode_attention.py) on the GPU in bf16 at real shapes
(SmolLM2-135M target and its drafter: 9 q / 3 kv heads of 64; Qwen3-8B: 32 / 8 of 128 with q/k norm), against
the torch path they replace and a float64 reference; CUDA-graph capture; a tiny pair's tokens with the kernels.

Tolerances (relative, norm-wise). RoPE + cache write: the kernel computes in float32 and rounds once to bf16
(2^-9 relative per element), so 4e-3 against float64; the torch path also rounds the norm, cos/sin and each
product to bf16, so 1.5e-2 between the two. Attention: the kernel rounds the probabilities to bf16 before P @ V
(as SDPA and the torch matmul path do) and the output once: 1e-2 against float64 and 2e-2 against the torch path.
A wrong row, head, position or mask gives O(1) errors.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.compare import attend_f64, rel, rope_f64
from tests.runtime.kernel_engine import engine_with_kernel
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models import layers as L

pytestmark = pytest.mark.gpu
DEV, BF16 = torch.device("cuda"), torch.bfloat16
# (name, q heads, kv heads, head_dim, q/k norm)
SHAPES = [("smollm2-135m", 9, 3, 64, False), ("qwen3-8b", 32, 8, 128, True)]


def kernels():
    from trtllm_dflash.runtime.kernels import decode_attention
    return decode_attention


@pytest.mark.parametrize("name,Hq,Hkv,d,norm", SHAPES)
@pytest.mark.parametrize("n,T", [(1, 1), (1, 16), (8, 16), (2, 300)])
def test_rope_cache_write_bf16(name, Hq, Hkv, d, norm, n, T):
    S, eps = 1024, 1e-6
    g = torch.Generator(DEV).manual_seed(0)
    qkv = torch.randn(n, T, Hq + 2 * Hkv, d, device=DEV, generator=g).to(BF16)
    q, k, v = qkv.split([Hq, Hkv, Hkv], dim=2)
    qw, kw = ((torch.rand(2, d, device=DEV, generator=g) + 0.5).to(BF16) if norm else (None, None))
    pos = torch.randint(0, S - T, (n, 1), device=DEV, generator=g) + torch.arange(T, device=DEV)
    rot = L.Rotary({"rope_theta": 1e6, "rope_type": "default"}, d, S, S).to(DEV)
    cos, sin = rot.tables(pos, BF16)
    rows = torch.randperm(8, device=DEV)[:n] if n <= 8 else torch.arange(n, device=DEV)
    ref_cache, cache = (KVCache(2, max(8, n), Hkv, S, d, BF16, DEV) for _ in range(2))
    q_ref, k_ref = L.rope_cache_write(q, k, v, cos, sin, qw, kw, eps, ref_cache, 1, rows, pos)
    q_out, k_out = L.rope_cache_write(q, k, v, cos, sin, qw, kw, eps, cache, 1, rows, pos, Kernels(triton=True))
    torch.cuda.synchronize()
    assert cache.v.equal(ref_cache.v)
    assert rel(q_out, rope_f64(q, cos, sin, qw, eps)) < 4e-3 and rel(k_out, rope_f64(k, cos, sin, kw, eps)) < 4e-3
    assert rel(q_out, q_ref) < 1.5e-2 and rel(cache.k, ref_cache.k) < 1.5e-2
    assert cache.k[1][rows[:, None], :, pos].equal(k_out)


@pytest.mark.parametrize("name,Hq,Hkv,d,norm", SHAPES)
@pytest.mark.parametrize("n,T,ctx,kv_len", [(1, 1, 512, 1024), (1, 16, 512, 1024), (4, 16, 3000, 4096),
                                            (16, 1, 100, 256)])
def test_attend_bf16(name, Hq, Hkv, d, norm, n, T, ctx, kv_len):
    g = torch.Generator(DEV).manual_seed(1)
    cache = KVCache(1, n, Hkv, kv_len, d, BF16, DEV)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    q = torch.randn(n, T, Hq, d, device=DEV, generator=g).to(BF16)
    start = torch.randint(ctx // 2, ctx, (n,), device=DEV, generator=g)
    pos = start[:, None] + torch.arange(T, device=DEV)
    keys = L.KeyRange(torch.zeros_like(pos), pos)          # the target's causal rule
    rows = slice(0, n)
    k, v = cache.read(0, rows, kv_len)
    visible = keys.mask(kv_len)
    want = attend_f64(q, k, v, visible, d ** -0.5)
    ref = L.attend(q.transpose(1, 2), k, v, L.group_mask(visible, Hq // Hkv), d ** -0.5)
    out = L.attend_cache(q, cache, 0, rows, kv_len, keys, d ** -0.5)
    assert rel(out, want) < 1e-2 and rel(out, ref) < 2e-2
    drafter_keys = L.KeyRange(torch.zeros_like(pos), (start[:, None] + T - 1).expand_as(pos))   # non-causal block
    want = attend_f64(q, k, v, drafter_keys.mask(kv_len), d ** -0.5)
    assert rel(L.attend_cache(q, cache, 0, rows, kv_len, drafter_keys, d ** -0.5), want) < 1e-2


def test_kernels_replay_in_a_cuda_graph():
    """Fixed buffers, captured once; replays after the inputs change in place equal eager calls."""
    n, T, Hq, Hkv, d, S = 2, 16, 32, 8, 128, 1024
    cache = KVCache(1, n, Hkv, S, d, BF16, DEV)
    qkv = torch.randn(n, T, Hq + 2 * Hkv, d, device=DEV, dtype=BF16)
    pos = torch.tensor([[300], [700]], device=DEV) + torch.arange(T, device=DEV)
    w = torch.ones(d, device=DEV, dtype=BF16)
    rot = L.Rotary({"rope_theta": 1e6, "rope_type": "default"}, d, S, S).to(DEV)

    def step():
        q, k, v = qkv.split([Hq, Hkv, Hkv], dim=2)
        cos, sin = rot.tables(pos, BF16)
        q, _ = L.rope_cache_write(q, k, v, cos, sin, w, w, 1e-6, cache, 0, slice(0, n), pos, Kernels(triton=True),
                                  want_k=False)
        return L.attend_cache(q, cache, 0, slice(0, n), S, L.KeyRange(torch.zeros_like(pos), pos), d ** -0.5)

    graph, out = capture(step, warmups=1)
    for shift in (1, 5):
        qkv.normal_()
        pos += shift
        graph.replay()
        torch.cuda.synchronize()
        assert out.equal(step())


def engine(pair, block, kernel, dtype="float32"):
    return engine_with_kernel(pair[0], pair[1] if block != 1 else None,
                              RuntimeConfig(max_seq_len=256, max_batch_size=4, block_size=block, dtype=dtype,
                                            device="cuda", kernels=kernel))


@pytest.mark.parametrize("pair_name", ["tiny_pair", "tiny_qwen3_pair"])
def test_tiny_pair_tokens_with_the_kernels(request, pair_name):
    """float32, CUDA graphs on: greedy DFlash == AR with the kernels, and both == the torch path's tokens."""
    pair = request.getfixturevalue(pair_name)
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, 90, (k,), generator=g).tolist() for k in (3, 17, 1, 40, 9, 25)]
    sp = SamplingParams(max_new_tokens=48, ignore_eos=True)
    ar, df = engine(pair, 1, "triton").generate(ps, sp), engine(pair, None, "triton").generate(ps, sp)
    ref = engine(pair, None, "torch").generate(ps, sp)
    for a, d, r in zip(ar, df, ref):
        assert d.output_ids == a.output_ids == r.output_ids


def test_engine_graphs_run_the_kernels(tiny_qwen3_pair):
    """The kernels are in the engine's captured graphs (set before capture), not only in eager calls."""
    from trtllm_dflash.runtime.kernels import decode_attention as K
    calls = {"attend": 0, "rope_cache_write": 0}
    saved = {name: getattr(K, name) for name in calls}

    def counted(name):
        def run(*args, **kw):
            calls[name] += 1
            return saved[name](*args, **kw)
        return run
    try:
        for name in calls:
            setattr(K, name, counted(name))
        engine(tiny_qwen3_pair, None, "triton")   # captures its graphs at start-up
    finally:
        for name, f in saved.items():
            setattr(K, name, f)
    assert calls["attend"] > 0 and calls["rope_cache_write"] > 0, calls
