# SPDX-License-Identifier: Apache-2.0
"""RuntimeConfig.allreduce_strategy on the CPU: the one-shot all-reduce is refused where it cannot run (one line
naming the field), auto leaves gloo alone, and TPGroup.all_reduce routes the messages the one-shot path handles to
it and the rest to the process group. tests/gpu/test_allreduce_cuda.py checks its sums against NCCL's."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # before Triton is imported: the fused kernel's CPU test runs it in the interpreter
    os.environ["TRITON_INTERPRET"] = "1"

from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime import allreduce, distributed
from trtllm_dflash.runtime.distributed import TPGroup, init_tp


def test_unknown_strategy_is_refused():
    with pytest.raises(DFlashError, match="allreduce_strategy"):
        RuntimeConfig(allreduce_strategy="twoshot")
    with pytest.raises(DFlashError, match="allreduce_strategy.*use one of auto, nccl, oneshot"):
        allreduce.check_strategy("ring", torch.device("cpu"))


def test_oneshot_on_the_cpu_is_an_error_before_any_rank_waits():
    with pytest.raises(DFlashError) as err:   # no launcher, no group: refused before the rendezvous
        init_tp(2, torch.device("cpu"), allreduce_strategy="oneshot")
    assert "allreduce_strategy" in str(err.value) and "not on cpu" in str(err.value) and "'nccl'" in str(err.value)
    # auto and nccl keep gloo (no one-shot buffers off CUDA); tp 1 has nothing to all-reduce
    for strategy in ("auto", "nccl"):
        assert allreduce.make_small_all_reduce(strategy, torch.device("cpu"), 0) is None
    assert init_tp(1, torch.device("cpu"), allreduce_strategy="oneshot") == TPGroup(0, 1)


class _Small:
    """A one-shot stand-in that handles messages up to 16 bytes and marks its results."""

    def __init__(self):
        self.calls = 0

    def handles(self, x):
        return x.numel() * x.element_size() <= 16

    def __call__(self, x):
        self.calls += 1
        return x * 10


def test_all_reduce_routes_small_messages_to_the_one_shot_path(monkeypatch):
    reduced = []
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda x: reduced.append(x.numel()))
    small = _Small()
    tp = TPGroup(0, 2, small_all_reduce=small)
    x = torch.ones(4)                       # 16 bytes: one-shot, a new tensor
    assert torch.equal(tp.all_reduce(x), x * 10) and small.calls == 1 and reduced == []
    big = torch.ones(5)                     # 20 bytes: the process group, in place
    assert tp.all_reduce(big) is big and reduced == [5] and small.calls == 1
    assert TPGroup(0, 1, small_all_reduce=small).all_reduce(x) is x and small.calls == 1   # tp 1: nothing


# ---- the all-reduce fused with the residual add + RMSNorm ---------------------------------------------------

def _reference(parts, residual, w, eps, bias):
    """The unfused chain: the all-reduce (float32 sum in rank order, rounded), the bias, the residual add, the norm
    (layers.add_rms_norm's math)."""
    from trtllm_dflash.runtime.models import layers as L
    reduced = sum(p.float() for p in parts).to(residual.dtype)
    if bias is not None:
        reduced = reduced + bias
    return L.add_rms_norm.eager(residual, reduced, w, eps)


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")   # the interpreter's
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("world,rows,programs", [(2, 1, 4), (3, 7, 2), (4, 16, 16)])
def test_fused_kernel_sums_adds_and_normalises_every_row(dtype, world, rows, programs):
    """kernels/allreduce_norm.py in Triton's interpreter, the barriers off: each "rank" writes its partial into
    its buffer, the peers' rows are already in theirs; programs fewer than rows take several rows each.
    (bfloat16 is checked on the GPU: the interpreter rounds float32 to bfloat16 its own way.)"""
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check of the arithmetic: the GPU test runs the kernel across GPUs")
    from trtllm_dflash.runtime.kernels.allreduce_norm import all_reduce_add_rms_norm
    g = torch.Generator().manual_seed(world * 100 + rows)
    H = 72   # not a power of two: the masked tail
    parts = [torch.randn(rows, H, generator=g).to(dtype) for _ in range(world)]
    residual = torch.randn(rows, H, generator=g).to(dtype)
    w, bias = (torch.rand(H, generator=g) + 0.5).to(dtype), torch.randn(H, generator=g).to(dtype)
    buffers = [torch.zeros(rows * H, dtype=dtype) for _ in range(world)]
    for b, p in zip(buffers, parts):
        b.copy_(p.flatten())
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    pads = torch.zeros(world, dtype=torch.int64)   # unused without the barriers
    for use_bias in (None, bias):
        total_ref, normed_ref = _reference(parts, residual, w, 1e-6, use_bias)
        outs = [all_reduce_add_rms_norm(parts[r], residual, w, 1e-6, use_bias, ptrs, pads, r, world, programs,
                                        sync=False) for r in range(world)]
        for total, normed in outs:
            assert torch.equal(total, total_ref)
            tol = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]   # the norm's mean in another order
            assert (normed.float() - normed_ref.float()).abs().max().item() <= tol * normed_ref.abs().max().item()
        assert all(torch.equal(o[1], outs[0][1]) for o in outs)   # every rank the same bits


