# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel process group. Ranks come from the MPI launcher's environment (mpirun/mpiexec), the
same way TensorRT-LLM's ranks do; the rendezvous port is agreed over MPI, or given in MASTER_ADDR/PORT."""
from __future__ import annotations

import datetime
import functools
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import DFlashError

_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE")
# The rank within this host: torchrun, Open MPI, MPICH (hydra)
_LOCAL_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def _env_int(names: tuple[str, ...]) -> int | None:
    for n in names:
        if os.environ.get(n, "").isdigit():
            return int(os.environ[n])
    return None


def launcher_rank_and_size() -> tuple[int, int]:
    """(rank, size) as the launcher set them; (0, 1) when started without one.

    TRTLLM_DFLASH_RANK_OFFSET shifts the rank: a server keeps rank 0 in its own process and starts
    the other ranks with ``mpiexec -n N-1`` and offset 1.
    """
    rank = _env_int(_RANK_VARS) or 0
    size = _env_int(_SIZE_VARS) or 1
    return rank + int(os.environ.get("TRTLLM_DFLASH_RANK_OFFSET", "0")), size


def local_rank(rank: int) -> int:
    """This process's rank on its host (its CUDA device): from the launcher, else ``rank`` modulo the devices."""
    local = _env_int(_LOCAL_VARS)
    if local is not None:
        return local
    return rank % max(torch.cuda.device_count(), 1)


@dataclass
class TPGroup:
    """This rank's place in the tensor-parallel group; a single process is ``TPGroup(0, 1)``."""

    rank: int = 0
    size: int = 1
    store: object = None  # the rendezvous store; released in close(), not at interpreter teardown
    # allreduce.OneShotAllReduce where RuntimeConfig.allreduce_strategy chose it: the messages it handles (decode
    # sizes) take it, larger ones NCCL
    small_all_reduce: object = None
    # a gloo group over the same ranks for the per-step SchedulerOutput (host_group()); None: a single process
    host: object = None

    @property
    def active(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks (x itself, reduced in place, on NCCL / gloo; a new tensor on one-shot):
        use the result."""
        if not self.active:
            return x
        small = self.small_all_reduce
        if small is not None and small.handles(x):
            return small(x)
        dist.all_reduce(x)
        return x

    def all_reduce_add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm, bias: torch.Tensor | None = None):
        """(norm(total), total) with total = residual + the sum of x over the ranks (+ bias): a row-parallel
        projection's partial sums into the next residual add + RMSNorm (``norm``: a layers.RMSNorm; its return
        order). One kernel where the one-shot all-reduce runs beside the Triton kernels and fuses x (decode-sized
        rows: the Lamport kernel, allreduce.LAMPORT_MAX_ROWS); else the all-reduce, then the norm's own add + norm."""
        small, weight_first = self.small_all_reduce, norm.weight_first
        if (self.active and small is not None and norm.kernels.triton and small.fuses(x, weight_first)
                and residual.is_contiguous()):
            total, normed = small.add_rms_norm(x, residual, norm.weight, norm.eps, bias, weight_first)
            return normed, total
        return norm.add_norm(self.all_reduce(x), residual, bias)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's x along the last dim (vocab-parallel logits)."""
        if not self.active:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor on every rank (keeps sampled tokens identical across ranks)."""
        if self.active:
            dist.broadcast(x, src=0)
        return x

    def close(self) -> None:
        """Leave the group; gloo aborts the process at exit if a group is still alive."""
        if self.active and dist.is_initialized():
            from .allreduce import forget
            dist.barrier()
            self.small_all_reduce = self.host = None
            forget()   # its buffers belong to this group
            host_group.cache_clear()   # destroyed with the default group below
            dist.destroy_process_group()
            self.store = None  # the store's server thread (rank 0) is joined here, while Python still runs

    def broadcast_object(self, obj):
        """Rank 0's picklable ``obj`` on every rank, over the host group: host memory and sockets only."""
        return broadcast_object(obj, self.host) if self.active else obj


