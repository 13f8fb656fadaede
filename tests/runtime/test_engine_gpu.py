# SPDX-License-Identifier: Apache-2.0
"""On the GPU (CUDA graphs on): the scheduler's chunked prefill, arrivals mid-decode and the adaptive
block give the same tokens as plain AR decoding. float32, so AR and DFlash can be compared exactly."""
from __future__ import annotations

import pytest

from tests.runtime.test_engine import prompts
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.draft_policy import CostTable
from trtllm_dflash.runtime.engine import Engine

pytestmark = pytest.mark.gpu


def _cfg(**kw):
    return RuntimeConfig(max_seq_len=256, max_batch_size=4, dtype="float32", device="cuda", **kw)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_graphs_chunked_adaptive_equal_ar(tiny_pair, temperature):
    ps = prompts(6)
    sp = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=temperature, seed=5)
    ar = Engine.from_dirs(tiny_pair[0], None, _cfg(block_size=1)).generate(ps, sp)
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], _cfg(max_num_tokens=16))
    df.use_adaptive_policy(CostTable({1: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, 4: {1: 1.0, 2: 1.9, 4: 3.0, 8: 8.0}}))
    out = df.generate(ps, sp)
    assert [r.output_ids for r in out] == [r.output_ids for r in ar]
    assert df.runner.num_graphs > 0 and len(df.block_counts) >= 2
