# SPDX-License-Identifier: Apache-2.0
"""RuntimeConfig.allreduce_strategy on the CPU: the one-shot all-reduce is refused where it cannot run (one line
naming the field), auto leaves gloo alone, and TPGroup.all_reduce routes the messages the one-shot path handles to
it and the rest to the process group. tests/gpu/test_allreduce_cuda.py checks its sums against NCCL's."""
from __future__ import annotations

import pytest
import torch

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
