# SPDX-License-Identifier: Apache-2.0
"""The fused MXFP4 routed-expert kernels (runtime/mxfp4_moe.py), all three variants (mma, swap, gemv), on random
MXFP4 tensors: against a float64 dequantise-then-matmul reference, against the dequantised torch Experts math and
against each other. CPU: Triton's interpreter (float32, dot_scaled=False, tiny shapes; skipped without triton).
GPU (``gpu`` marker): bf16 at gpt-oss-20b / -120b expert shapes, CUDA-graph replay, greedy DFlash == AR.

Tolerances. On the GPU the kernel rounds the activations x to bf16 (exact here: x is bf16), accumulates in
float32, rounds the SwiGLU output to bf16 (relative 2^-9 per element) and the [N * k, H] expert outputs to x's
dtype before the k-sum. Each rounding adds at most 2^-9 ~ 2e-3 relative per element, so 1e-2 (norm-wise) against
float64 has room for the float32 accumulation order and no room for a wrong nibble, scale or row (those give O(1)
errors). The bf16 Experts math also rounds gate_up and every SwiGLU intermediate to bf16, hence 2e-2 between the
two. Variants against each other on the GPU: both sit within 1e-2 of float64, so 2e-2. In the interpreter
everything is float32 (activations included): 1e-5 covers float32 sums in another order (K = 96: ~1e-7 seen).
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.runtime.compare import rel
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.models import mxfp4
from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
LIMIT = 7.0


def random_experts(E, H, I, device, seed=0):
    g = torch.Generator(device).manual_seed(seed)

    def u8(*shape, lo=0, hi=256):
        return torch.randint(lo, hi, shape, dtype=torch.uint8, device=device, generator=g)

    # scales 2^-7..2^-3: weights of size ~1e-2..1e-1, so SwiGLU sees gates in and beyond the clamp at 7
    return {"gu_blocks": u8(E, 2 * I, H // 32, 16), "gu_scales": u8(E, 2 * I, H // 32, lo=120, hi=125),
            "gu_bias": torch.randn(E, 2 * I, device=device, generator=g),
            "dn_blocks": u8(E, H, I // 32, 16), "dn_scales": u8(E, H, I // 32, lo=120, hi=125),
            "dn_bias": torch.randn(E, H, device=device, generator=g)}


def reference(x, ids, weights, w, first, dtype=torch.float64):
    """The routed experts by dequantise-then-matmul (models/mxfp4.dequantize, checked against transformers on CPU),
    only the experts the pairs use, on x's device. float64: the independent reference; bf16 / float32: the math of
    the dequantised torch Experts path in that dtype (every intermediate rounded to it)."""
    dev, (N, k), E = x.device, ids.shape, w["gu_blocks"].shape[0]
    local = (ids - first).flatten()
    out = torch.zeros(N * k, x.shape[1], dtype=torch.float64, device=dev)
    for e in local.unique().tolist():
        if not 0 <= e < E:
            continue
        rows = torch.nonzero(local == e).flatten()
        gu = mxfp4.dequantize(w["gu_blocks"][e:e + 1], w["gu_scales"][e:e + 1], dtype)[0]       # [H, 2I]
        dn = mxfp4.dequantize(w["dn_blocks"][e:e + 1], w["dn_scales"][e:e + 1], dtype)[0]       # [I, H]
        h = x[rows // k].to(dtype) @ gu + w["gu_bias"][e].to(dtype)
        gate, up = h[:, 0::2].clamp(max=LIMIT), h[:, 1::2].clamp(-LIMIT, LIMIT)
        y = ((up + 1) * gate * torch.sigmoid(gate * SWIGLU_ALPHA)) @ dn + w["dn_bias"][e].to(dtype)
        out[rows] = y.double() * weights.flatten()[rows, None].double()
    return out.view(N, k, -1).sum(1)


def run_kernel(x, ids, weights, w, first, num_experts, tiles=None):
    from trtllm_dflash.runtime import mxfp4_moe
    return mxfp4_moe.fused_experts(x, ids, weights, w["gu_blocks"], w["gu_scales"], w["gu_bias"], w["dn_blocks"],
                                   w["dn_scales"], w["dn_bias"], first=first, num_experts=num_experts, limit=LIMIT,
                                   alpha=SWIGLU_ALPHA, tiles=tiles)


def routing(N, k, num_experts, device, seed):
    g = torch.Generator(device).manual_seed(seed)
    ids = torch.rand(N, num_experts, device=device, generator=g).topk(k, -1).indices          # distinct per token
    weights = torch.softmax(torch.randn(N, k, device=device, generator=g), -1)
    return ids, weights


def triton_or_skip():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")


# ---- CPU: Triton's interpreter, float32, tiny shapes ------------------------------------------------------
CPU_TILES = {  # every variant, uneven K slices (I = 96 over BK = 64: a partial tile), blocks smaller than an expert
    "gemv_bm8": dict(variant="gemv", block_m=8, block_n=16, block_k=32, split_k=1),
    "gemv_bm8_split3": dict(variant="gemv", block_m=8, block_n=32, block_k=64, split_k=3),
    # the down kernel on its own K step (default_tiles' one-token tile: gate_up 128, down 256)
    "gemv_down_k64": dict(variant="gemv", block_m=8, block_n=16, block_k=32, down_block_k=64, split_k=1),
    # experts with 2+ pairs on tc's tensor-core step, the rest on gemv's loops (N = 5: every expert has several)
    "gemv_mma2": dict(variant="gemv", block_m=16, block_n=16, block_k=32, split_k=1, mma_from=2),
    "gemv_mma3_split3": dict(variant="gemv", block_m=16, block_n=32, block_k=64, split_k=3, mma_from=3),
    # the tensor-core step: 2 BN = 32 gate / up rows, a partial last K tile, and K split in 3 uneven slices
    "tc": dict(variant="tc", block_m=16, block_n=16, block_k=64, split_k=1),
    "tc_split3": dict(variant="tc", block_m=16, block_n=16, block_k=32, split_k=3),
    "mma_split2": dict(variant="mma", block_m=16, block_n=16, block_k=64, dot_scaled=False, split_k=2),
    "swap": dict(variant="swap", block_m=16, block_n=16, block_k=32, dot_scaled=False, split_k=1),
}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("name", sorted(CPU_TILES))
@pytest.mark.parametrize("N,ep", [(1, "all"), (5, "all"), (5, "half")])
def test_variants_in_the_interpreter(name, N, ep):
    """float64 reference, the float32 dequantised Experts math and the mma variant (the kernel that was there
    before gemv and swap), each at 1e-5 (docstring)."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only where no GPU is visible (tests below cover CUDA)")
    triton_or_skip()
    from trtllm_dflash.runtime import mxfp4_moe
    from trtllm_dflash.runtime.kernels import arrival
    dev, E_all, k, H, I = torch.device("cpu"), 4, 2, 64, 96
    E, first = (E_all, 0) if ep == "all" else (E_all // 2, E_all // 2)
    w = random_experts(E, H, I, dev, seed=N)
    ids, weights = routing(N, k, E_all, dev, seed=N + 1)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(N))
    got = run_kernel(x, ids, weights, w, first, E_all, mxfp4_moe.TileConfig(**CPU_TILES[name]))
    assert got.shape == (N, H) and got.dtype == torch.float32
    assert rel(got, reference(x, ids, weights, w, first)) < 1e-5
    assert rel(got, reference(x, ids, weights, w, first, torch.float32)) < 1e-5
    old = run_kernel(x, ids, weights, w, first, E_all, mxfp4_moe.TileConfig(block_k=32, dot_scaled=False))
    assert rel(got, old) < 1e-5
    # gemv's split-K tile counters are back at 0 for the next call (a CUDA-graph replay sees the same buffer)
    assert all(int(c.abs().sum()) == 0 for c in arrival._counters.values())


