# SPDX-License-Identifier: Apache-2.0
"""The adaptive draft length: expected tokens from running acceptance, cost tables, the choice per batch,
TensorRT-LLM's draft_len_schedule, and lossless output whatever block each step runs."""
from __future__ import annotations

import pytest

from tests.runtime.test_engine import prompts
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.draft_policy import (AcceptanceStats, AdaptivePolicy, CostTable, candidate_blocks,
                                                draft_len_schedule)
from trtllm_dflash.runtime.engine import Engine


def test_candidate_blocks():
    assert candidate_blocks(16) == [1, 2, 4, 8, 16] and candidate_blocks(6) == [1, 2, 4, 6] and candidate_blocks(1) == [1]


def test_acceptance_counts_censored_blocks():
    st = AcceptanceStats(8, decay=1.0, prior_weight=0.0)
    st.observe(8, [7, 0])   # all accepted; first rejected
    assert st.tried[1] == 2 and st.passed[1] == 1 and st.tried[7] == 1 and st.passed[7] == 1
    st.observe(3, [2])      # a block of 3 accepts both drafts: positions 3.. not observed
    assert st.tried[2] == 2 and st.tried[3] == 1
    assert st.expected_tokens(1) == 1.0
    full = AcceptanceStats(8, decay=1.0, prior_weight=0.0)
    full.observe(8, [7] * 5)
    assert full.expected_tokens(8) == pytest.approx(8.0)


def _costs(per_token_ms: float) -> CostTable:
    # a memory-bound step (5 ms) plus a compute term per verified token
    return CostTable({n: {b: (5 + per_token_ms * n * b) / 1e3 for b in (1, 2, 4, 8, 16)} for n in (1, 4, 16, 64)})


def test_policy_drafts_at_small_batch_and_stops_where_it_does_not_pay():
    pol = AdaptivePolicy(16, _costs(0.05))
    pol.observe(16, [15] * 8 + [3] * 8)   # good acceptance
    assert pol.choose(1)[0] == 16
    assert pol.choose(64)[0] < 16
    bad = AdaptivePolicy(16, _costs(0.05))
    for _ in range(200):
        bad.observe(16, [0] * 8)         # the drafter is never right: AR everywhere
    picks = [bad.choose(1) for _ in range(32)]
    assert [b for b, _ in picks].count(1) == 31 and picks[-1][0] == 16 and "probe" in picks[-1][1]
    sched = draft_len_schedule(pol, 64)
    assert list(sched) == sorted(sched) and sched[min(sched)] == 15
    assert all(0 < d <= 15 for d in sched.values())
    assert draft_len_schedule(bad, 64) == {}   # speculation off at every batch size


def test_adaptive_engine_is_lossless_and_reports_its_blocks(tiny_pair):
    ar = Engine.from_dirs(tiny_pair[0], None, RuntimeConfig(block_size=1, max_seq_len=256, max_batch_size=4))
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    pol = df.use_adaptive_policy(CostTable({1: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, 4: {1: 1.0, 2: 1.9, 4: 3.0, 8: 8.0}}))
    ps = prompts(6)
    sp = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0.9, seed=7)
    assert [r.output_ids for r in df.generate(ps, sp)] == [r.output_ids for r in ar.generate(ps, sp)]
    assert sum(df.block_counts.values()) == df.counters["steps"] and df.last_reason
    assert len(df.block_counts) >= 2   # the untrained drafter is rarely right: the policy moved off the full block
    assert pol.stats.tried[1] > 0


def test_measured_cost_table(tiny_pair):
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=128, max_batch_size=2))
    pol = df.use_adaptive_policy(context=32)
    assert sorted(pol.costs.seconds) == [1, 2] and sorted(pol.costs.seconds[2]) == candidate_blocks(df.block_size)
    assert all(v > 0 for r in pol.costs.seconds.values() for v in r.values())
    out = df.generate(prompts(2), SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert all(len(r.output_ids) == 8 for r in out)
