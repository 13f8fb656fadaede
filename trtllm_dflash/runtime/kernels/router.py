# SPDX-License-Identifier: Apache-2.0
"""gpt-oss's router on the decode path (RuntimeConfig.kernels "triton"): after the router GEMM
(nn.Linear with bias), top-k and softmax over the k chosen logits in one kernel, one program per token; it
replaces torch.topk + torch.softmax (two or more kernels per layer).

The GEMM stays a separate (cuBLAS) kernel: a one-kernel variant in which each token's program read the whole
router weight measured slower on the H100 (gpt-oss-20b's 32 x 2880 router: 19 us vs 8.8 us for GEMM + this
kernel; 120b's 128 x 2880: 69 vs 9.4 us; benchmarks/results/gpt_oss_kernels_bench_h100.json): one program
cannot stream the weight fast enough. The weight split over programs by 16 experts, each taking a token block
through tl.dot, with the last to arrive doing the top-k (kernels/arrival.py), was slower too on an H200 (120b: 11.0
vs 9.9 us at 1 token, 22 vs 10 at 10, 52 vs 10 at 64; its gpt-oss-120b AR step 3.84 vs 3.70 ms;
benchmarks/results/mxfp4_decode_h200/router/): 8 programs of 23 serial K steps leave HBM idle where cuBLAS's
split-K keeps many CTAs loading. Beating the pair would take a split over the hidden dimension as well.

Semantics (transformers' GptOssTopKRouter): ids = the k largest logits of a row, largest first; weights =
softmax over those k logits, computed in float32 and returned in the logits' dtype (as torch.softmax of a
bf16 tensor: float32 inside, one rounding out). Ties: among equal logits the lower expert id comes first, the
order of a stable descending sort (``torch.sort(..., descending=True, stable=True)``). torch.topk documents no
order for ties and follows none a kernel could copy (on CPU, top-4 of 32 equal logits is [22, 21, 20, 23]);
without ties at the k-th place it chooses the same set, and the experts' sum over k does not depend on the
order. With a tie at the k-th place (bf16 router logits can tie) either choice is one the reference could
make; tests/gpu/test_gpt_oss_kernels_cuda.py records how often CUDA's topk and this kernel differ on real-shape
bf16 logits. NaN logits are not supported (the router never makes them).

CUDA-graph safe: grid (tokens,), no host syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


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

