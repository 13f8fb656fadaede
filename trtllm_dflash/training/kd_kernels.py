# SPDX-License-Identifier: Apache-2.0
"""The KD loss's two passes over a chunk of draft logits in Triton (CUDA): what the fused loss needs from each
[rows, vocab] row is its logsumexp, its argmax and its softmax, and in torch that is ~10 full passes of
elementwise kernels over a float32 copy (H100, SmolLM2 at batch 64: the loss phase went from 171 to 79 ms per step
with these two kernels, benchmarks/results/train_step_h100/). Here:

  row_stats  one read of the bf16 logits per row: online max and sum of exponentials in float32, and the first
             index of the maximum (torch.argmax's tie rule) -> logsumexp [rows], argmax [rows];
  softmax    exp(z - logsumexp) in float32, for the TF32 product with lm_head's weight.

Imported only where used (kd_loss on CUDA); the CPU keeps the torch ops, and tests/test_kd_kernels.py runs these in
Triton's interpreter against them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 2048


@triton.jit
def _row_stats(z_ptr, lse_ptr, arg_ptr, V, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    best = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        cols = start + offs
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, axis=0)
        bi = tl.argmax(x, axis=0, tie_break_left=True) + start
        best = tl.where(bm > m, bi, best)      # strictly greater: an earlier block's maximum wins ties
        m_new = tl.maximum(m, bm)
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    tl.store(lse_ptr + row, m + tl.log(s))
    tl.store(arg_ptr + row, best.to(tl.int64))


@triton.jit
def _softmax(z_ptr, lse_ptr, q_ptr, V, stride_z, stride_q, BLOCK: tl.constexpr):
    row, blk = tl.program_id(0), tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(z_ptr + row.to(tl.int64) * stride_z + cols, mask=cols < V, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    tl.store(q_ptr + row.to(tl.int64) * stride_q + cols, tl.exp(x - lse), mask=cols < V)


def row_stats(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp [n] float32, argmax [n] int64) of logits ``z`` [n, V] (any float dtype, unit column stride)."""
    n, V = z.shape
    lse = torch.empty(n, dtype=torch.float32, device=z.device)
    arg = torch.empty(n, dtype=torch.int64, device=z.device)
    if n:
        _row_stats[(n,)](z, lse, arg, V, z.stride(0), BLOCK=BLOCK_V)
    return lse, arg


def softmax(z: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(z - lse[:, None]) as float32 [n, V]."""
    n, V = z.shape
    q = torch.empty(n, V, dtype=torch.float32, device=z.device)
    if n:
        _softmax[(n, triton.cdiv(V, BLOCK_V))](z, lse, q, V, z.stride(0), q.stride(0), BLOCK=BLOCK_V)
    return q
