# SPDX-License-Identifier: Apache-2.0
"""gpt-oss's router on the decode path (RuntimeConfig.attention_kernel "triton"): top-k and softmax over the k
chosen logits, one program per token, either after the router GEMM (``topk_softmax``: nn.Linear with bias, then
this kernel) or with the GEMM in the same kernel (``route``: each program reads the whole router weight, E x
hidden, so it pays where that is small; MoE.forward picks by ROUTE_MAX_WEIGHT_BYTES). Either replaces
torch.topk + torch.softmax (two or more kernels per layer).

Semantics (transformers' GptOssTopKRouter): ids = the k largest logits of a row, largest first; weights =
softmax over those k logits, computed in float32 and returned in the logits' dtype (as torch.softmax of a
bf16 tensor: float32 inside, one rounding out). Ties: among equal logits the lower expert id comes first, the
order of a stable descending sort (``torch.sort(..., descending=True, stable=True)``). torch.topk documents no
order for ties and follows none a kernel could copy (on CPU, top-4 of 32 equal logits is [22, 21, 20, 23]);
without ties at the k-th place it chooses the same set, and the experts' sum over k does not depend on the
order. With a tie at the k-th place (bf16 router logits can tie) either choice is one the reference could
make; tests/gpu/test_gpt_oss_kernels_cuda.py records how often CUDA's topk and this kernel differ on real-shape
bf16 logits. NaN logits are not supported (the router never makes them).

``route`` computes the logits in float32 (bf16 products, float32 sums, the bias added in float32) and rounds
them to x's dtype before the top-k, as the nn.Linear it replaces returns them: the same values up to the
order of the float32 sum, so where two logits are within a rounding of each other the choice can differ.

CUDA-graph safe: grid (tokens,), no host syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


# Router weights up to this size, at up to this many tokens, run the one-kernel ``route`` (each token's program
# reads all of the weight); larger ones (gpt-oss-120b's 128 x 2880 bf16 = 737 KB) and prefill chunks the GEMM +
# ``topk_softmax``. 256 KB puts gpt-oss-20b's router (32 x 2880 bf16 = 184 KB) on ``route`` at decode sizes;
# benchmarks/gpt_oss_kernels_bench.py's router part times both, which is where these numbers are to be set.
ROUTE_MAX_WEIGHT_BYTES = 256 * 1024
ROUTE_MAX_TOKENS = 64


@triton.jit
def _topk_softmax_row(x, e, E, ids_ptr, w_ptr, K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [BLOCK_E] float32 logits of one token (lanes e >= E ignored) -> its ids and weights stored at ids_ptr,
    w_ptr (K each)."""
    kk = tl.arange(0, BLOCK_K)
    taken = e >= E                      # padding lanes can never be chosen (even if every logit is -inf)
    vals = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for j in tl.static_range(K):        # k passes of argmax, each taking the lowest id among the maxima
        cand = tl.where(taken, float("-inf"), x)
        best = tl.max(cand, 0)
        pick = tl.min(tl.where((cand == best) & ~taken, e, BLOCK_E), 0)
        taken = taken | (e == pick)
        vals = tl.where(kk == j, best, vals)
        ids = tl.where(kk == j, pick, ids)
    # softmax over the k chosen: vals[0] is their max
    p = tl.where(kk < K, tl.exp(vals - tl.max(tl.where(kk < K, vals, float("-inf")), 0)), 0.0)
    w = p / tl.sum(p, 0)
    tl.store(ids_ptr + kk, ids.to(ids_ptr.dtype.element_ty), mask=kk < K)
    tl.store(w_ptr + kk, w.to(w_ptr.dtype.element_ty), mask=kk < K)


@triton.jit
def _topk_softmax_kernel(logits_ptr, ids_ptr, w_ptr, E, s_l, s_i, s_w,
                         K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + tok * s_l + e, mask=e < E, other=float("-inf")).to(tl.float32)   # exact upcast
    _topk_softmax_row(x, e, E, ids_ptr + tok * s_i, w_ptr + tok * s_w, K, BLOCK_E, BLOCK_K)