def _one_token_in_batches(dev, dtype, E_all, k, H, I, sizes, tiles=None):
    """Token 0's output, computed alone and as row 0 of batches of ``sizes`` tokens (the others random, so they
    share its experts or not), under the batch-invariant mode: every result as bits, and the float64 reference."""
    w = random_experts(E_all, H, I, dev, seed=7)
    g = torch.Generator(dev).manual_seed(8)
    x = torch.randn(max(sizes), H, device=dev, generator=g).to(dtype)
    ids, weights = routing(max(sizes), k, E_all, dev, seed=9)
    from trtllm_dflash.runtime import mxfp4_moe
    outs = [mxfp4_moe.fused_experts(x[:n], ids[:n], weights[:n], w["gu_blocks"], w["gu_scales"], w["gu_bias"],
                                    w["dn_blocks"], w["dn_scales"], w["dn_bias"], first=0, num_experts=E_all,
                                    limit=LIMIT, alpha=SWIGLU_ALPHA, tiles=tiles, invariant=True)[0]
            for n in sizes]
    return outs, reference(x[:1], ids[:1], weights[:1], w, 0)[0]


@pytest.mark.usefixtures("one_torch_thread")
def test_batch_invariant_tiles_give_a_token_the_same_bits_in_any_batch():
    """RuntimeConfig.batch_invariant on the MXFP4 experts: one tile for every token count (invariant_tiles), so a
    token's output does not depend on how many tokens share the call or their experts; still the float64 result."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only where no GPU is visible (the gpu test below covers CUDA)")
    triton_or_skip()
    from trtllm_dflash.runtime import mxfp4_moe
    t = mxfp4_moe.invariant_tiles(cuda=False)
    assert (t.variant, t.block_m, t.split_k, t.dot_scaled) == ("mma", 16, 1, False)
    outs, ref = _one_token_in_batches(torch.device("cpu"), torch.float32, 4, 2, 64, 96, [1, 2, 5, 21])
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert rel(outs[0][None], ref[None]) < 1e-5
    # the default rule's tiles change with the token count: gemv alone, mma with split-K at 21 tokens
    assert mxfp4_moe.default_tiles(1, 2, 4).variant == "gemv" and mxfp4_moe.default_tiles(21, 2, 4).variant == "mma"
    # gemv's K step: gate_up 128 for one token (an AR step at batch 1), else 256; down 256 (the H200's profile)
    tiles = [mxfp4_moe.default_tiles(n, 4, 128) for n in (1, 2, 10, 16)]
    assert [(t.block_k, t.dn_block_k) for t in tiles] == [(128, 256)] + [(256, 256)] * 3
    with pytest.raises(ValueError, match="down_block_k"):
        mxfp4_moe.TileConfig(variant="gemv", down_block_k=48)


@pytest.mark.usefixtures("one_torch_thread")
def test_routing_trace_drives_the_kernels_in_a_step():
    """gpt_oss_step's routing traces on the MXFP4 backend: a 4-request AR step of the tiny target (gemv) runs
    the kernels on the trace's experts: its hidden states equal the dequantised experts' fed the same trace
    (1e-5, float32 interpreter) and differ from the router's own choice."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only where no GPU is visible (the GPU benchmark covers CUDA)")
    triton_or_skip()
    from trtllm_dflash.bench import gpt_oss_step
    from trtllm_dflash.bench.routing_trace import Routing, TraceRouter
    cpu, n = torch.device("cpu"), 4
    target, drafter = gpt_oss_step.build("gpt-oss-20b", True, cpu, torch.float32, 32, "triton")
    steps = gpt_oss_step.Steps(target, drafter, n, 16, cpu, torch.float32)
    router = TraceRouter(Routing("skewed", zipf=1.0, reuse=0.5, seed=3), target, cpu)
    args = (steps.last[:n, None], steps.start[:n, None], steps.cache, slice(0, n), 17)

    def hidden():
        router.use(n, 1)
        with torch.inference_mode():
            return target(*args)[0].clone()
    router.attach()
    kernels = hidden()
    for layer in target.layers:
        layer.mlp.experts = layer.mlp.experts.dequantized(torch.float32)
    router.attach()                    # the new experts modules get the trace too
    assert rel(kernels, hidden()) < 1e-5
    router.detach()
    assert rel(kernels, hidden()) > 1e-3