class _Fused(_Small):
    def __init__(self):
        super().__init__()
        self.fused = 0

    def fuses(self, x):
        return self.handles(x) and x.numel() // x.shape[-1] <= 1

    def add_rms_norm(self, x, residual, weight, eps, bias=None):
        self.fused += 1
        return residual + 10 * x, residual


def test_all_reduce_add_norm_fuses_only_beside_the_triton_kernels(monkeypatch):
    from trtllm_dflash.runtime.kernels import Kernels
    from trtllm_dflash.runtime.models.layers import RMSNorm
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda x: x.mul_(2))   # "two ranks of the same values"
    x, residual = torch.ones(1, 4), torch.full((1, 4), 3.0)
    small = _Fused()
    tp = TPGroup(0, 2, small_all_reduce=small)
    normed, total = tp.all_reduce_add_norm(x, residual, RMSNorm(4, 1e-6, Kernels(triton=True)))
    assert small.fused == 1 and torch.equal(total, residual + 10) and torch.equal(normed, residual)
    # the torch path: the one-shot all-reduce (x * 10 from the stand-in), the bias, then the norm's add + norm
    norm = RMSNorm(4, 1e-6)
    normed, total = tp.all_reduce_add_norm(x, residual, norm, bias=torch.ones(4))
    assert small.fused == 1 and small.calls == 1 and torch.equal(total, residual + 11)
    assert torch.allclose(normed, norm(total))
    # two rows (where the fused kernel lost to one-shot + norm): the one-shot all-reduce, then the norm
    two = torch.ones(2, 2)
    normed, total = tp.all_reduce_add_norm(two, torch.zeros(2, 2), RMSNorm(2, 1e-6, Kernels(triton=True)))
    assert small.fused == 1 and small.calls == 2 and torch.equal(total, torch.full((2, 2), 10.0))
    # a message the one-shot path does not take: the process group's all-reduce, never the fused kernel
    wide = torch.ones(1, 8)
    normed, total = tp.all_reduce_add_norm(wide, torch.zeros(1, 8), RMSNorm(8, 1e-6, Kernels(triton=True)))
    assert small.fused == 1 and torch.equal(total, torch.full((1, 8), 2.0))


def test_one_shot_takes_only_whole_4_byte_messages():
    """torch's one-shot kernel refuses sizes that are not a multiple of 4 bytes (seen on 2 H200s: an odd count of
    bf16 values); those stay on NCCL. handles() is checked without the buffers: a stand-in with the real method."""
    small = allreduce.OneShotAllReduce.__new__(allreduce.OneShotAllReduce)
    small.buffers, small.max_bytes = {torch.bfloat16: None, torch.float32: None}, 64
    assert small.handles(torch.zeros(2, dtype=torch.bfloat16))
    assert not small.handles(torch.zeros(7, dtype=torch.bfloat16))
    assert small.handles(torch.zeros(7, dtype=torch.float32))
    assert not small.handles(torch.zeros(17, dtype=torch.float32))   # past max_bytes


def _fused_rank(rank, world, calls, parts, residual, w, ptrs, pads, outs, programs):
    from trtllm_dflash.runtime.kernels.allreduce_norm import all_reduce_add_rms_norm
    for c in range(calls):
        outs[rank, c] = all_reduce_add_rms_norm(parts[c][rank], residual, w, 1e-6, None, ptrs, pads, rank, world,
                                                programs, sync=True)[0]


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fused_kernel_barriers_meet_across_processes(world):
    """The barriers on: one process per "rank", each running the kernel in Triton's interpreter over buffers and
    signal pads in memory the processes share (made before the fork, so every process sees them at the same
    addresses), several calls back to back (a rank may start the next call while a peer still reads this one).
    Every rank gets every call's sum, and the pads end at 0 as they started; a barrier that let a rank read
    before its peers wrote, or reuse its buffer while they read, would give a wrong sum or hang here."""
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check: tests/gpu/test_allreduce_cuda.py runs the barriers across GPUs")
    import multiprocessing as mp
    rows, H, calls, programs = 3, 72, 4, 2
    g = torch.Generator().manual_seed(world)
    buffers = [torch.zeros(rows * H).share_memory_() for _ in range(world)]
    pads = [torch.zeros(1024, dtype=torch.int32).share_memory_() for _ in range(world)]
    outs = torch.zeros(world, calls, rows, H).share_memory_()
    parts = [[torch.randn(rows, H, generator=g) for _ in range(world)] for _ in range(calls)]
    residual, w = torch.randn(rows, H, generator=g), torch.rand(H, generator=g) + 0.5
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_fused_rank, args=(r, world, calls, parts, residual, w, ptrs, pad_ptrs, outs,
                                                   programs)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    assert not hung, f"ranks {hung} still waiting at a barrier"
    assert all(p.exitcode == 0 for p in procs)
    for c in range(calls):
        for r in range(world):
            torch.testing.assert_close(outs[r, c], residual + sum(parts[c]), rtol=1e-6, atol=1e-5)
    assert all(int(p.abs().sum()) == 0 for p in pads)
