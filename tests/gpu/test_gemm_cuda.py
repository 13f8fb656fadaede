# SPDX-License-Identifier: Apache-2.0
"""The decode-path Triton GEMMs (runtime/kernels/gemm.py) on the GPU in bf16 at real shapes (SmolLM2-135M,
Qwen3-8B, Llama-3.1-8B, gpt-oss-120b o_proj / gate_up_proj / down_proj at M = 1, 16, 64; split K where split_for
splits it, and each split count forced at gpt-oss's shapes), against cuBLAS + the torch
epilogue they replace and a float64 reference; CUDA-graph capture and replay; a Qwen3-8B-shaped layer of the
target with the kernels against the torch path.

Tolerances (relative, norm-wise). The kernel accumulates in float32 and rounds once to bf16 (2^-9 relative per
element): 4e-3 against float64. The torch path rounds the GEMM output and then the residual sum (or the gate,
the up, the SiLU and the product) to bf16 separately: 1e-2 between the two. A wrong row, column or K tile
gives O(1) errors. The layer test compares hidden states after several bf16 roundings on both sides: 2e-2.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.runtime.compare import rel
from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.models import layers as L

pytestmark = pytest.mark.gpu
DEV, BF16 = torch.device("cuda"), torch.bfloat16
# (name, hidden, intermediate, q heads x head_dim) of the public configs (checkpoints/resolve.py)
SHAPES = [("smollm2-135m", 576, 1536, 576), ("qwen3-8b", 4096, 12288, 4096), ("llama-3.1-8b", 4096, 14336, 4096),
          ("gpt-oss-120b", 2880, 2880, 4096)]   # attention's o_proj (4096 -> 2880); its MLP is MoE, timed as dense here


def kernels():
    from trtllm_dflash.runtime.kernels import gemm
    return gemm


def randn(*shape, seed=0, scale=1.0):
    g = torch.Generator(DEV).manual_seed(seed)
    return (torch.randn(*shape, device=DEV, generator=g) * scale).to(BF16)


@pytest.mark.parametrize("name,hidden,inter,attn", SHAPES)
@pytest.mark.parametrize("M", [1, 16, 64])
def test_linear_residual_bf16(name, hidden, inter, attn, M):
    G = kernels()
    for K in (attn, inter):   # o_proj, down_proj
        x, w, r = randn(M, K, seed=1), randn(hidden, K, seed=2, scale=K ** -0.5), randn(M, hidden, seed=3)
        got = G.linear(x, w, None, r)
        want64 = x.double() @ w.double().T + r.double()
        assert rel(got, want64) < 4e-3, K
        assert rel(got, F.linear(x, w) + r) < 1e-2, K
        assert rel(G.linear(x, w), x.double() @ w.double().T) < 4e-3, K   # no epilogue (tp > 1)


@pytest.mark.parametrize("N,K", [(5120, 2880), (2880, 4096)])   # gpt-oss's qkv_proj and o_proj
@pytest.mark.parametrize("M", [1, 10])
def test_split_k_bf16(N, K, M):
    """Every split count against float64 and against no split (the same float32 partial sums added in another
    order, one bf16 rounding: within 4e-3), repeated calls bit-identical (the slice-order reduction)."""
    G = kernels()
    x, w, r = randn(M, K, seed=6), randn(N, K, seed=7, scale=K ** -0.5), randn(M, N, seed=8)
    want64 = x.double() @ w.double().T + r.double()
    one = G.linear(x, w, None, r, split=1)
    for split in (2, 4):
        got = G.linear(x, w, None, r, split=split)
        assert rel(got, want64) < 4e-3 and rel(got, one) < 4e-3, split
        assert torch.equal(G.linear(x, w, None, r, split=split), got), split


@pytest.mark.parametrize("name,hidden,inter,attn", SHAPES)
@pytest.mark.parametrize("M", [1, 16, 64])
def test_gate_up_silu_bf16(name, hidden, inter, attn, M):
    G = kernels()
    x, w = randn(M, hidden, seed=4), randn(2 * inter, hidden, seed=5, scale=hidden ** -0.5)
    got = G.gate_up_silu(x, w)
    y = x.double() @ w.double().T
    assert rel(got, F.silu(y[:, :inter]) * y[:, inter:]) < 4e-3
    assert rel(got, L.silu_mul(F.linear(x, w))) < 1e-2


def test_rows_do_not_depend_on_the_batch_up_to_16():
    """pick_config gives M = 1 and M = 16 the same tiles, so a row's bits do not depend on how many rows share the
    launch: an AR step (1 row) and a DFlash verify (16 rows) compute a token's projections identically."""
    G = kernels()
    x, w, r = randn(16, 4096, seed=16), randn(12288, 4096, seed=17, scale=1 / 64), randn(16, 12288, seed=18)
    for m in (1, 5):
        assert torch.equal(G.linear(x[:m], w, None, r[:m]), G.linear(x, w, None, r)[:m])
        assert torch.equal(G.gate_up_silu(x[:m], w), G.gate_up_silu(x, w)[:m])