def test_gemv_with_no_local_pair_gives_zeros_and_rejects_too_many_tokens():
    """Expert parallelism: a call whose pairs all live on other ranks still writes its (zero) partial sum."""
    triton_or_skip()
    from trtllm_dflash.runtime import mxfp4_moe
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs only where no GPU is visible")
    dev, E, H, I = torch.device("cpu"), 2, 64, 64
    w = random_experts(E, H, I, dev)
    ids, weights = torch.tensor([[0, 1], [1, 0]]), torch.full((2, 2), 0.5)   # global ids 0, 1; this rank: 2, 3
    x = torch.randn(2, H)
    for split in (1, 2):
        tiles = mxfp4_moe.TileConfig(variant="gemv", block_m=2, block_n=32, block_k=32, split_k=split)
        assert torch.equal(run_kernel(x, ids, weights, w, 2, 4, tiles), torch.zeros(2, H))
    with pytest.raises(ValueError, match="tokens per call"):
        run_kernel(torch.randn(3, H), ids.repeat(2, 1)[:3], weights.repeat(2, 1)[:3], w, 0, 2,
                   mxfp4_moe.TileConfig(variant="gemv", block_m=2))


def test_default_tiles_rule_and_checks():
    triton_or_skip()
    from trtllm_dflash.runtime import mxfp4_moe
    for tokens in range(1, mxfp4_moe.GEMV_MAX_TOKENS + 1):  # every expert's pairs fit one gemv block
        t = mxfp4_moe.default_tiles(tokens, 4, 128)
        assert (t.variant, t.mma_from) == ("gemv", 0) and t.block_m >= tokens and t.block_m & (t.block_m - 1) == 0
        t.check()
    for tokens, bm in ((mxfp4_moe.GEMV_MAX_TOKENS + 1, 16), (40, 16), (64, 16), (640, 32), (4096, 64)):
        t = mxfp4_moe.default_tiles(tokens, 4, 32 if tokens > 1000 else 128)
        assert (t.variant, t.block_m) == ("mma", bm)
    for bad in (dict(variant="mma", block_m=8), dict(variant="swap", block_n=8), dict(variant="gemv", block_m=1),
                dict(variant="gemv", block_k=16), dict(variant="gemv", block_n=48), dict(variant="fast"),
                dict(variant="mma", mma_from=2), dict(variant="gemv", mma_from=1),
                dict(variant="gemv", block_m=8, mma_from=2), dict(variant="gemv", mma_from=-1),
                dict(variant="tc", block_m=8), dict(variant="tc", block_n=8), dict(variant="tc", mma_from=2)):
        with pytest.raises(ValueError, match="variant is one of"):
            mxfp4_moe.TileConfig(**bad).check()


