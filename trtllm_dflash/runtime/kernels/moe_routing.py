# SPDX-License-Identifier: Apache-2.0
"""The routing inputs triton_kernels' ``routing_from_bitmatrix`` reads, made from our router's output in one kernel
(runtime/triton_kernels_moe.py): for each token its k expert ids as int16, its k routing weights in the
activations' dtype and its row of the packed expert mask (bit e % 32 of int32 word e // 32 set for each chosen
expert e), plus the zeroed histogram buffer the library sums the mask into (its ``Bitmatrix`` scratchpad, which it
would otherwise clear with a kernel of its own).

Written in torch the same took ~11 small kernels per MoE layer (casts, shifts, a scatter-add, fills): on an H200
the gpt-oss-120b DFlash step (block 10, 36 layers) then ran 986 kernels where our own experts run 518, and its time
outside the expert kernels grew from 3.55 to 4.02 ms (benchmarks/results/mxfp4_decode_h200/triton_kernels/). This is
one launch per layer. The ids of a token are distinct (top-k), so the sum of their bits is their OR.

CUDA-graph safe: grid (tokens,), no host syncs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pack_routing_kernel(ids_ptr, w_ptr, words_ptr, ids16_ptr, w_out_ptr, sums_ptr, n_sums,
                         K: tl.constexpr, BLOCK_K: tl.constexpr, WORDS: tl.constexpr, BLOCK_W: tl.constexpr,
                         SUMS_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    live = ks < K
    ids = tl.load(ids_ptr + row * K + ks, mask=live, other=0)                   # [BLOCK_K] int64 / int32
    w = tl.load(w_ptr + row * K + ks, mask=live, other=0.0)
    tl.store(ids16_ptr + row * K + ks, ids.to(tl.int16), mask=live)
    tl.store(w_out_ptr + row * K + ks, w.to(w_out_ptr.dtype.element_ty), mask=live)
    js = tl.arange(0, BLOCK_W)
    hit = (js[:, None] == (ids // 32).to(tl.int32)[None, :]) & live[None, :]    # [BLOCK_W, BLOCK_K]
    one = tl.full([BLOCK_W, BLOCK_K], 1, tl.uint32)
    bits = tl.where(hit, one << (ids % 32).to(tl.uint32)[None, :], 0)
    words = tl.sum(bits, axis=1)                                                # [BLOCK_W] uint32
    tl.store(words_ptr + row * WORDS + js, words.to(tl.int32, bitcast=True), mask=js < WORDS)
    if row == 0:
        zs = tl.arange(0, SUMS_BLOCK)
        tl.store(sums_ptr + zs, tl.zeros([SUMS_BLOCK], tl.int32), mask=zs < n_sums)


def pack_routing(ids: torch.Tensor, weights: torch.Tensor, num_experts: int, dtype: torch.dtype,
                 sums: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, weights [N, k] (N >= 1) -> words [N, ceil(E/32)] int32, ids [N, k] int16, weights [N, k] ``dtype``,
    and ``sums`` int32 zeros."""
    n, k = ids.shape
    n_words = -(-num_experts // 32)
    dev = ids.device
    words = torch.empty(n, n_words, dtype=torch.int32, device=dev)
    ids16 = torch.empty(n, k, dtype=torch.int16, device=dev)
    w_out = torch.empty(n, k, dtype=dtype, device=dev)
    zeros = torch.empty(sums, dtype=torch.int32, device=dev)
    _pack_routing_kernel[(n,)](ids.contiguous(), weights.contiguous(), words, ids16, w_out, zeros, sums,
                               K=k, BLOCK_K=triton.next_power_of_2(k), WORDS=n_words,
                               BLOCK_W=triton.next_power_of_2(n_words), SUMS_BLOCK=triton.next_power_of_2(sums))
    return words, ids16, w_out, zeros
