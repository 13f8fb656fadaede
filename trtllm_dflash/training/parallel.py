# SPDX-License-Identifier: Apache-2.0
"""Data parallelism for dflash-train: N processes (``torchrun --nproc_per_node N`` or ``mpirun -n N``), one
device each, one process group (NCCL on CUDA, gloo on CPU; the rendezvous of ``runtime/distributed.py``).

Every rank runs the same stages on the same files; decisions that depend on a clock or on the file system are
taken by rank 0 and broadcast (``agree``, ``on_main``), so no rank waits in a collective the others skipped.
Rank 0 alone writes the run's files. A single process (no launcher) is ``DataParallel()``: every method is a
no-op and no process group exists.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DFlashError
from ..runtime.distributed import broadcast_object, init_tp, launcher_rank_and_size, local_rank

# A rank waits this long for the slowest one (rank 0 probing, loading shards, checkpointing) before giving up.
TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.active:
            dist.all_reduce(x)
        return x

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank."""
        return broadcast_object(obj) if self.active else obj

    def all_gather_object(self, obj) -> list:
        if not self.active:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def agree(self, value: float) -> float:
        """Rank 0's value (a clock reading) on every rank: decisions taken on it are the same everywhere."""
        return self.broadcast_object(value) if self.active else value

    def on_main(self, fn, *args, **kw):
        """Run ``fn`` on rank 0 only; every rank returns its result, or raises its error (as a DFlashError
        with the same text on the other ranks), so a failure there cannot leave the others waiting."""
        result, err = None, None
        if self.is_main:
            try:
                result = fn(*args, **kw)
            except BaseException as e:   # noqa: BLE001 - re-raised below, after the others have heard of it
                err = e
        if not self.active:
            if err is not None:
                raise err
            return result
        box = self.broadcast_object((result, None if err is None else str(err)))
        if err is not None:
            raise err
        if box[1] is not None:
            raise DFlashError("rank 0", box[1])
        return box[0]

    def broadcast_params(self, params: list[torch.Tensor]) -> None:
        """Rank 0's values of ``params`` on every rank (the draft starts the same everywhere)."""
        if self.active:
            for p in params:
                dist.broadcast(p.data, src=0)

    def close(self) -> None:
        """Leave the group after a barrier (every rank waits for the slowest, rank 0 exporting)."""
        if self.active and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
            _STORE.clear()   # rank 0's store server stops here, while Python still runs


SINGLE = DataParallel()
_STORE: list = []


def device_for(requested: str, local: int) -> torch.device:
    """--device resolved for this rank: auto = cuda if available; a bare ``cuda`` is this rank's GPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(requested)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
    return dev


def init(requested_device: str) -> tuple[DataParallel, torch.device]:
    """Join the data-parallel group the launcher started (none without a launcher); returns it and this rank's
    device. Ranks on CUDA must each get a GPU of their own."""
    rank, size = launcher_rank_and_size()
    local = local_rank(rank) if size > 1 else 0
    device = device_for(requested_device, local)
    if size == 1:
        return SINGLE, device
    if device.type == "cuda":
        if torch.cuda.device_count() < min(size, local + 1):
            raise DFlashError("ranks", f"{size} ranks started on a host with {torch.cuda.device_count()} GPU(s)",
                              f"start at most {torch.cuda.device_count()} (torchrun --nproc_per_node N)")
        if requested_device not in ("auto", "cuda"):
            raise DFlashError("--device", f"is {requested_device} under {size} ranks (each rank takes the GPU "
                              "of its LOCAL_RANK)", "pass --device cuda or auto")
        torch.cuda.set_device(device)
    if all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        # torchrun: its agent already serves the rendezvous store at MASTER_PORT; join it the standard way
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        return DataParallel(dist.get_rank(), dist.get_world_size(), local), device
    # mpirun / mpiexec: the rendezvous port agreed over MPI; training reduces large gradient buckets with
    # dist.all_reduce itself (DataParallel), so no one-shot buffers
    group = init_tp(size, device, TIMEOUT_S, allreduce_strategy="nccl")
    _STORE.append(group)   # its rendezvous store lives until close(), as the tensor-parallel group's does
    return DataParallel(group.rank, group.size, local), device
