# SPDX-License-Identifier: Apache-2.0
"""Split-K reductions without a second kernel: the program that completes a tile reduces it.

Every program of a tile stores its float32 partial, then ``last_arrival`` counts it in the tile's int32 counter;
the one that brings the count to ``arrivals`` reads every partial (with ``.cg`` loads: L2, never a stale L1 line)
in a fixed order, so the result is deterministic, writes the output and puts the counter back to 0 for the next
launch (CUDA-graph replays included). The pattern of CUTLASS's split-K semaphore and of stream-K fix-up.
Users: runtime/kernels/decode_attention.py (flash-decoding splits), runtime/mxfp4_moe.py (the gemv experts).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

COUNTERS = 1 << 16   # int32 tile counters per device (256 KB), shared by every user: kernels on one stream
                     # run one after another and each leaves its counters at 0
_counters: dict[tuple, torch.Tensor] = {}


@triton.jit
def last_arrival(cnt_ptr, arrivals):
    """True in the program that completes a tile: the caller's stores are made visible first (CTA barrier, then
    a gpu-scope acq_rel atomic: the release/acquire pattern of CUTLASS's semaphore). The caller resets the
    counter (tl.store(cnt_ptr, 0)) in that program."""
    tl.debug_barrier()
    return tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == arrivals - 1


def tile_counters(device: torch.device, need: int) -> torch.Tensor:
    """The device's zeroed counters, made once, on the first (eager) call: the runner warms every shape up
    before it captures a graph. Every kernel leaves them at 0 again."""
    if need > COUNTERS:
        raise ValueError(f"{need} tile counters needed, more than COUNTERS = {COUNTERS}: use fewer rows per call")
    key = (device.type, device.index)
    if key not in _counters:
        _counters[key] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[key]
