# SPDX-License-Identifier: Apache-2.0
"""gpt-oss on the decode kernels, on the GPU in bf16 at gpt-oss-20b/120b attention shapes (64 q / 8 kv heads of
64, sliding window 128) and router shapes (32 / 128 experts, top-4, hidden 2880): the attention kernel with sinks
and window against gpt_oss.attend_with_sinks and float64, the router kernel against torch.topk + softmax, the
compiled add + norm against the eager one, CUDA-graph replay, a 4-layer gpt-oss-20b-shaped target (random
weights, MXFP4 experts) with RuntimeConfig.kernels triton vs torch, and the tiny gpt-oss target's greedy tokens.

Tolerances (relative, norm-wise), as tests/gpu/test_decode_attention_cuda.py: attention 1e-2 against float64 and
2e-2 against the torch path (bf16 probabilities before P @ V and one rounding of the output; a wrong row, head,
mask or a lost sink is O(1e-1) or more); router weights 4e-3 (one bf16 rounding, 2^-9, of a float32 softmax);
add + norm: without a bias the sum is the same bf16 add (bit-equal); with o_proj's bias inductor adds both in
float32 and rounds once where eager rounds x + bias first (4e-3); the norm 4e-3 against the eager one (a rounding
flip here and there from another float32 reduction order) and against float64; the layer stack 3e-2 against the torch
path (the sums of the above through 4 layers); dropping the sinks or the window must move it by more than
5e-2 and 3x that error (checked below: the comparison can fail).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.runtime import test_gpt_oss_kernels as cpu_tests
from tests.runtime.compare import attend_f64, rel
from tests.runtime.test_gpt_oss_kernels import topk_f64
from trtllm_dflash.model_config import GptOssConfig, gpt_oss_rope
from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models import gpt_oss
from trtllm_dflash.runtime.models.layers import KeyRange

pytestmark = pytest.mark.gpu
DEV, BF16 = torch.device("cuda"), torch.bfloat16
HQ, HKV, D, WINDOW, HIDDEN = 64, 8, 64, 128, 2880
tiny_gpt_oss = cpu_tests.tiny_gpt_oss   # the CPU tests' module-scoped fixture: the tiny MXFP4 target + drafter


def kernels():
    from trtllm_dflash.runtime.kernels import decode_attention, router
    return decode_attention, router


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("n,T,ctx,kv_len", [(1, 1, 100, 1024), (1, 1, 3000, 4096), (1, 10, 3000, 4096),
                                            (1, 16, 20000, 32768), (4, 8, 700, 1024), (32, 1, 200, 512)])
def test_attend_with_sinks_bf16(window, n, T, ctx, kv_len):
    K, _ = kernels()
    g = torch.Generator(DEV).manual_seed(1)
    cache = KVCache(1, n, HKV, kv_len, D, BF16, DEV)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    q = torch.randn(n, T, HQ, D, device=DEV, generator=g).to(BF16)
    sinks = (torch.randn(HQ, device=DEV, generator=g) + 3).to(BF16)
    start = torch.randint(ctx // 2, ctx, (n,), device=DEV, generator=g)
    pos = start[:, None] + torch.arange(T, device=DEV)
    keys = KeyRange.causal(pos, window)
    rows = slice(0, n)
    k, v = (x.clone() for x in cache.read(0, rows, kv_len))
    visible = keys.mask(kv_len)
    if window is not None:   # the kernel must not read keys below the lowest lo's tile: poison them
        cache.v[:, :, :, :int(keys.lo.min()) // 128 * 128] = float("nan")
    want = attend_f64(q, k, v, visible, D ** -0.5, sinks)
    ref = gpt_oss.attend_with_sinks(q.transpose(1, 2), k, v, visible, sinks, D ** -0.5)
    span = None if window is None else window + T - 1
    out = K.attend(q, cache.k[0], cache.v[0], cache.row_ids(rows), kv_len, keys.lo, keys.hi, D ** -0.5,
                   sinks=sinks, span=span)
    assert rel(out, want) < 1e-2 and rel(out, ref) < 2e-2
    for tiles in ((32, 4), (128, 8)):   # the benchmark's sweep: every tile config is correct too
        out = K.attend(q, cache.k[0], cache.v[0], cache.row_ids(rows), kv_len, keys.lo, keys.hi, D ** -0.5,
                       sinks=sinks, span=span, tiles=tiles)
        assert rel(out, want) < 1e-2


@pytest.mark.parametrize("E", [32, 128])
@pytest.mark.parametrize("N", [1, 10, 64, 4096])
def test_router_topk_softmax_bf16(E, N):
    """Real-shape router logits in bf16 (x @ W^T + b, as the model's nn.Linear): ids exactly the documented rule
    (float64 stable sort), and torch.topk's set wherever no tie sits at the 4th place; how often CUDA's topk
    picks another tied id is printed (expected: rare, only at ties)."""
    _, R = kernels()
    g = torch.Generator(DEV).manual_seed(E + N)
    x = torch.randn(N, HIDDEN, device=DEV, generator=g).to(BF16)
    router = torch.nn.Linear(HIDDEN, E, device=DEV, dtype=BF16)
    logits = router(x)
    ids, w = R.topk_softmax(logits, 4)
    want_ids, want_w = topk_f64(logits, 4)
    assert ids.equal(want_ids) and rel(w, want_w) < 4e-3
    top, ref_ids = logits.topk(4, dim=-1)
    assert rel(w, torch.softmax(top, -1)) < 4e-3
    srt = torch.sort(logits.float(), -1, descending=True).values
    tie = srt[:, 3] == srt[:, 4]                          # a tie across the k-th place: either choice is valid
    same = (ids.sort(-1).values == ref_ids.sort(-1).values).all(-1)
    assert same[~tie].all()
    print(f"E={E} N={N}: rows with a tie at the 4th place {int(tie.sum())}, of which torch.topk chose other ids "
          f"{int((~same).sum())}; order differs in {int((ids != ref_ids).any(-1).sum())} rows")


@pytest.mark.parametrize("N", [1, 10, 64])
def test_fused_add_norm_bf16(N):
    g = torch.Generator(DEV).manual_seed(N)
    norm = gpt_oss.GptOssRMSNorm(HIDDEN, 1e-5).to(DEV, BF16)
    norm.weight.data.copy_(torch.rand(HIDDEN, device=DEV, generator=g) + 0.5)
    x, res = (torch.randn(N, HIDDEN, device=DEV, generator=g).to(BF16) for _ in range(2))
    bias = torch.randn(HIDDEN, device=DEV, generator=g).to(BF16)
    want_h, want_total = norm(x, res, bias=bias)
    for _ in range(2):   # compile, then the compiled kernel
        h, total = norm(x, res, bias=bias, fused=True)
    assert rel(total, want_total) < 4e-3   # inductor adds bias and residual in float32, rounds once
    t64 = want_total.double()
    f64 = norm.weight.double() * t64 * torch.rsqrt(t64.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert rel(h, want_h) < 4e-3 and rel(h, f64) < 4e-3
    h2, total2 = norm(x, res, fused=True)
    assert total2.equal(res + x) and rel(h2, norm(x, res)[0]) < 4e-3


def test_kernels_replay_in_a_cuda_graph():
    """RoPE + cache write, the windowed attention with sinks and the router kernel captured once; replays after
    the inputs change in place equal eager calls."""
    K, R = kernels()
    from trtllm_dflash.runtime.models import layers as L
    n, T, S = 2, 10, 1024
    cache = KVCache(1, n, HKV, S, D, BF16, DEV)
    qkv = torch.randn(n, T, HQ + 2 * HKV, D, device=DEV, dtype=BF16)
    logits = torch.randn(n * T, 32, device=DEV, dtype=BF16)
    sinks = torch.randn(HQ, device=DEV, dtype=BF16)
    pos = torch.tensor([[300], [700]], device=DEV) + torch.arange(T, device=DEV)
    rot = L.Rotary(gpt_oss_rope({}), D, S, 131072).to(DEV)

    def step():
        q, k, v = qkv.split([HQ, HKV, HKV], dim=2)
        cos, sin = rot.tables(pos, BF16)
        q, _ = L.rope_cache_write(q, k, v, cos, sin, None, None, 0.0, cache, 0, slice(0, n), pos, Kernels(triton=True),
                                  want_k=False)
        keys = KeyRange.causal(pos, WINDOW)
        out = K.attend(q, cache.k[0], cache.v[0], cache.row_ids(slice(0, n)), S, keys.lo, keys.hi, D ** -0.5,
                       sinks=sinks, span=WINDOW + T - 1)
        return (out,) + R.topk_softmax(logits, 4)

    graph, outs = capture(step, warmups=1)
    for shift in (1, 5):
        qkv.normal_()
        logits.normal_()
        pos += shift
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(outs, step()):
            assert a.equal(b)


def random_target(layers: int = 4, experts: int = 32, kernel: str = "torch"):
    """A gpt-oss-20b-shaped target (sliding/full alternating) with random weights (seeded: the same for every
    ``kernel``), MXFP4 experts, bf16, on the GPU (a 2k vocabulary: the head is not what is tested)."""
    from trtllm_dflash.runtime.kernels import Kernels
    from trtllm_dflash.checkpoints.resolve import PUBLIC_CONFIGS
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.models.layers import Rotary
    cfg = {**PUBLIC_CONFIGS["openai/gpt-oss-20b"], "num_hidden_layers": layers, "num_local_experts": experts,
           "vocab_size": 2048}
    c = GptOssConfig.from_hf(cfg)
    torch.manual_seed(0)
    with torch.device(DEV):
        model = gpt_oss.GptOssTarget(c, TPGroup(), 8192, moe_kernel="triton",
                                     kernels=Kernels.choose(kernel, False, DEV, BF16))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype == torch.uint8:
                lo, hi = (118, 122) if name.endswith("scales") else (0, 256)
                p.copy_(torch.randint(lo, hi, p.shape, dtype=torch.uint8, device=DEV))
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "sinks" in name:
                p.normal_(5.0, 1.0)   # a good share of the softmax mass over 128 keys (e^5 ~ 148), so sinks matter
            elif name.endswith("router.bias"):   # routing set by the bias, with wide gaps: no flips between paths
                p.copy_(torch.randperm(p.numel(), device=DEV) * 0.5)
            elif name.endswith("router.weight"):
                p.normal_(0, 2e-3)
            else:
                p.normal_(0, 0.02)
    model = model.to(BF16)
    # RoPE tables are float32 buffers, which .to(BF16) cast: rebuild them, as the loader keeps them float32
    model.rotary = Rotary(c.rope, c.head_dim, 8192, c.max_position_embeddings).to(DEV)
    return model.eval()


@torch.inference_mode()
def test_target_layers_bf16_triton_vs_torch():
    """Prefill 3000 tokens, then an AR step and a DFlash verify block of 10 over the cache, with the kernels vs
    the torch path (same weights, same cache contents)."""
    models = {kernel: random_target(kernel=kernel) for kernel in ("torch", "triton")}
    L_, H, Dh = models["torch"].kv_shape()
    g = torch.Generator(DEV).manual_seed(3)
    ids = torch.randint(0, 2048, (1, 3011), device=DEV, generator=g)
    cache = KVCache(L_, 1, H, 4096, Dh, BF16, DEV)
    models["torch"](ids[:, :3000], torch.arange(3000, device=DEV)[None], cache, slice(0, 1), None)
    saved = (cache.k.clone(), cache.v.clone())
    out = {}
    for kernel, model in models.items():   # the loop leaves ``model`` on the kernels for the checks below
        cache.k.copy_(saved[0]), cache.v.copy_(saved[1])
        h1, _ = model(ids[:, 3000:3001], torch.tensor([[3000]], device=DEV), cache, slice(0, 1), 3008)
        h10, _ = model(ids[:, 3001:3011], torch.arange(3001, 3011, device=DEV)[None], cache, slice(0, 1), 3072)
        out[kernel] = (h1, h10)
    errs = [rel(a, b) for a, b in zip(out["triton"], out["torch"])]
    assert max(errs) < 3e-2, errs
    # the comparison can fail: without sinks (or with the window off) the kernel path is much further off
    for change in ("sinks", "window"):
        saved_sinks = [layer.self_attn.sinks.data.clone() for layer in model.layers]
        if change == "sinks":
            for layer in model.layers:
                layer.self_attn.sinks.data.fill_(-1e4)
        else:
            model.config = dataclasses.replace(model.config, sliding_window=100_000)
        cache.k.copy_(saved[0]), cache.v.copy_(saved[1])
        h1, _ = model(ids[:, 3000:3001], torch.tensor([[3000]], device=DEV), cache, slice(0, 1), 3008)
        assert rel(h1, out["torch"][0]) > max(3 * errs[0], 5e-2), change
        for layer, s in zip(model.layers, saved_sinks):
            layer.self_attn.sinks.data.copy_(s)
        model.config = dataclasses.replace(model.config, sliding_window=WINDOW)


def test_tiny_gpt_oss_tokens_with_the_kernels(tiny_gpt_oss):
    """float32, CUDA graphs on, MXFP4 experts on their Triton kernels (the path a GPU serves; the dequantised
    experts' float32 loop syncs the host, which capture forbids), past the sliding window: greedy AR and DFlash
    tokens with the kernels == the torch path's at the same block (the expert kernels then see the same shapes,
    so only the attention, router and norms differ between the runs)."""
    from tests.runtime.kernel_engine import engine_with_kernel
    from trtllm_dflash.config import RuntimeConfig, SamplingParams

    def engine(block, kernel):
        return engine_with_kernel(tiny_gpt_oss[0], tiny_gpt_oss[1] if block != 1 else None,
                                  RuntimeConfig(max_seq_len=256, max_batch_size=4, block_size=block, dtype="float32",
                                                device="cuda", kernels=kernel, mxfp4_moe="triton"))
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, 90, (k,), generator=g).tolist() for k in (3, 17, 1, 40, 9, 25)]
    sp = SamplingParams(max_new_tokens=48, ignore_eos=True)
    for block in (1, None):
        fused, ref = engine(block, "triton").generate(ps, sp), engine(block, "torch").generate(ps, sp)
        for a, r in zip(fused, ref):
            assert a.output_ids == r.output_ids, block