# ---- GPU: bf16 at the real expert shapes ------------------------------------------------------------------
SHAPES = {"gpt-oss-20b": (32, 2880, 2880), "gpt-oss-120b": (128, 2880, 2880)}  # experts, hidden, intermediate
GPU_TILES = {
    "default": None,  # default_tiles' choice for the token count
    "gemv": dict(variant="gemv", block_m=64, block_n=32, block_k=256),
    "gemv_k128_down256": dict(variant="gemv", block_m=64, block_n=32, block_k=128, down_block_k=256),
    "gemv_mma2": dict(variant="gemv", block_m=64, block_n=32, block_k=256, mma_from=2),
    "tc": dict(variant="tc", block_m=64, block_n=64, block_k=128),
    "mma": dict(variant="mma", block_m=16),
    "swap": dict(variant="swap", block_m=16),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(GPU_TILES))
@pytest.mark.parametrize("N", [1, 4, 10, 40, 64])
@pytest.mark.parametrize("model", list(SHAPES))
def test_variants_at_gpt_oss_shapes(model, N, name):
    """gemv at 40 and 64 tokens: block_m 16 < tokens, so an expert may span two blocks (still correct)."""
    from trtllm_dflash.runtime import mxfp4_moe
    (E, H, I), k, dev = SHAPES[model], 4, torch.device("cuda")
    w = random_experts(E, H, I, dev, seed=N)
    ids, weights = routing(N, k, E, dev, seed=N + 1)
    x = torch.randn(N, H, device=dev).bfloat16()
    tiles = mxfp4_moe.TileConfig(**GPU_TILES[name]) if GPU_TILES[name] else None
    got = run_kernel(x, ids, weights, w, 0, E, tiles)
    assert got.shape == (N, H) and got.dtype == torch.bfloat16
    assert rel(got, reference(x, ids, weights, w, 0)) < 1e-2
    assert rel(got, reference(x, ids, weights, w, 0, torch.bfloat16)) < 2e-2
    if name != "mma":
        assert rel(got, run_kernel(x, ids, weights, w, 0, E, mxfp4_moe.TileConfig(variant="mma"))) < 2e-2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("tiles", [None, dict(dot_scaled=True, split_k=1), dict(dot_scaled=True, split_k=3),
                                   dict(dot_scaled=False), dict(variant="swap", split_k=3), dict(variant="swap", dot_scaled=False),
                                   dict(variant="gemv", block_m=64, block_n=32, block_k=64, split_k=3)])
