# SPDX-License-Identifier: Apache-2.0
"""The fused MXFP4 routed-expert kernels (runtime/mxfp4_moe.py) on the GPU, on random MXFP4 tensors: against a
float64 dequantise-then-matmul reference and against the bf16 dequantised Experts path; CUDA-graph replay;
greedy DFlash == AR with a small random MXFP4 gpt-oss run by the kernels. CPU: the backend setting.

Tolerances. The kernel rounds the activations x to bf16 (exact here: x is bf16), accumulates in float32, rounds
the SwiGLU output to bf16 (relative 2^-9 per element) and the [N * k, H] expert outputs to x's dtype before the
k-sum. Each rounding adds at most 2^-9 ~ 2e-3 relative per element, so 1e-2 (norm-wise) against float64 has
room for the float32 accumulation order and no room for a wrong nibble, scale or row (those give O(1) errors).
The bf16 Experts path also rounds gate_up and every SwiGLU intermediate to bf16, hence 2e-2 between the two.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.compare import rel
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.models import mxfp4
from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

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


def reference_f64(x, ids, weights, w, first, add_bias=True):
    """Dequantise to float64 (models/mxfp4.dequantize, checked against transformers on CPU), then plain matmuls."""
    gu = mxfp4.dequantize(w["gu_blocks"].cpu(), w["gu_scales"].cpu(), torch.float64)   # [E, H, 2I]
    dn = mxfp4.dequantize(w["dn_blocks"].cpu(), w["dn_scales"].cpu(), torch.float64)   # [E, I, H]
    x, ids, weights = x.cpu().double(), ids.cpu(), weights.cpu().double()
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[n, j]) - first
            if not 0 <= e < gu.shape[0]:
                continue
            h = x[n] @ gu[e] + w["gu_bias"][e].cpu().double()
            gate, up = h[0::2].clamp(max=LIMIT), h[1::2].clamp(-LIMIT, LIMIT)
            y = ((up + 1) * gate * torch.sigmoid(gate * SWIGLU_ALPHA)) @ dn[e]
            out[n] += weights[n, j] * (y + (w["dn_bias"][e].cpu().double() if add_bias else 0))
    return out


def routing(N, k, num_experts, device, seed):
    g = torch.Generator(device).manual_seed(seed)
    ids = torch.rand(N, num_experts, device=device, generator=g).topk(k, -1).indices          # distinct per token
    weights = torch.softmax(torch.randn(N, k, device=device, generator=g), -1)
    return ids, weights


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dot_scaled,split_k", [(True, None), (True, 1), (True, 3), (False, None)])
@pytest.mark.parametrize("N", [1, 3, 64, 300])
@pytest.mark.parametrize("ep", ["all", "half"])
def test_kernel_matches_float64_and_bf16_dequant(N, ep, dot_scaled, split_k):
    """split_k None = the automatic choice (split at decode sizes, none at 300 tokens); 3 = uneven K slices."""
    from trtllm_dflash.runtime import mxfp4_moe
    dev, E_all, k, H, I = torch.device("cuda"), 8, 4, 320, 224   # K = 320: a partial BK=128 tile
    E, first = (E_all, 0) if ep == "all" else (E_all // 2, E_all // 2)
    w = random_experts(E, H, I, dev, seed=N)
    ids, weights = routing(N, k, E_all, dev, seed=N + 1)
    x = torch.randn(N, H, device=dev).bfloat16()
    tiles = mxfp4_moe.TileConfig(block_m=16 if N < 100 else 32, block_n=32 if N == 3 else 64, dot_scaled=dot_scaled,
                                  split_k=split_k)
    got = mxfp4_moe.fused_experts(x, ids, weights, w["gu_blocks"], w["gu_scales"], w["gu_bias"], w["dn_blocks"],
                                  w["dn_scales"], w["dn_bias"], first=first, num_experts=E_all, limit=LIMIT,
                                  alpha=SWIGLU_ALPHA, tiles=tiles)
    want = reference_f64(x, ids, weights, w, first)
    assert got.shape == (N, H) and got.dtype == torch.bfloat16
    assert rel(got, want) < 1e-2
    # the bf16 dequantised path (the CPU/reference backend) on the same tensors
    bf = {key: mxfp4.dequantize(w[f"{p}_blocks"], w[f"{p}_scales"], torch.bfloat16) for key, p in
          (("gate_up_proj", "gu"), ("down_proj", "dn"))}
    local = (ids - first).flatten()
    mine = (local >= 0) & (local < E)
    ref_bf16 = torch.zeros(N * k, H, device=dev, dtype=torch.float32)
    for e in range(E):
        rows = torch.nonzero(mine & (local == e)).flatten()
        h = (x[rows // k] @ bf["gate_up_proj"][e] + w["gu_bias"][e].bfloat16())
        gate, up = h[:, 0::2].clamp(max=LIMIT), h[:, 1::2].clamp(-LIMIT, LIMIT)
        y = ((up + 1) * gate * torch.sigmoid(gate * SWIGLU_ALPHA)) @ bf["down_proj"][e] + w["dn_bias"][e].bfloat16()
        ref_bf16[rows] = y.float() * weights.flatten()[rows, None]
    assert rel(got, ref_bf16.view(N, k, H).sum(1)) < 2e-2


@pytest.mark.gpu
@needs_gpu
def test_kernel_under_cuda_graph_replays_new_routing():
    from trtllm_dflash.runtime import mxfp4_moe
    dev, E, k, H, I, N = torch.device("cuda"), 16, 4, 256, 128, 8
    w = random_experts(E, H, I, dev)
    ids, weights = routing(N, k, E, dev, 1)
    x = torch.randn(N, H, device=dev).bfloat16()

    def run():
        return mxfp4_moe.fused_experts(x, ids, weights, w["gu_blocks"], w["gu_scales"], w["gu_bias"], w["dn_blocks"],
                                       w["dn_scales"], w["dn_bias"], first=0, num_experts=E, limit=LIMIT,
                                       alpha=SWIGLU_ALPHA)
    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (2, 3):  # new routing and activations in the same buffers: the graph must follow them
        new_ids, new_w = routing(N, k, E, dev, seed)
        ids.copy_(new_ids), weights.copy_(new_w), x.normal_()
        graph.replay()
        assert rel(out, reference_f64(x, ids, weights, w, 0)) < 1e-2


@pytest.mark.gpu
@needs_gpu
def test_greedy_dflash_equals_ar_with_the_mxfp4_kernel(tmp_path):
    """A small random MXFP4 gpt-oss (the CPU tests' checkpoint writer) run by the kernels, float32 elsewhere."""
    from tests.tiny import VOCAB, write_gpt_oss_drafter, write_tiny_gpt_oss
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
def test_backend_setting_is_explicit():
    q = {"quantization_config": {"quant_method": "mxfp4"}}
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert mxfp4.resolve_backend("auto", q, cpu) == "dequant"
    assert mxfp4.resolve_backend("auto", q, cuda) == "triton"
    assert mxfp4.resolve_backend("auto", {}, cuda) == "dequant"      # bf16 experts: nothing to keep packed
    assert mxfp4.resolve_backend("dequant", q, cuda) == "dequant"
    for setting, cfg, dev in (("triton", q, cpu), ("triton", {}, cuda), ("fast", q, cuda)):
        with pytest.raises(DFlashError, match="mxfp4_moe"):
            mxfp4.resolve_backend(setting, cfg, dev)


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
