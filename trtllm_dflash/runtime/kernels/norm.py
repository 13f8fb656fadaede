# SPDX-License-Identifier: Apache-2.0
"""Row-wise RMSNorm and residual add + RMSNorm in Triton, for the batch-invariant mode (RuntimeConfig.batch_invariant).

One program per row; the whole row sits in one block (BLOCK = hidden rounded up to a power of two) and the launch
(block, warps) is a function of the hidden size alone, so the sum of squares of a row is reduced in the same order
whether 1, 16 or 8192 rows share the launch. The compiled torch chain (models/layers.py rms_norm) leaves the
reduction's tiling to inductor, which picks it from the row count it sees.

The math is the torch path's (layers._rms): float32 statistics, the normalised row rounded to the model dtype,
then times the weight, rounded again; with a residual, x + delta rounded to the model dtype first (the new
residual stream), then its norm.

Under ``TRITON_INTERPRET=1`` (set before this module is imported) it runs on CPU tensors, which the CPU tests use.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pow2


@triton.jit
def _rms_norm_kernel(x_ptr, d_ptr, w_ptr, sum_ptr, out_ptr, H, eps, s_x, s_d, s_s, s_o,
                     BLOCK: tl.constexpr, ADD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < H
    x = tl.load(x_ptr + r * s_x + c, mask=ok, other=0.0)
    if ADD:   # the residual stream: x + delta, rounded to the model dtype as torch's add is
        x = (x.to(tl.float32) + tl.load(d_ptr + r * s_d + c, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + r * s_s + c, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / H + eps)
    y = (xf * inv).to(x.dtype).to(tl.float32) * tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * s_o + c, y.to(out_ptr.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous")
    return x.reshape(-1, x.shape[-1])


def _warps(H: int) -> int:
    # a function of the hidden size only (the reduction's layout follows it): 4 warps up to 4096 columns, then 8
    return 4 if pow2(H) <= 4096 else 8


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, delta: torch.Tensor | None = None):
    """x [..., H], w [H] -> norm(x) [..., H] in x's dtype; with ``delta`` [..., H]: (x + delta, norm(x + delta)),
    layers.add_rms_norm's contract."""
    H = x.shape[-1]
    x2 = _rows(x, "x")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else out
    d2 = _rows(delta, "delta") if delta is not None else x2
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, d2, w, total, out, H, float(eps), x2.stride(0), d2.stride(0), H, H,
                                         BLOCK=pow2(H), ADD=delta is not None, num_warps=_warps(H))
    return out if delta is None else (total, out)