@pytest.mark.parametrize("N", [1, 3, 64, 300])
@pytest.mark.parametrize("ep", ["all", "half"])
def test_kernel_matches_float64_and_bf16_dequant(N, ep, tiles):
    """Small shapes with a partial BK = 128 tile (K = 320), expert parallelism, split K 1 / 3 / automatic."""
    from trtllm_dflash.runtime import mxfp4_moe
    dev, E_all, k, H, I = torch.device("cuda"), 8, 4, 320, 224
    E, first = (E_all, 0) if ep == "all" else (E_all // 2, E_all // 2)
    w = random_experts(E, H, I, dev, seed=N)
    ids, weights = routing(N, k, E_all, dev, seed=N + 1)
    x = torch.randn(N, H, device=dev).bfloat16()
    t = None
    if tiles is not None and tiles.get("variant") == "gemv" and N > tiles["block_m"]:
        pytest.skip("gemv needs tokens <= block_m (a clear error, tested on CPU)")
    if tiles is not None:
        base = dict(block_m=16 if N < 100 else 32, block_n=32 if N == 3 else 64)
        t = mxfp4_moe.TileConfig(**{**base, **tiles})
        assert t.block_m == tiles.get("block_m", base["block_m"])
    got = run_kernel(x, ids, weights, w, first, E_all, t)
    assert got.shape == (N, H) and got.dtype == torch.bfloat16
    assert rel(got, reference(x, ids, weights, w, first)) < 1e-2
    assert rel(got, reference(x, ids, weights, w, first, torch.bfloat16)) < 2e-2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", ["default", "mma", "swap", "gemv", "gemv_mma2", "tc_split"])
def test_kernel_under_cuda_graph_replays_new_routing(variant):
    """gemv_mma2: which experts take the MMA step is decided on the device per call, so a replay with new routing
    switches them (8 tokens x 4 of 16 experts: some experts get one pair, others several)."""
    from trtllm_dflash.runtime import mxfp4_moe
    tiles = {"default": None, "mma": mxfp4_moe.TileConfig(variant="mma", block_m=16),
             "swap": mxfp4_moe.TileConfig(variant="swap", block_m=16),
             "gemv": mxfp4_moe.TileConfig(variant="gemv", block_m=8),
             "gemv_mma2": mxfp4_moe.TileConfig(variant="gemv", block_m=16, block_n=32, mma_from=2),
             "tc_split": mxfp4_moe.TileConfig(variant="tc", block_m=16, block_n=32, block_k=64, split_k=2)}[variant]
    dev, E, k, H, I, N = torch.device("cuda"), 16, 4, 256, 128, 8
    w = random_experts(E, H, I, dev)
    ids, weights = routing(N, k, E, dev, 1)
    x = torch.randn(N, H, device=dev).bfloat16()

    def run():
        return run_kernel(x, ids, weights, w, 0, E, tiles)
    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (2, 3):  # new routing and activations in the same buffers: the graph must follow them
        new_ids, new_w = routing(N, k, E, dev, seed)
        ids.copy_(new_ids), weights.copy_(new_w), x.normal_()
        graph.replay()
        assert rel(out, reference(x, ids, weights, w, 0)) < 1e-2


@pytest.mark.gpu
@needs_gpu
def test_greedy_dflash_equals_ar_with_the_mxfp4_kernel(tmp_path):
    """A small random MXFP4 gpt-oss (the CPU tests' checkpoint writer) run by the kernels, float32 elsewhere."""
    from trtllm_dflash.testing import VOCAB, write_gpt_oss_drafter, write_tiny_gpt_oss
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine
    target = write_tiny_gpt_oss(tmp_path / "t", mxfp4=True, seed=1)
    drafter = write_gpt_oss_drafter(target, tmp_path / "d")
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, VOCAB - 2, (n,), generator=g).tolist() for n in (3, 17, 30)]
    cfg = dict(max_seq_len=128, max_batch_size=2, device="cuda", dtype="float32", mxfp4_moe="triton")
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True)
    ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
    df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
    assert type(ar.target.layers[0].mlp.experts).__name__ == "Mxfp4Experts"
    out_ar, out_df = ar.generate(ps, sp), df.generate(ps, sp)
    for a, d in zip(out_ar, out_df):
        assert d.output_ids == a.output_ids