def test_bias_and_every_benchmarked_config_at_qwen3_shapes():
    """The configs trtllm_dflash/bench/gemm.py tries compile and are correct on this GPU (o_proj with a bias, as the
    drafter's may have one)."""
    G = kernels()
    from trtllm_dflash.bench.gemm import candidates
    for M in (1, 16, 64):
        x, w, b, r = randn(M, 4096, seed=6), randn(4096, 4096, seed=7, scale=1 / 64), randn(4096, seed=8), \
            randn(M, 4096, seed=9)
        want = x.double() @ w.double().T + b.double() + r.double()
        for cfg in candidates(G, M, smoke=False):
            assert rel(G.linear(x, w, b, r, cfg), want) < 4e-3, cfg


def test_cuda_graph_replay():
    """Captured after two warm-up calls on a side stream (as the runner does); replays follow new inputs."""
    G = kernels()
    x, w, wg, r = randn(4, 576, seed=10), randn(576, 576, seed=11, scale=1 / 24), \
        randn(3072, 576, seed=12, scale=1 / 24), randn(4, 576, seed=13)
    graph, (out, act) = capture(lambda: (G.linear(x, w, None, r), G.gate_up_silu(x, wg)))
    x.copy_(randn(4, 576, seed=14))
    r.copy_(randn(4, 576, seed=15))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, x.double() @ w.double().T + r.double()) < 4e-3
    y = x.double() @ wg.double().T
    assert rel(act, F.silu(y[:, :1536]) * y[:, 1536:]) < 4e-3


@pytest.mark.parametrize("T", [1, 16])
def test_qwen3_8b_layer_with_the_kernels(T):
    """One Qwen3-8B-shaped decoder layer (random weights), prefill 32 tokens then a decode step of T tokens:
    hidden states and the feature tap with the kernels (attention + GEMMs) == the torch path."""
    from trtllm_dflash.model_config import LlamaConfig
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.kernels import Kernels
    from trtllm_dflash.runtime.kv_cache import KVCache
    from trtllm_dflash.runtime.models.llama import LlamaTarget
    c = LlamaConfig(architecture="Qwen3ForCausalLM", vocab_size=256, hidden_size=4096, intermediate_size=12288, num_layers=1,
                    num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
                    rope={"rope_theta": 1e6, "rope_type": "default"}, max_position_embeddings=4096,
                    tie_word_embeddings=False, attention_bias=False, qk_norm=True)
    models = {}
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)   # the same random weights in both
        with torch.device(DEV):
            models[kernel] = LlamaTarget(c, TPGroup(), 256, capture_layers=(0,),
                                         kernels=Kernels.choose(kernel, False, DEV, BF16)).to(BF16)
    ids = torch.randint(0, 256, (1, 32 + T), device=DEV)
    out = {}
    with torch.inference_mode():
        for kernel, model in models.items():
            cache = KVCache(1, 1, 8, 128, 128, BF16, DEV)
            model(ids[:, :32], torch.arange(32, device=DEV)[None], cache, slice(0, 1), None)
            out[kernel] = model(ids[:, 32:], torch.arange(32, 32 + T, device=DEV)[None], cache, slice(0, 1), 32 + T)
    assert rel(out["triton"][0], out["torch"][0]) < 2e-2
    assert rel(out["triton"][1], out["torch"][1]) < 2e-2