def broadcast_object(obj, group=None):
    """Rank 0's picklable ``obj`` on every rank of ``group`` (None: the default group)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


# How long a rank > 0 waits in the host group for rank 0's next step: an idle server sends none for as long as no
# request comes, so not torch's 30 minutes. A rank whose process ends closes its sockets, which ends the others'
# waits at once with an error.
HOST_GROUP_TIMEOUT = datetime.timedelta(days=30)


@functools.cache   # one per process group; close() clears it with the group
def host_group():
    """The gloo group over the default group's ranks that carries rank 0's SchedulerOutput each step. On NCCL a
    broadcast of a pickled object is GPU work queued behind the step in flight, and the receiving ranks wait on
    the device (torch reads the object's size back) before they can launch the next step. Over gloo the ranks
    receive the next step while the device still runs this one, as rank 0 schedules it (SGLang broadcasts its
    requests over a CPU group for the same reason): on 2 H200s the GPU's idle time per TP 2 step went from 0.89 to
    0.29 ms and the AR step at batch 1 from 4.70 to 4.02 ms (benchmarks/results/tp_h200x2_host_group/). A
    collective: every rank calls it at the same point."""
    return dist.new_group(backend="gloo", timeout=HOST_GROUP_TIMEOUT)


def init_tp(tp_size: int, device: torch.device, timeout_s: float | None = None,
            allreduce_strategy: str = "nccl") -> TPGroup:
    """Join the tensor-parallel group of ``tp_size`` ranks (gloo on CPU, NCCL on CUDA). ``timeout_s``: how long a
    collective may wait for the slowest rank (torch's default when None). ``allreduce_strategy``:
    RuntimeConfig.allreduce_strategy (runtime/allreduce.py)."""
    from .allreduce import check_strategy, make_small_all_reduce
    if tp_size == 1:   # nothing to all-reduce
        return TPGroup(0, 1)
    check_strategy(allreduce_strategy, device)   # before this rank waits for the others
    rank, size = launcher_rank_and_size()
    world = int(os.environ.get("TRTLLM_DFLASH_WORLD_SIZE", size))
    if world != tp_size:
        raise DFlashError("tp_size", f"is {tp_size} but {world} rank(s) were started",
                          f"start with `mpirun -n {tp_size} ...` (or set tp_size to {world})")
    if dist.is_initialized():
        rank = dist.get_rank()
        return TPGroup(rank, dist.get_world_size(),
                       small_all_reduce=make_small_all_reduce(allreduce_strategy, _this_gpu(device), rank),
                       host=host_group())
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(local_rank(rank) % torch.cuda.device_count())
    port = os.environ.get("MASTER_PORT")
    if port is not None:
        store = dist.TCPStore(addr, int(port), tp_size, is_master=rank == 0, wait_for_workers=False)
    else:
        try:
            from mpi4py import MPI
        except ImportError:
            raise DFlashError("MASTER_PORT", "not set and mpi4py is missing",
                              "pip install 'trtllm-dflash[mpi]' or export MASTER_ADDR/MASTER_PORT") from None
        # Rank 0 binds port 0 itself (no pick-then-bind race with other jobs) and tells the others.
        store = dist.TCPStore(addr, 0, tp_size, is_master=True, wait_for_workers=False) if rank == 0 else None
        port = MPI.COMM_WORLD.bcast(store.port if rank == 0 else None, root=0)
        # MPI's only job was the rendezvous; finalising now keeps its exit-time teardown from racing
        # gloo's threads (seen as an abort at exit with MPICH).
        MPI.Finalize()
        if rank != 0:
            store = dist.TCPStore(addr, port, tp_size, is_master=False)
    extra = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=tp_size, **extra)
    return TPGroup(rank, tp_size, store, make_small_all_reduce(allreduce_strategy, _this_gpu(device), rank),
                   host_group())


def _this_gpu(device: torch.device) -> torch.device:
    """``device`` with the index this rank's GPU was set to (the symmetric buffers live there)."""
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device
