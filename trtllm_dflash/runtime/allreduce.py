# SPDX-License-Identifier: Apache-2.0
"""The tensor-parallel all-reduce of small messages: one-shot over CUDA peer memory (PyTorch symmetric memory).

A decode layer all-reduces two activations of a few KB (hidden x rows, bf16: 8 KB for Qwen3-8B at batch 1); NCCL's
ring spends most of its time there in launch and protocol latency. The one-shot all-reduce maps every rank's
buffer into each rank's address space: each rank copies its input into its own symmetric buffer, a barrier over
signal pads, and one kernel on every rank reads all peers' buffers and sums them (``torch.ops.symm_mem.
one_shot_all_reduce_copy_out``). No host work, so CUDA graphs capture it. Messages above ``max_bytes`` stay on
NCCL (one-shot reads world_size x the message from NVLink, which loses to NCCL's ring on large ones).

Decode-sized rows (up to LAMPORT_MAX_ROWS) take our Lamport kernel instead (kernels/allreduce_norm.py): each rank
stores its rows straight into the peers' buffers (3 slots x world x 512 KB per dtype, symmetric memory too) and
polls its own until they have all landed, so a call is one kernel, no barrier; where the Triton kernels run, the
all-reduce that feeds a residual add + RMSNorm (after o_proj and down_proj) is that same kernel with them
(``add_rms_norm``). On 2 H200s a fused call took 5.3 us in the Qwen3-8B TP 2 step, against 7.1 us for torch's
one-shot kernel plus 2.1 us for the norm (benchmarks/results/tp_h200x2_lamport/). The kernel that meets the peers at
barriers over torch's signal pads (same protocol as torch's symmetric-memory kernels, so the two interleave on a
stream) stays for larger row counts' measurements (FUSED_MAX_ROWS).

RuntimeConfig.allreduce_strategy (TensorRT-LLM's allreduce_strategy, lower case): "nccl"; "oneshot" (an error
where it cannot run: CPU / gloo, torch without symmetric memory, GPUs without peer access); "auto" = oneshot where
it can run, else NCCL. NVLink multicast (multimem) is not used.

Every rank sums the same buffers, so ranks agree up to the summation order inside the kernel; the runtime's
tokens never depend on that: logits are all-gathered and the drafts broadcast, so every rank samples from the
same bits.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ..errors import DFlashError

STRATEGIES = ("auto", "nccl", "oneshot")
# Messages up to this size take the one-shot path. A starting point for 2-4 ranks over NVLink (a decode layer's
# all-reduce at batch 64 x 4096 hidden in bf16 is 512 KB); `dflash-bench tp_allreduce` measures the crossover.
ONESHOT_MAX_BYTES = 512 * 1024
# torch's one-shot kernel has no float16 build (NotImplementedError for 'Half' on 2 H200s): float16 stays on NCCL
_DTYPES = (torch.bfloat16, torch.float32)
# Rows up to this many take the fused all-reduce + add + RMSNorm kernel: none. It never beat one-shot + the norm
# kernel (bench/tp_allreduce.py, hidden 4096, bf16): on 2 H200s 9.97 vs 8.72 us at 1 row and within 0.05 us from 2 to
# 64 rows (its barriers all peers at once); in the Qwen3-8B TP 4 step (4 H200s), with one compare-and-swap loop per
# peer, 20.1 us a call against 7.7 us for the one-shot kernel alone. It stays for the bench to measure (and for 4+
# ranks, where its barriers at once are still to be timed).
FUSED_MAX_ROWS = 0
# Messages of up to this many rows (and up to LAMPORT_MAX_BYTES, rows of at most LAMPORT_MAX_HIDDEN values: one
# program holds a row) take the Lamport kernel (kernels/allreduce_norm.py): pushed into the peers' buffers, no
# barrier; fused with the residual add + RMSNorm where one follows. Decode steps up to 64 rows.
LAMPORT_MAX_ROWS = 64
LAMPORT_MAX_BYTES = 512 * 1024
LAMPORT_MAX_HIDDEN = 16384
_LAMPORT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)   # our kernel: float16 too


class OneShotAllReduce:
    """One-shot all-reduce of contiguous tensors up to ``max_bytes`` in _DTYPES, over symmetric buffers made once
    (a rendezvous is a collective: every rank makes them at the same point, when the group forms)."""

    def __init__(self, device: torch.device, max_bytes: int = ONESHOT_MAX_BYTES, group=None):
        import torch.distributed._symmetric_memory as symm_mem

        group = group if group is not None else dist.group.WORLD
        self.group_name = group.group_name
        if torch.__version__ < "2.9":   # required before torch 2.9; after, a no-op that warns it is deprecated
            symm_mem.enable_symm_mem_for_group(self.group_name)
        self.max_bytes = max_bytes
        self.buffers, self.peers = {}, {}
        for dtype in _DTYPES:
            buf = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
            handle = symm_mem.rendezvous(buf, self.group_name)
            self.buffers[dtype] = buf
            # every rank's buffer and signal pad, mapped here: int64 [world] each, for the fused kernel
            self.peers[dtype] = (torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device),
                                 torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device))
        self.rank, self.world = handle.rank, handle.world_size
        # Lamport buffers: filled with the sentinel on every rank before any rank's first push lands in them
        from .kernels.allreduce_norm import fill_sentinel, lamport_buffer_elems
        self.lamport = {}
        for dtype in _LAMPORT_DTYPES:
            cap = LAMPORT_MAX_BYTES // dtype.itemsize
            buf = symm_mem.empty(lamport_buffer_elems(cap, self.world), dtype=dtype, device=device)
            fill_sentinel(buf)
            handle = symm_mem.rendezvous(buf, self.group_name)
            ptrs = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)
            state = torch.zeros(2, dtype=torch.int32, device=device)   # this rank's call count, programs done
            self.lamport[dtype] = (buf, ptrs, state, cap)
        torch.cuda.synchronize(device)
        dist.barrier(group)
        # one 32-bit slot per block and rank in each signal pad bounds the fused kernel's blocks (torch before
        # get_signal_pad_size had pads of at least 2 KB)
        pad_bytes = getattr(symm_mem, "get_signal_pad_size", lambda: 2048)()
        self.max_programs = max(1, min(1024, pad_bytes // 4 // self.world))

    def handles(self, x: torch.Tensor) -> bool:
        # torch's one-shot kernel refuses a message whose size is not a multiple of 4 bytes (an odd count of
        # 16-bit values): those stay on NCCL
        nbytes = x.numel() * x.element_size()
        return self.pushes(x) or (x.dtype in self.buffers and x.is_contiguous() and nbytes <= self.max_bytes
                                  and nbytes % 4 == 0)

    def pushes(self, x: torch.Tensor) -> bool:
        """Whether x [..., hidden] takes the Lamport kernel (decode-sized rows: LAMPORT_MAX_ROWS)."""
        return (x.dtype in self.lamport and x.dim() > 0 and x.is_contiguous() and x.shape[-1] <= LAMPORT_MAX_HIDDEN
                and 0 < x.numel() <= self.lamport[x.dtype][3] and x.numel() // x.shape[-1] <= LAMPORT_MAX_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks, a new tensor (x is left as it was)."""
        return self.lamport_call(x)[0] if self.pushes(x) else self.one_shot(x)

    def one_shot(self, x: torch.Tensor) -> torch.Tensor:
        """torch's one-shot kernel (pulls every peer's buffer after a barrier) on a message ``handles`` takes."""
        out = torch.empty_like(x)
        view = self.buffers[x.dtype][: x.numel()].view_as(x)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, x, "sum", self.group_name, out)
        return out

    def lamport_call(self, x, residual=None, weight=None, eps: float = 0.0, bias=None, weight_first: bool = False):
        """kernels/allreduce_norm.lamport_all_reduce on this group's buffers: (sum, None) or (total, norm(total))."""
        from .kernels.allreduce_norm import lamport_all_reduce
        _, ptrs, state, cap = self.lamport[x.dtype]
        return lamport_all_reduce(x, residual, weight, eps, bias, ptrs, state, cap, self.rank, self.world,
                                  weight_first=weight_first)

    def fuses(self, x: torch.Tensor, weight_first: bool = False) -> bool:
        """Whether x [..., hidden] takes add_rms_norm (one kernel) rather than this all-reduce + the norm
        (``weight_first``: gpt-oss's norm rounding, which only the Lamport kernel has)."""
        return self.pushes(x) or (not weight_first and self.handles(x) and x.numel() // x.shape[-1] <= FUSED_MAX_ROWS)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     bias: torch.Tensor | None = None, weight_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(total, norm(total)) with total = residual + the sum of x over the ranks (+ bias), one kernel; x must
        be fused (``fuses``) and its last dim contiguous, as residual's. The Lamport kernel where it ``pushes`` x,
        else the kernel with barriers."""
        if self.pushes(x):
            return self.lamport_call(x, residual, weight, eps, bias, weight_first)
        return self.barrier_add_rms_norm(x, residual, weight, eps, bias)

    def barrier_add_rms_norm(self, x, residual, weight, eps: float, bias=None):
        """add_rms_norm on the kernel that meets the peers at barriers over the signal pads."""
        from .kernels.allreduce_norm import all_reduce_add_rms_norm
        buffers, pads = self.peers[x.dtype]
        return all_reduce_add_rms_norm(x, residual, weight, eps, bias, buffers, pads, self.rank, self.world,
                                       self.max_programs)


def check_strategy(strategy: str, device: torch.device) -> None:
    """An unknown strategy, or "oneshot" off CUDA: an error naming the field (before any rank joins a group)."""
    if strategy not in STRATEGIES:
        raise DFlashError("allreduce_strategy", f"unknown value {strategy!r}", f"use one of {', '.join(STRATEGIES)}")
    if strategy == "oneshot" and device.type != "cuda":
        raise DFlashError("allreduce_strategy", f"'oneshot' runs over CUDA peer memory, not on {device.type} (gloo)",
                          "use allreduce_strategy='nccl' or 'auto' on this device")


def make_small_all_reduce(strategy: str, device: torch.device, rank: int,
                          max_bytes: int | None = None) -> OneShotAllReduce | None:
    """The one-shot all-reduce RuntimeConfig.allreduce_strategy asks for on this group (None: NCCL / gloo only),
    for messages up to ``max_bytes`` (None: ONESHOT_MAX_BYTES). Call on every rank at the same point, after the
    process group formed."""
    check_strategy(strategy, device)
    max_bytes = ONESHOT_MAX_BYTES if max_bytes is None else max_bytes
    if strategy == "nccl" or device.type != "cuda":
        return None
    key = (strategy, str(device), max_bytes)
    if key in _MADE:   # a later engine in the same group (benchmarks build several): the same buffers
        return _MADE[key]
    made, error = None, None
    try:
        made = OneShotAllReduce(device, max_bytes)
    except Exception as err:  # noqa: BLE001  symmetric memory missing from this torch, or no peer access
        error = err
    # Every rank must take the same path (a rank on NCCL beside one on one-shot would wait forever), and a rank
    # that failed must not leave the others waiting here: they agree first, then all refuse or all fall back.
    everywhere = torch.tensor([made is not None], dtype=torch.int32, device=device)
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
    if not everywhere.item():
        why = repr(error) if error is not None else "it failed on another rank"
        if strategy == "oneshot":
            raise DFlashError("allreduce_strategy", f"'oneshot' could not map the ranks' buffers ({why})",
                              "use allreduce_strategy='nccl' (or 'auto': one-shot only where it maps)") from error
        if rank == 0:   # auto: said once, not hidden
            print(f"[trtllm_dflash] note: allreduce_strategy auto: the one-shot all-reduce is unavailable ({why}); "
                  "all-reduces run on NCCL", file=sys.stderr)
        made = None
    _MADE[key] = made
    return made


_MADE: dict[tuple, OneShotAllReduce | None] = {}


def forget() -> None:
    """Drop the buffers made for the group being destroyed (a later group makes its own)."""
    _MADE.clear()
