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

    def fuses(self, x, weight_first=False):
        return self.handles(x) and x.numel() // x.shape[-1] <= 1

    def add_rms_norm(self, x, residual, weight, eps, bias=None, weight_first=False):
        self.fused += 1
        self.weight_first = weight_first
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
    assert small.weight_first is False
    # gpt-oss's norm asks for its own rounding (the weight first, in float32)
    from trtllm_dflash.runtime.models.gpt_oss import GptOssRMSNorm
    tp.all_reduce_add_norm(x, residual, GptOssRMSNorm(4, 1e-6, Kernels(triton=True)))
    assert small.fused == 2 and small.weight_first is True
    small.fused = 1
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
    small.buffers, small.max_bytes, small.lamport = {torch.bfloat16: None, torch.float32: None}, 64, {}
    assert small.handles(torch.zeros(2, dtype=torch.bfloat16))
    assert not small.handles(torch.zeros(7, dtype=torch.bfloat16))
    assert small.handles(torch.zeros(7, dtype=torch.float32))
    assert not small.handles(torch.zeros(17, dtype=torch.float32))   # past max_bytes


def test_lamport_takes_decode_sized_rows():
    """pushes(): rows up to LAMPORT_MAX_ROWS of at most LAMPORT_MAX_HIDDEN values that fit the buffers, contiguous,
    float16 too (our kernel); handles() then covers them whatever torch's one-shot kernel takes."""
    small = allreduce.OneShotAllReduce.__new__(allreduce.OneShotAllReduce)
    small.buffers, small.max_bytes = {torch.bfloat16: None}, 1 << 20
    small.lamport = {torch.bfloat16: (None, None, None, 64 * 4096), torch.float16: (None, None, None, 64 * 4096)}
    rows = allreduce.LAMPORT_MAX_ROWS
    assert small.pushes(torch.zeros(1, 4096, dtype=torch.bfloat16))
    assert small.pushes(torch.zeros(rows, 4096, dtype=torch.bfloat16))
    assert not small.pushes(torch.zeros(rows + 1, 2048, dtype=torch.bfloat16))     # more rows than decode's
    assert not small.pushes(torch.zeros(1, 4096, dtype=torch.float32))            # no buffer of that dtype
    assert not small.pushes(torch.zeros(4096, 2, dtype=torch.bfloat16).t())       # not contiguous
    assert not small.pushes(torch.zeros(2, 32768, dtype=torch.bfloat16))          # a row one program cannot hold
    assert not small.pushes(torch.zeros(0, 4096, dtype=torch.bfloat16))
    half = torch.zeros(3, 7, dtype=torch.float16)   # an odd size in float16: torch's kernel would refuse it
    assert small.pushes(half) and small.handles(half) and small.fuses(half)