# ---- CPU: the setting -------------------------------------------------------------------------------------
def test_experts_kernel_setting_is_explicit():
    q = True   # GptOssConfig.mxfp4 of an MXFP4 checkpoint
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert mxfp4.resolve_kernel("auto", q, cpu) == "dequant"
    assert mxfp4.resolve_kernel("auto", q, cuda) == "triton"
    assert mxfp4.resolve_kernel("auto", False, cuda) == "dequant"      # bf16 experts: nothing to keep packed
    assert mxfp4.resolve_kernel("dequant", q, cuda) == "dequant"
    for setting, cfg, dev in (("triton", q, cpu), ("triton", False, cuda), ("fast", q, cuda)):
        with pytest.raises(DFlashError, match="mxfp4_moe"):
            mxfp4.resolve_kernel(setting, cfg, dev)


def test_dequant_layout_pinned_by_hand():
    """One byte, decoded by hand: low nibble first, rows = outputs, value = E2M1 x 2^(scale - 127)."""
    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x2B      # low nibble 0xB = -1.5, high nibble 0x2 = 1.0
    blocks[0, 1, 0, 15] = 0xF7     # low 0x7 = 6.0, high 0xF = -6.0 (inputs 30, 31 of output row 1)
    scales = torch.tensor([[[128], [126]]], dtype=torch.uint8)       # x2, x0.5
    w = mxfp4.dequantize(blocks, scales, torch.float64)              # [1, 32 inputs, 2 outputs]
    want = torch.zeros(1, 32, 2, dtype=torch.float64)
    want[0, 0, 0], want[0, 1, 0], want[0, 30, 1], want[0, 31, 1] = -3.0, 2.0, 3.0, -3.0
    assert torch.equal(w, want)