@triton.jit
def _route_kernel(x_ptr, wr_ptr, b_ptr, ids_ptr, w_ptr, E, H, s_x, s_wr, s_i, s_w,
                  K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    tok = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    acc = tl.zeros([BLOCK_E], tl.float32)
    for h0 in range(0, H, BLOCK_H):     # logits = x @ Wr^T: a [BLOCK_E, BLOCK_H] tile of the weight per step
        hh = h0 + tl.arange(0, BLOCK_H)
        h_ok = hh < H
        xv = tl.load(x_ptr + tok * s_x + hh, mask=h_ok, other=0.0).to(tl.float32)
        wv = tl.load(wr_ptr + e[:, None] * s_wr + hh[None, :], mask=e_ok[:, None] & h_ok[None, :], other=0.0)
        acc += tl.sum(wv.to(tl.float32) * xv[None, :], 1)
    acc += tl.load(b_ptr + e, mask=e_ok, other=0.0).to(tl.float32)
    # rounded to the model dtype, as nn.Linear returns the logits the reference's top-k sees
    x = tl.where(e_ok, acc.to(x_ptr.dtype.element_ty).to(tl.float32), float("-inf"))
    _topk_softmax_row(x, e, E, ids_ptr + tok * s_i, w_ptr + tok * s_w, K, BLOCK_E, BLOCK_K)


def topk_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E] (the router's output, last dim contiguous) -> (ids [N, k] int64, weights [N, k] in the
    logits' dtype): what ``logits.topk(k)`` then ``softmax`` over the k values give, as MoE's experts take them."""
    N, E = logits.shape
    if not 0 < k <= E:
        raise ValueError(f"top-{k} of {E} experts")
    if logits.stride(1) != 1:
        raise ValueError("logits: the last dim must be contiguous")
    ids = torch.empty(N, k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(N, k, dtype=logits.dtype, device=logits.device)
    if N:
        _topk_softmax_kernel[(N,)](logits, ids, weights, E, logits.stride(0), ids.stride(0), weights.stride(0),
                                   K=k, BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(k),
                                   num_warps=1 if E <= 64 else 2)
    return ids, weights


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, hidden], the router's weight [E, hidden] and bias [E] -> (ids [N, k] int64, weights [N, k] in x's
    dtype): topk_softmax(F.linear(x, weight, bias), k) in one kernel (logits rounded to x's dtype first)."""
    N, H = x.shape
    E = weight.shape[0]
    if not 0 < k <= E:
        raise ValueError(f"top-{k} of {E} experts")
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != H or bias.shape != (E,):
        raise ValueError(f"route: x [N, {H}], weight [E, {H}] (last dims contiguous) and bias [E] expected, got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}, {tuple(bias.shape)}")
    ids = torch.empty(N, k, dtype=torch.int64, device=x.device)
    weights = torch.empty(N, k, dtype=x.dtype, device=x.device)
    if N:
        BLOCK_E = triton.next_power_of_2(E)
        BLOCK_H = max(16, min(triton.next_power_of_2(H), 8192 // BLOCK_E))   # 8K weight elements per step
        _route_kernel[(N,)](x, weight, bias, ids, weights, E, H, x.stride(0), weight.stride(0), ids.stride(0),
                            weights.stride(0), K=k, BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H,
                            BLOCK_K=triton.next_power_of_2(k), num_warps=4)
    return ids, weights


def uses_route(weight: torch.Tensor, tokens: int) -> bool:
    """The rule MoE.forward routes by: the one-kernel ``route`` for router weights up to ROUTE_MAX_WEIGHT_BYTES
    at up to ROUTE_MAX_TOKENS tokens, else the router GEMM + ``topk_softmax``."""
    return weight.numel() * weight.element_size() <= ROUTE_MAX_WEIGHT_BYTES and tokens <= ROUTE_MAX_TOKENS
