# SPDX-License-Identifier: Apache-2.0
"""gpt-oss's router on the decode path (RuntimeConfig.kernels "triton"): after the router GEMM
(nn.Linear with bias), top-k and softmax over the k chosen logits in one kernel, one program per token; it
replaces torch.topk + torch.softmax (two or more kernels per layer).

``topk_softmax`` follows the router GEMM (nn.Linear: a cuBLAS GEMM, and at decode sizes its split-K reduction:
three kernels per layer with this one). ``route`` is the GEMM and the top-k in one kernel: the router weight split
over programs by expert (BLOCK_E rows each, every program takes a block of BLOCK_N tokens through tl.dot), each
program's logits rounded as nn.Linear's output is and stored, and the last program of a token block to arrive
(kernels/arrival.py) runs the top-k + softmax of those tokens. An earlier one-kernel variant in which each
token's program read the whole weight measured slower on the H100 (120b's 128 x 2880 router: 69 vs 9.4 us;
benchmarks/results/gpt_oss_kernels_bench_h100.json): one program cannot stream the weight fast enough.

Semantics (transformers' GptOssTopKRouter): ids = the k largest logits of a row, largest first; weights =
softmax over those k logits, computed in float32 and returned in the logits' dtype (as torch.softmax of a
bf16 tensor: float32 inside, one rounding out). Ties: among equal logits the lower expert id comes first, the
order of a stable descending sort (``torch.sort(..., descending=True, stable=True)``). torch.topk documents no
order for ties and follows none a kernel could copy (on CPU, top-4 of 32 equal logits is [22, 21, 20, 23]);
without ties at the k-th place it chooses the same set, and the experts' sum over k does not depend on the
order. With a tie at the k-th place (bf16 router logits can tie) either choice is one the reference could
make; tests/gpu/test_gpt_oss_kernels_cuda.py records how often CUDA's topk and this kernel differ on real-shape
bf16 logits. NaN logits are not supported (the router never makes them).

CUDA-graph safe: fixed grids, no host syncs; ``route``'s counters are back at 0 after every launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arrival import last_arrival, tile_counters


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



@triton.jit
def _route_kernel(x_ptr, w_ptr, b_ptr, logits_ptr, cnt_ptr, ids_ptr, wt_ptr, N, E, H, s_x, s_w, s_l, s_i, s_o,
                  K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                  ALL_E: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_n, pid_e = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    es = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    hh = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + hh
        xs = tl.load(x_ptr + rows[:, None] * s_x + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < H),
                     other=0.0)                                                      # [BLOCK_N, BLOCK_H]
        ws = tl.load(w_ptr + es[:, None] * s_w + cols[None, :], mask=(es[:, None] < E) & (cols[None, :] < H),
                     other=0.0)                                                      # [BLOCK_E, BLOCK_H]
        if IEEE:   # float32 weights: no TF32 (the float32 reference paths compare bit-for-bit-near)
            acc = tl.dot(xs, tl.trans(ws), acc, input_precision="ieee")
        else:
            acc = tl.dot(xs, tl.trans(ws), acc)
    b = tl.load(b_ptr + es, mask=es < E, other=0.0).to(tl.float32)
    # nn.Linear's output: float32 sum + bias, one rounding to the activations' dtype; the top-k reads those values
    logits = (acc + b[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(logits_ptr + rows[:, None] * s_l + es[None, :], logits, mask=(rows[:, None] < N) & (es[None, :] < E))
    if last_arrival(cnt_ptr + pid_n, tl.num_programs(1)):
        tl.store(cnt_ptr + pid_n, 0)
        e = tl.arange(0, ALL_E)
        for r in range(BLOCK_N):
            row = pid_n * BLOCK_N + r
            if row < N:
                x = tl.load(logits_ptr + row * s_l + e, mask=e < E, other=float("-inf"), cache_modifier=".cg")
                _topk_softmax_row(x, e, E, ids_ptr + row * s_i, wt_ptr + row * s_o, K, ALL_E, BLOCK_K)


ROUTE_BLOCK_E = 16   # router rows per program: 128 experts -> 8 programs per token block, 32 -> 2
ROUTE_BLOCK_H = 128  # hidden features per tl.dot step


def route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, H], the router's weight [E, H] and bias [E] -> (ids [N, k] int64, weights [N, k] in x's dtype): what
    ``topk_softmax(nn.functional.linear(x, weight, bias), k)`` gives, in one kernel (the logits' float32 sums
    may differ from cuBLAS's in the last bits, as any other GEMM's would)."""
    N, H = x.shape
    E = weight.shape[0]
    if not 0 < k <= E:
        raise ValueError(f"top-{k} of {E} experts")
    if weight.shape != (E, H) or bias.shape != (E,) or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"route: x [N, H] {tuple(x.shape)}, weight [E, H] {tuple(weight.shape)} and bias [E] "
                         f"{tuple(bias.shape)} with contiguous last dims")
    ids = torch.empty(N, k, dtype=torch.int64, device=x.device)
    weights = torch.empty(N, k, dtype=x.dtype, device=x.device)
    if N:
        block_n = 16 if N <= 16 else 32                     # tl.dot's smallest M side; decode pads to it
        blocks = triton.cdiv(N, block_n)
        logits = torch.empty(N, E, dtype=torch.float32, device=x.device)   # [N, E] the rounded logits
        _route_kernel[(blocks, triton.cdiv(E, ROUTE_BLOCK_E))](
            x, weight, bias, logits, tile_counters(x.device, blocks), ids, weights, N, E, H,
            x.stride(0), weight.stride(0), logits.stride(0), ids.stride(0), weights.stride(0),
            K=k, BLOCK_N=block_n, BLOCK_E=ROUTE_BLOCK_E, BLOCK_H=ROUTE_BLOCK_H, ALL_E=triton.next_power_of_2(E),
            BLOCK_K=triton.next_power_of_2(k), IEEE=x.dtype == torch.float32, num_warps=4)
    return ids, weights