@pytest.mark.exhaustive   # a smoke of dflash-bench mxfp4; the kernels' own cases above run by default
def test_bench_smoke_in_the_interpreter(tmp_path):
    """trtllm_dflash/bench/mxfp4.py --smoke: rows for every point, the configs agree, ``best`` per point."""
    if torch.cuda.is_available():
        pytest.skip("--smoke is the CPU interpreter run")
    triton_or_skip()
    import json
    from trtllm_dflash.bench import mxfp4 as mxfp4_bench
    out = tmp_path / "b.json"
    assert mxfp4_bench.main(["--smoke", "--configs", "old,default", "--routings", "concentrated",
                             "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {(r["tokens"], r["config"]) for r in res["rows"]} == {(n, c) for n in (1, 3) for c in ("old", "default")}
    assert all(r["us"] > 0 and r["rel_diff_vs_first_config"] < 1e-5 and r["distinct_experts"] >= 1 for r in res["rows"])
    assert set(res["best"]) == {"tiny/N1/concentrated", "tiny/N3/concentrated"}


def test_kernels_compile_for_hopper_without_a_gpu():
    """Every kernel of the default tile configs compiles for sm_90 (Triton front end, MLIR passes and its bundled
    ptxas run on the CPU; the interpreter tests above do not compile), and the default gemv kernels do not spill.
    One Triton 3.6 failure this guards against: a store reached from two branches failed an MLIR pass ("operand
    does not dominate this use") at some tile shapes."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests compile the kernels for real")
    triton_or_skip()
    import json
    from pathlib import Path
    from tests.runtime.compare import compile_for_h100
    from trtllm_dflash.runtime import mxfp4_moe
    def spec(t):
        return f"gemv:{t.block_m}:{t.block_n}:{t.block_k}:{t.num_warps}"
    one, block = mxfp4_moe.default_tiles(1, 4, 32), mxfp4_moe.default_tiles(mxfp4_moe.GEMV_MAX_TOKENS, 4, 32)
    assert {(t.variant, t.mma_from) for t in (one, block)} == {("gemv", 0)} and one != block
    gemv, gemv_one = spec(block), spec(one)
    tc = "tc:16:64:128:4"
    script = Path(__file__).with_name("mxfp4_sm90_compile.py")
    stdout = compile_for_h100([str(script), tc, gemv, gemv_one, f"{gemv}:mma2", "mma:16:64:128:4",
                               "swap:16:64:128:4"], timeout=900)
    rows = [json.loads(line) for line in stdout.splitlines()]
    # tc, gemv's block and one-token tiles, the block tile with mma_from 2 (its tile step on the MMA: dot_scaled)
    assert len(rows) == 4 * 4 + 2 * 11
    assert all(r["stack"] == 0 for r in rows
               if r["config"] in (tc, gemv, gemv_one) or r["constexprs"].get("split") == "1")
    # the tensor-core step's point: fewer registers than gemv's FMA loops at the block tile it competes with, so
    # more programs per SM
    regs = {(r["config"], r["kernel"]): r["regs"] for r in rows if r["constexprs"].get("split") == "1"}
    for kernel in ("_gemv_gate_up_kernel", "_gemv_down_kernel"):
        assert regs[(tc, kernel)] < regs[(gemv, kernel)]


def test_the_gemv_loop_cost_is_read_off_the_hopper_sass():
    """mxfp4_sm90_compile.py --loop: each gemv kernel's K-step loop and row loop found in its sm_90 SASS, with
    the instructions per weight value they issue (the decode-bound ceiling #33's kernels are judged against)."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests compile the kernels for real")
    triton_or_skip()
    import json
    from pathlib import Path
    from tests.runtime.compare import compile_for_h100
    script = Path(__file__).with_name("mxfp4_sm90_compile.py")
    rows = [json.loads(line) for line in compile_for_h100([str(script), "--loop", "gemv:16:16:256:4"]).splitlines()]
    assert [r["kernel"] for r in rows] == ["_gemv_gate_up_kernel", "_gemv_down_kernel"]
    for r in rows:
        # one row of the many-pair path costs less than a whole K step; every value costs at least its FMA and decode
        assert 0 < r["row_loop_instructions"] < min(r["loop_instructions_1_token"], r["many_pair_loop_instructions"])
        assert 2 < r["instructions_per_value_1_token"] < 64 and r["h100_issue_bound_tb_per_s_1_token"] > 0
        assert 0 < r["registers_per_thread"] <= 255 and r["programs_per_sm_by_registers"] >= 1   # sm_90: <= 255
        ops = r["opcodes_1_token"]   # the loop's instructions by opcode: they add up, and the FMAs and loads are there
        assert sum(ops.values()) == r["loop_instructions_1_token"] and ops["FFMA"] > 0 and ops["LDG"] > 0
    # tc: one K loop per kernel holding the wgmma, fewer instructions per weight value than gemv's one-pair loop
    tc = [json.loads(line) for line in compile_for_h100([str(script), "--loop", "tc:16:64:128:4"]).splitlines()]
    assert [r["kernel"] for r in tc] == ["_gemv_gate_up_kernel", "_gemv_down_kernel"]
    for r, g in zip(tc, rows):
        assert r["mma_instructions"] > 0 and 1 < r["instructions_per_value"] < g["instructions_per_value_1_token"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", list(SHAPES))
def test_batch_invariant_tiles_on_the_gpu(model):
    """The same on CUDA in bf16 at gpt-oss shapes: one token alone, in a decode batch, a DFlash block's worth and a
    prefill chunk's: the same bits, within 1e-2 of float64 (the module docstring's tolerance)."""
    (E, H, I), k = SHAPES[model], 4   # gpt-oss routes each token to 4 experts
    outs, ref = _one_token_in_batches(torch.device("cuda"), torch.bfloat16, E, k, H, I, [1, 4, 16, 64, 300])
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert rel(outs[0].double()[None], ref[None]) < 1e-2
