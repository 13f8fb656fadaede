# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel all-reduce fused with the residual add and RMSNorm that follow it, in one Triton kernel over
CUDA peer memory (the symmetric buffers of runtime/allreduce.py).

A row-parallel projection (o_proj, down_proj) leaves each rank a partial sum; the layer then needs
``total = residual + sum_ranks(partial)`` (the new residual stream) and ``norm(total)`` (the next block's input).
Unfused that is a copy into the symmetric buffer, a one-shot reduce kernel and an add + norm kernel, three
launches on a few KB. Here each program, on every rank:

1. writes its rows of this rank's partial into this rank's symmetric buffer;
2. meets the same program on every peer at a barrier over the signal pads (one slot per program and peer:
   the sender moves the slot on the peer's pad 0 -> 1 with release semantics at system scope, the receiver
   moves its own 1 -> 0 with acquire semantics, so the pads end as they started; all peers at once, _barrier);
3. sums its rows over the ranks' buffers in float32, in rank order 0, 1, ... (every rank computes the same
   bits, and a row's result depends on nothing but the row), rounds to the model dtype as the all-reduce's
   result is, adds the bias (o_proj's, if any) and the residual, rounded as torch's adds are, and normalises the
   row as kernels/norm.py does;
4. meets the peers again, so that no rank overwrites its buffer with the next call's rows while a peer still
   reads this call's.

Programs own rows ``pid, pid + P, ...`` on every rank alike, so a program only ever waits for the peer programs
that wrote the rows it reads. ``P`` is capped by the signal pad (one 32-bit slot per program and rank).

``SYNC=False`` skips the barriers: with the peers' rows already in their buffers (written by the test itself),
Triton's interpreter checks the arithmetic on the CPU; the barriers only mean something across GPUs
(tests/gpu/test_allreduce_cuda.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pow2


@triton.jit
def _barrier(signal_pads, pid, RANK: tl.constexpr, WORLD: tl.constexpr, PEERS: tl.constexpr):
    """Meet program ``pid`` of every rank. One lane per rank (PEERS: WORLD's power of two), so the signals to all
    peers and the waits for all of them are in flight at once and a barrier costs about one NVLink round trip: one
    compare-and-swap loop per peer, each waiting for the last, cost ~10 us a call at 4 ranks (two barriers), more than
    torch's whole one-shot all-reduce (~8 us). A rank signals its own pad too (slot ``pid * WORLD + RANK`` of its own
    pad is nobody else's), so every lane runs the same code. Polls are plain volatile loads, which every thread may
    repeat; the writes are masked exchanges, which Triton issues once per lane: a slot is written only after it was
    seen in the state the write expects (0 before a signal, 1 before taking it), and nobody else writes it between."""
    tl.debug_barrier()   # every thread's stores of this program precede the signal
    p = tl.arange(0, PEERS)
    live = p < WORLD
    pads = tl.load(signal_pads + p, mask=live, other=0).to(tl.pointer_type(tl.uint32))   # [PEERS] every pad
    out = pads + pid * WORLD + RANK     # [PEERS] this rank's slot in each pad
    while tl.max(tl.load(out, mask=live, other=0, volatile=True), 0) != 0:
        pass   # a peer has not taken this rank's previous signal yet
    tl.atomic_xchg(out, 1, mask=live, sem="release", scope="sys")
    mine = tl.load(signal_pads + RANK).to(tl.pointer_type(tl.uint32))
    inbox = mine + pid * WORLD + p      # [PEERS] each peer's slot in this rank's pad
    while tl.min(tl.load(inbox, mask=live, other=1, volatile=True), 0) == 0:
        pass
    tl.atomic_xchg(inbox, 0, mask=live, sem="acquire", scope="sys")
    tl.debug_barrier()   # no thread reads a peer's rows before the wait is over


@triton.jit
def _all_reduce_add_norm_kernel(x_ptr, res_ptr, bias_ptr, w_ptr, total_ptr, out_ptr, buffers, signal_pads,
                                rows, H, eps, s_x, s_r,
                                RANK: tl.constexpr, WORLD: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr,
                                BIAS: tl.constexpr, SYNC: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    c = tl.arange(0, BLOCK)
    ok = c < H
    dtype = x_ptr.dtype.element_ty
    mine = tl.load(buffers + RANK).to(tl.pointer_type(dtype))
    for r in range(pid, rows, progs):
        r64 = tl.cast(r, tl.int64)
        tl.store(mine + r64 * H + c, tl.load(x_ptr + r64 * s_x + c, mask=ok, other=0.0), mask=ok)
    if SYNC:
        _barrier(signal_pads, pid, RANK, WORLD, PEERS)
    for r in range(pid, rows, progs):
        r64 = tl.cast(r, tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):   # rank order, the same on every rank
            peer = tl.load(buffers + p).to(tl.pointer_type(dtype))
            acc += tl.load(peer + r64 * H + c, mask=ok, other=0.0, volatile=True).to(tl.float32)
        _add_norm_store(acc, r64, c, ok, res_ptr, bias_ptr, w_ptr, total_ptr, out_ptr, H, eps, s_r, BIAS, True, False)
    if SYNC:
        _barrier(signal_pads, pid, RANK, WORLD, PEERS)


@triton.jit
def _add_norm_store(acc, r64, c, ok, res_ptr, bias_ptr, w_ptr, total_ptr, out_ptr, H, eps, s_r,
                    BIAS: tl.constexpr, NORM: tl.constexpr, W_FIRST: tl.constexpr):
    """Row r64's float32 sum over the ranks -> the all-reduce's result rounded to the model dtype (+ bias, rounded),
    then with NORM: total = residual + it (rounded as torch's add) into total_ptr and the row's RMSNorm into out_ptr
    (kernels/norm.py's math: normalised, rounded, times the weight; W_FIRST: times the weight in float32, then
    rounded, as gpt-oss's reference norm); without: the sum alone into out_ptr."""
    dtype = out_ptr.dtype.element_ty
    reduced = acc.to(dtype)   # the all-reduce's result in the model dtype
    if BIAS:
        reduced = (reduced.to(tl.float32) + tl.load(bias_ptr + c, mask=ok, other=0.0).to(tl.float32)).to(dtype)
    if NORM:
        total = (tl.load(res_ptr + r64 * s_r + c, mask=ok, other=0.0).to(tl.float32)
                 + reduced.to(tl.float32)).to(dtype)
        tl.store(total_ptr + r64 * H + c, total, mask=ok)
        tf = total.to(tl.float32)
        inv = tl.rsqrt(tl.sum(tf * tf, 0) / H + eps)
        w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
        if W_FIRST:
            y = w * (tf * inv)
        else:
            y = (tf * inv).to(dtype).to(tl.float32) * w
        tl.store(out_ptr + r64 * H + c, y.to(dtype), mask=ok)
    else:
        tl.store(out_ptr + r64 * H + c, reduced, mask=ok)


def _warps(H: int) -> int:
    return 4 if pow2(H) <= 4096 else 8


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            bias: torch.Tensor | None, buffers: torch.Tensor, signal_pads: torch.Tensor,
                            rank: int, world: int, max_programs: int, sync: bool = True):
    """x [..., H] this rank's partial sum, residual [..., H] -> (total, norm(total)) with
    total = residual + (sum over ranks of x) (+ bias), both [..., H] in x's dtype.
    ``buffers`` / ``signal_pads``: int64 [world], every rank's symmetric buffer / signal pad address (each buffer
    holds at least x.numel() elements of x's dtype); ``max_programs``: what the signal pads hold per rank."""
    H = x.shape[-1]
    if x.stride(-1) != 1 or residual.stride(-1) != 1:
        raise ValueError("all_reduce_add_rms_norm: the last dim must be contiguous")
    x2, r2 = x.reshape(-1, H), residual.reshape(-1, H)
    rows = x2.shape[0]
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows:
        grid = (min(rows, max_programs),)
        _all_reduce_add_norm_kernel[grid](
            x2, r2, bias if bias is not None else weight, weight, total, out, buffers, signal_pads,
            rows, H, float(eps), x2.stride(0), r2.stride(0),
            RANK=rank, WORLD=world, PEERS=pow2(world), BLOCK=pow2(H), BIAS=bias is not None, SYNC=sync, num_warps=_warps(H))
    return total, out


# ---- the same without barriers: the data is its own flag (Lamport's protocol) ---------------------------------
# Every rank's Lamport buffer holds SLOTS x world x capacity values. Call k uses slot k % SLOTS: each rank stores its
# partial straight into the peers' buffers (row block ``sender``), then polls its own buffer until no value there
# is the sentinel (-0.0, which no sender stores: its -0.0 goes out as +0.0, the same in any sum), sums, and puts the
# sentinel back over what it read. No signal, no second meeting: a peer can run at most one call ahead (it cannot
# finish call k + 1 before this rank's data for it arrives), so it writes slot (k + 1) % SLOTS while this rank
# reads slot k, and slot k is only written again at call k + SLOTS, after this rank's call k + 1 reached it.
# TensorRT-LLM's and FlashInfer's small-message all-reduces use the same idea; this is our own kernel.
SLOTS = 3
_SLOTS = tl.constexpr(SLOTS)
_SENTINEL = {2: -(1 << 15), 4: -(1 << 31)}   # the bits of -0.0 for 16- and 32-bit floats, as signed ints
_BITS = {2: torch.int16, 4: torch.int32}
_TL_BITS = {2: tl.int16, 4: tl.int32}


@triton.jit
def _lamport_kernel(x_ptr, res_ptr, bias_ptr, w_ptr, total_ptr, out_ptr, buffers, state_ptr,
                    rows, H, cap, eps, s_x, s_r,
                    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, BIAS: tl.constexpr,
                    NORM: tl.constexpr, W_FIRST: tl.constexpr, PUSH: tl.constexpr, REDUCE: tl.constexpr,
                    BITS: tl.constexpr, SENT: tl.constexpr):
    """x [rows, H] this rank's partial (row stride s_x) -> out [rows, H]: with NORM, norm(residual + sum) and total
    = residual + sum; else the sum. ``buffers``: int64 [WORLD] every rank's Lamport buffer (viewed as the dtype's
    bits); ``state_ptr``: int32 [2] this rank's call count and the programs that finished this call. PUSH / REDUCE:
    the two halves (both on GPUs; apart only where Triton's interpreter plays every rank in turn on the CPU)."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    c = tl.arange(0, BLOCK)
    ok = c < H
    call = tl.load(state_ptr)
    base = (call % _SLOTS).to(tl.int64) * WORLD * cap                     # this call's slot
    if PUSH:
        for r in range(pid, rows, progs):
            r64 = tl.cast(r, tl.int64)
            v = tl.load(x_ptr + r64 * s_x + c, mask=ok, other=0.0).to(BITS, bitcast=True)
            v = tl.where(v == SENT, 0, v)                            # -0.0 -> +0.0: never the sentinel
            for p in tl.static_range(WORLD):
                peer = tl.multiple_of(tl.load(buffers + p).to(tl.pointer_type(BITS)), 16)   # 16-byte vector stores
                tl.store(peer + base + RANK * cap + r64 * H + c, v, mask=ok)
    if REDUCE:
        mine = tl.multiple_of(tl.load(buffers + RANK).to(tl.pointer_type(BITS)), 16)
        for r in range(pid, rows, progs):
            r64 = tl.cast(r, tl.int64)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for p in tl.static_range(WORLD):   # rank order, the same on every rank
                src = mine + base + p * cap + r64 * H + c
                v = tl.load(src, mask=ok, other=0, volatile=True)
                while tl.max(tl.where(v == SENT, 1, 0), 0) > 0:      # sender p's row has not all landed yet
                    v = tl.load(src, mask=ok, other=0, volatile=True)
                acc += v.to(x_ptr.dtype.element_ty, bitcast=True).to(tl.float32)
                tl.store(src, tl.full([BLOCK], SENT, BITS), mask=ok)   # ready for call + SLOTS
            _add_norm_store(acc, r64, c, ok, res_ptr, bias_ptr, w_ptr, total_ptr, out_ptr, H, eps, s_r, BIAS, NORM,
                            W_FIRST)
        # the last program of this call moves the count on (every program read it above)
        if tl.atomic_add(state_ptr + 1, 1) == progs - 1:
            tl.store(state_ptr, call + 1)
            tl.store(state_ptr + 1, 0)


def lamport_buffer_elems(max_elems: int, world: int) -> int:
    """Values a rank's Lamport buffer holds for messages up to ``max_elems`` values at ``world`` ranks."""
    return SLOTS * world * max_elems


def fill_sentinel(buffer: torch.Tensor) -> None:
    """Every value of a (new) Lamport buffer -> the sentinel; all ranks do it before any rank's first call."""
    buffer.view(_BITS[buffer.element_size()]).fill_(_SENTINEL[buffer.element_size()])


def lamport_all_reduce(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, eps: float,
                       bias: torch.Tensor | None, buffers: torch.Tensor, state: torch.Tensor, cap: int,
                       rank: int, world: int, max_programs: int = 1024, phases: str = "both",
                       weight_first: bool = False):
    """x [..., H] this rank's partial sum -> with ``residual`` / ``weight``: (total, norm(total)), total = residual +
    (sum over ranks of x) (+ bias); without: (sum (+ bias), None). All in x's dtype, one kernel, no barrier.
    ``buffers``: int64 [world] every rank's Lamport buffer address (``lamport_buffer_elems(cap, world)`` values of x's
    dtype each, filled by ``fill_sentinel``), ``state``: int32 [2] zeros at first, this rank's own; ``cap``: the
    largest message in values. ``phases``: "both" on GPUs; "push" / "reduce" let Triton's interpreter play the
    ranks one after another (every rank pushes, then every rank reduces). ``weight_first``: the norm's rounding
    (False: llama's, normalised and rounded before the weight; True: gpt-oss's, the weight in float32 first)."""
    H = x.shape[-1]
    if x.numel() > cap:
        raise ValueError(f"lamport_all_reduce: {x.numel()} values, the buffers hold {cap}")
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("lamport_all_reduce: the last dim must be contiguous")
    norm = residual is not None
    x2 = x.reshape(-1, H)
    r2 = residual.reshape(-1, H) if norm else x2
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if norm else out
    if rows:
        grid = (min(rows, max_programs),)
        _lamport_kernel[grid](
            x2, r2, bias if bias is not None else x2, weight if norm else x2, total, out, buffers, state,
            rows, H, cap, float(eps), x2.stride(0), r2.stride(0),
            RANK=rank, WORLD=world, BLOCK=pow2(H), BIAS=bias is not None, NORM=norm, W_FIRST=weight_first,
            PUSH=phases in ("both", "push"), REDUCE=phases in ("both", "reduce"),
            BITS=_TL_BITS[x.element_size()], SENT=_SENTINEL[x.element_size()], num_warps=_warps(H))
    return (total, out) if norm else (out, None)