def _run_ranks(world: int, target, args_of, hung_means: str) -> None:
    """One forked process per "rank" running target(*args_of(rank)) (memory made before the fork is shared at the
    same addresses); every rank must finish within 120 s and exit cleanly."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=args_of(r)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    assert not hung, f"ranks {hung} {hung_means}"
    assert all(p.exitcode == 0 for p in procs)


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
    rows, H, calls, programs = 3, 72, 4, 2
    g = torch.Generator().manual_seed(world)
    buffers = [torch.zeros(rows * H).share_memory_() for _ in range(world)]
    pads = [torch.zeros(1024, dtype=torch.int32).share_memory_() for _ in range(world)]
    outs = torch.zeros(world, calls, rows, H).share_memory_()
    parts = [[torch.randn(rows, H, generator=g) for _ in range(world)] for _ in range(calls)]
    residual, w = torch.randn(rows, H, generator=g), torch.rand(H, generator=g) + 0.5
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    _run_ranks(world, _fused_rank, lambda r: (r, world, calls, parts, residual, w, ptrs, pad_ptrs, outs, programs),
               "still waiting at a barrier")
    for c in range(calls):
        for r in range(world):
            torch.testing.assert_close(outs[r, c], residual + sum(parts[c]), rtol=1e-6, atol=1e-5)
    assert all(int(p.abs().sum()) == 0 for p in pads)


# ---- the Lamport kernel: no barriers, the sentinel is the flag ----------------------------------------------

@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("world,rows,programs", [(2, 1, 4), (3, 5, 2), (4, 16, 16)])
def test_lamport_kernel_over_successive_calls(dtype, world, rows, programs):
    """kernels/allreduce_norm.py's Lamport kernel in Triton's interpreter, every rank's push, then every rank's
    reduce (a GPU runs both halves in one launch; tests/gpu/test_allreduce_cuda.py): five calls in a row cycle the
    three slots; each returns the unfused chain's bits on every rank, leaves the slot it read all sentinel again,
    and moves each rank's call count on by one. A partial's -0.0 goes out as +0.0, never as the sentinel."""
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check of the arithmetic: the GPU test runs the kernel across GPUs")
    from trtllm_dflash.runtime.kernels import allreduce_norm as K
    H, cap = 72, 16 * 72
    bits = {4: torch.int32, 2: torch.int16}[dtype.itemsize]
    sentinel = torch.tensor(-0.0, dtype=dtype).view(bits).item()
    buffers = [torch.empty(K.lamport_buffer_elems(cap, world), dtype=dtype) for _ in range(world)]
    for b in buffers:
        K.fill_sentinel(b)
        assert (b.view(bits) == sentinel).all()
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    states = [torch.zeros(2, dtype=torch.int32) for _ in range(world)]
    g = torch.Generator().manual_seed(world * 10 + rows)
    w, bias = (torch.rand(H, generator=g) + 0.5).to(dtype), torch.randn(H, generator=g).to(dtype)
    for call in range(5):
        parts = [torch.randn(rows, H, generator=g).to(dtype) for _ in range(world)]
        parts[0][0, :3] = -0.0
        residual = torch.randn(rows, H, generator=g).to(dtype)
        norm, use_bias = call % 2 == 0, bias if call % 3 == 1 or call == 2 else None
        weight_first = call == 2   # gpt-oss's norm rounding, with o_proj's bias
        args = [(parts[r], residual if norm else None, w if norm else None, 1e-6, use_bias, ptrs, states[r], cap, r,
                 world, programs) for r in range(world)]
        for a in args:
            K.lamport_all_reduce(*a, phases="push", weight_first=weight_first)
        slot = buffers[0].view(K.SLOTS, world, cap)[call % K.SLOTS]
        assert not (slot[:, : rows * H].view(bits) == sentinel).any()   # every sender's rows landed, no sentinel
        outs = [K.lamport_all_reduce(*a, phases="reduce", weight_first=weight_first) for a in args]
        if weight_first:
            from trtllm_dflash.runtime.models.gpt_oss import _add_norm
            reduced = sum(p.float() for p in parts).to(dtype)
            total_ref, normed_ref = _add_norm.eager(residual, reduced, w, 1e-6, use_bias)
            for total, normed in outs:
                assert torch.equal(total, total_ref)
                tol = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]
                assert (normed.float() - normed_ref.float()).abs().max().item() <= tol * normed_ref.abs().max().item()
                # the two roundings differ in float16 (a quarter of the values here): at most a rare flip from
                # the mean's summation order may differ from the reference's bits (float32 differs in last bits)
                assert dtype != torch.float16 or (normed != normed_ref).float().mean().item() <= 0.01
        elif norm:
            total_ref, normed_ref = _reference(parts, residual, w, 1e-6, use_bias)
            for total, normed in outs:
                assert torch.equal(total, total_ref)
                tol = {torch.float32: 1e-6, torch.float16: 1e-3}[dtype]
                assert (normed.float() - normed_ref.float()).abs().max().item() <= tol * normed_ref.abs().max().item()
        else:
            want = sum(p.float() for p in parts).to(dtype)
            want = want if use_bias is None else (want.float() + use_bias.float()).to(dtype)
            for reduced, none in outs:
                assert none is None and torch.equal(reduced, want)
        assert all(torch.equal(o[1 if norm else 0], outs[0][1 if norm else 0]) for o in outs)   # the same bits
        for b, s in zip(buffers, states):
            assert (b.view(bits) == sentinel).all()                      # read slots are sentinel again
            assert s.tolist() == [call + 1, 0]


def test_lamport_refuses_a_message_larger_than_its_buffers():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.runtime.kernels import allreduce_norm as K
    x = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="129|128 values, the buffers hold 100"):
        K.lamport_all_reduce(x, None, None, 1e-6, None, torch.zeros(2, dtype=torch.int64),
                             torch.zeros(2, dtype=torch.int32), 100, 0, 2)


def _lamport_rank(rank, world, calls, parts, residual, w, ptrs, states, cap, outs, programs):
    from trtllm_dflash.runtime.kernels.allreduce_norm import lamport_all_reduce
    for c in range(calls):
        norm = c % 2 == 0
        out = lamport_all_reduce(parts[c][rank], residual if norm else None, w if norm else None, 1e-6, None, ptrs,
                                 states[rank], cap, rank, world, programs)
        outs[rank, c] = out[0]


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
@pytest.mark.parametrize("world", [2, 3, 4])
def test_lamport_kernel_across_processes(world):
    """Both halves in one launch, one process per "rank" over buffers the processes share (as the barrier test
    above): seven calls back to back, so ranks run ahead of each other into the next slot and every slot is reused
    twice. Every rank gets every call's sum (alternately with the add + norm), and no rank waits forever."""
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    if torch.cuda.is_available():
        pytest.skip("the interpreter check: tests/gpu/test_allreduce_cuda.py runs the kernel across GPUs")
    from trtllm_dflash.runtime.kernels.allreduce_norm import fill_sentinel, lamport_buffer_elems
    rows, H, calls, programs, cap = 3, 72, 7, 2, 4 * 72
    g = torch.Generator().manual_seed(world)
    buffers = [torch.empty(lamport_buffer_elems(cap, world)).share_memory_() for _ in range(world)]
    for b in buffers:
        fill_sentinel(b)
    states = [torch.zeros(2, dtype=torch.int32).share_memory_() for _ in range(world)]
    outs = torch.zeros(world, calls, rows, H).share_memory_()
    parts = [[torch.randn(rows, H, generator=g) for _ in range(world)] for _ in range(calls)]
    residual, w = torch.randn(rows, H, generator=g), torch.rand(H, generator=g) + 0.5
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    _run_ranks(world, _lamport_rank, lambda r: (r, world, calls, parts, residual, w, ptrs, states, cap, outs,
                                                programs), "still polling for a peer's rows")
    for c in range(calls):
        total = sum(parts[c]) + (residual if c % 2 == 0 else 0)
        for r in range(world):
            torch.testing.assert_close(outs[r, c], total, rtol=1e-6, atol=1e-5)
    assert all(s.tolist() == [calls, 0] for s in states)
