# SPDX-License-Identifier: Apache-2.0
"""The adaptive draft length: expected tokens from running acceptance, cost tables, the choice per batch,
TensorRT-LLM's draft_len_schedule, and lossless output whatever block each step runs."""
from __future__ import annotations

import collections

import pytest
import torch

from tests.runtime.test_engine import eager_graph_paths, prompts
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.draft_schedule import draft_len_schedule
from trtllm_dflash.runtime.draft_policy import (EXPLORE_STEPS, AcceptanceStats, AdaptivePolicy, CostTable,
                                                FixedPolicy, candidate_blocks)
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


def test_a_small_block_does_not_fade_what_a_larger_one_observed_further_on():
    """Steps at block 2 observe draft 1 only: draft 3's evidence (from a block-8 step) must not decay under them,
    or the policy, reading unobserved drafts as rejected, would price block 4 as block 2 plus cost for ever."""
    st = AcceptanceStats(8, decay=0.5, prior_weight=2.0)
    st.observe(8, [7] * 4)              # every draft accepted
    before = st.rate(3, 0.0)
    for _ in range(50):
        st.observe(2, [1] * 4)          # block 2 accepts its one draft
    assert st.rate(3, 0.0) == before == pytest.approx(4 / 6)
    assert st.tried[1] < 8              # draft 1 follows the current traffic (decays as it is observed)
    assert st.expected_tokens(4, 0.0) > st.expected_tokens(2, 0.0) + 0.8   # 2.69 vs 1.80


def _costs(per_token_ms: float) -> CostTable:
    # a memory-bound step (5 ms) plus a compute term per verified token
    return CostTable({n: {b: (5 + per_token_ms * n * b) / 1e3 for b in (1, 2, 4, 8, 16)} for n in (1, 4, 16, 64)})


def test_policy_drafts_at_small_batch_and_stops_where_it_does_not_pay():
    pol = AdaptivePolicy(16, _costs(0.05))
    assert pol.choose(1) == (16, "probe at block 16: no acceptance observed yet")   # the prior alone: probe first
    pol.observe(16, [15] * 8 + [3] * 8)   # good acceptance
    assert pol.choose(1)[0] == 16
    assert pol.choose(64)[0] < 16
    bad = AdaptivePolicy(16, _costs(0.05))
    for _ in range(200):
        bad.observe(16, [0] * 8)         # the drafter is never right: AR everywhere
    picks = [bad.choose(1) for _ in range(32)]
    # probes run the largest block within 25% of the cheapest drafting block's cost: 16 (5.8 ms vs 5.1 ms)
    assert [b for b, _ in picks].count(1) == 31 and picks[-1][0] == 16 and "probe" in picks[-1][1]
    sched, raised = draft_len_schedule(pol, 64)
    assert list(sched) == sorted(sched) and sched[1] == 15 and not raised
    assert all(0 < d <= 15 for d in sched.values())
    # never pays: TensorRT-LLM must draft max_draft_len at batch 1, and MIN_DRAFT_LEN (never 0) up to the largest
    # batch (at 0 its DFlash worker skips the tokens: draft_schedule.ZERO_DRAFT_REASON)
    assert draft_len_schedule(bad, 64) == ({1: 15, 64: 1}, True)


def test_adaptive_engine_is_lossless_and_reports_its_blocks(tiny_pair):
    ar = Engine.from_dirs(tiny_pair[0], None, RuntimeConfig(block_size=1, max_seq_len=256, max_batch_size=4))
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    pol = df.use_adaptive_policy(CostTable({1: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, 4: {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0}}))
    ps = prompts(6)
    sp = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0.9, seed=7)
    assert [r.output_ids for r in df.generate(ps, sp)] == [r.output_ids for r in ar.generate(ps, sp)]
    assert sum(df.block_counts.values()) == df.counters["steps"] and df.last_reason
    assert len(df.block_counts) >= 2   # the untrained drafter is rarely right: the policy moved off the full block
    assert pol.stats.tried[1] > 0


def test_observed_step_periods_correct_a_table_that_priced_drafting_too_dear():
    """The H200 case: a start-up table that priced drafting at 2x+ block 1 kept the policy on AR, while the steps
    the engine ran at block 16 took 1.3x. Observed periods replace an entry from its min_cost_samples-th sample; the entries not yet
    observed keep the table's ratios at the observed scale; then drafting at the observed acceptance wins."""
    table = CostTable({1: {1: 1.0e-3, 2: 2.0e-3, 4: 2.1e-3, 8: 2.2e-3, 16: 2.3e-3}})
    pol = AdaptivePolicy(16, table)
    for _ in range(200):                      # HumanEval-like: 0.86 drafts accepted per row-step at block 16
        pol.observe(16, [1, 1, 0, 2, 0, 1, 1])
    assert pol.choose(1)[0] == 1               # by the table, AR
    for _ in range(3):
        pol.observe_cost(1, 1, 0.8e-3)
    assert pol.costs.seconds[1][1] == 1.0e-3   # 3 samples: the table still holds
    pol.observe_cost(1, 1, 0.8e-3)
    assert pol.costs.seconds[1][1] == pytest.approx(0.8e-3)
    assert pol.costs.seconds[1][16] == pytest.approx(2.3e-3 * 0.8)   # same ratio, observed scale
    assert pol.choose(1)[0] == 1
    for _ in range(4):
        pol.observe_cost(1, 16, 1.05e-3)       # what the block-16 steps really took
    block, reason = pol.choose(1)
    assert block > 1, reason
    assert pol.measured.seconds[1][16] == 2.3e-3   # the start-up table is kept as measured
    assert pol.observed_costs() == {1: {1: [0.8, 4], 16: [1.05, 4]}}


def test_a_drafting_block_the_table_prices_too_dear_is_timed_once_and_then_chosen():
    """The H100 case (SmolLM2, HumanEval, concurrency 1): the table priced block 16 well over block 4, so the policy ran
    block 4 and never timed 16, which really cost what 4 did (fixed block 16 ran 1.94x AR, the policy 1.83x). Once a
    drafting cost is observed, an untimed block that would win even at that cost runs its timed samples, once."""
    table = CostTable({1: {1: 1.0e-3, 2: 1.10e-3, 4: 1.12e-3, 8: 1.60e-3, 16: 1.75e-3}})
    real = {1: 0.95e-3, 2: 1.10e-3, 4: 1.15e-3, 8: 1.16e-3, 16: 1.17e-3}
    pol = AdaptivePolicy(16, table)
    for _ in range(100):
        pol.observe(16, [1, 2, 0, 4, 1, 6, 2, 9])   # ~2.4 tokens a block-16 step, a tail beyond draft 4
    picks = []
    for _ in range(60):
        block, reason = pol.choose(1)
        picks.append((block, reason))
        pol.observe_cost(1, block, real[block])
    blocks = [b for b, _ in picks]
    assert blocks[:4] == [4] * 4                           # the table's choice, until its cost is observed
    explored = [r for _, r in picks if r.startswith("explore")]
    assert explored and all(r.startswith("explore block 16") for r in explored[:4])
    assert len(explored) == 4                               # its timed samples (min_cost_samples), no more
    assert blocks[-20:].count(16) >= 19                     # then the timed costs decide: block 16
    assert pol.observed_costs()[1][16][1] >= 4


def test_exploring_stops_where_the_block_is_never_timed_or_adds_nothing():
    table = CostTable({1: {1: 1.0e-3, 2: 1.10e-3, 4: 1.12e-3, 8: 1.60e-3, 16: 1.75e-3}})
    pol = AdaptivePolicy(16, table)
    for _ in range(100):
        pol.observe(16, [1, 2, 0, 4, 1, 6, 2, 9])
    for _ in range(4):
        pol.observe_cost(1, 4, 1.15e-3)
    # block 16's steps are never timed (say every step also prefills): it runs EXPLORE_STEPS steps, then no more
    picks = [pol.choose(1)[0] for _ in range(100)]
    assert picks.count(16) == EXPLORE_STEPS and picks[-30:].count(16) == 0
    # drafts past 2 never accepted: the larger blocks add no expected tokens and are not worth timing
    flat = AdaptivePolicy(16, table)
    for _ in range(100):
        flat.observe(16, [2, 0, 1, 2])
    for _ in range(4):
        flat.observe_cost(1, 4, 1.15e-3)
    assert all(not flat.choose(1)[1].startswith("explore") for _ in range(50))


def test_a_policy_that_only_ran_block_2_still_tries_the_larger_blocks():
    """The CPU quick start whose table was measured under load: its first probe at batch 2 could afford block 2 only,
    so drafts 2-15 were never observed, counted rejected, and block 2 ran for good (1.57x where other runs printed
    2.0-2.2x). Exploring counts unobserved positions at the optimistic prior; the evidence it brings then decides."""
    table = CostTable({2: {1: 0.33, 2: 0.34, 4: 0.46, 8: 0.61, 16: 0.65}})
    real = {1: 0.11, 2: 0.13, 4: 0.13, 8: 0.14, 16: 0.19}
    accept = {2: [1, 1, 0, 1], 4: [3, 2, 3, 1], 8: [5, 2, 7, 1], 16: [5, 2, 9, 1]}   # per row, capped by the block
    pol = AdaptivePolicy(16, table)
    picks = []
    for _ in range(120):
        block, _ = pol.choose(2)
        picks.append(block)
        if block > 1:
            pol.observe(block, [min(a, block - 1) for a in accept[block]][:2])
        pol.observe_cost(2, block, real[block])
    assert picks[0] == 2 and 16 in picks
    assert picks[-20:].count(2) == 0, picks[-20:]   # the larger blocks, timed, win


def test_engine_reports_the_periods_of_steady_decode_steps_only(tiny_pair):
    """A step is timed when it was queued behind the previous one, prefills nothing, and is not a drafting step
    right after block-1 steps (it first appends their drafter context)."""
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    pattern = Pattern([4, 4, 4, 1, 1, 4, 1])
    df.policy = pattern
    ran, timed = [], []
    choose = pattern.choose
    pattern.choose = lambda n: (lambda b: (ran.append(b[0]), b)[1])(choose(n))
    pattern.observe_cost = lambda n, b, s: timed.append((n, b, s))
    df.generate(prompts(2), SamplingParams(max_new_tokens=24, ignore_eos=True))
    steady = sum(not (b > 1 and a <= 1) for a, b in zip(ran, ran[1:]))
    assert timed and all(n == 2 and s > 0 for n, _, s in timed)
    assert {b for _, b, _ in timed} == {1, 4} and len(timed) <= steady < len(ran) - 1


def test_the_gap_between_two_generate_calls_is_not_a_step_period(tiny_pair):
    """generate() can return with a step in flight; the next call reads it after the caller's own work (the quick start
    runs an AR round in between): that read-to-read time must not reach the policy as the step's price."""
    import time
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    pattern = Pattern([4])
    df.policy = pattern
    timed = []
    pattern.observe_cost = lambda n, b, s: timed.append(s)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    df.generate(prompts(2), params)
    time.sleep(0.5)
    df.generate(prompts(2), params)
    assert timed and max(timed) < 0.5, max(timed)


def test_measured_cost_table(tiny_pair):
    df = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=128, max_batch_size=2))
    pol = df.use_adaptive_policy(context=32)
    assert sorted(pol.costs.seconds) == [1, 2] and sorted(pol.costs.seconds[2]) == candidate_blocks(df.block_size)
    assert all(v > 0 for r in pol.costs.seconds.values() for v in r.values())
    out = df.generate(prompts(2), SamplingParams(max_new_tokens=8, ignore_eos=True))
    assert all(len(r.output_ids) == 8 for r in out)


def test_probes_are_paced_by_their_price():
    """A CPU-like table (smollm2-135m on 2 cores: block 2 costs 2.1x block 1): the probe runs block 8 (within 25% of
    block 2's cost), seldom enough that probes cost at most probe_budget of the AR time; on a launch-bound table it
    probes the full block every probe_every steps."""
    cpu = CostTable({1: {1: 0.060, 2: 0.125, 4: 0.140, 8: 0.150, 16: 0.199}})
    pol = AdaptivePolicy(16, cpu, probe_every=32, probe_budget=0.02)
    for _ in range(50):
        pol.observe(16, [0])
    block, every = pol.probe(1)
    assert block == 8 and every == 150         # ceil(2 * (150 - 60) / (0.02 * 60)): a probe is two steps
    picks = [pol.choose(1)[0] for _ in range(3 * (every + 1))]   # every AR steps, then the probe's second step
    assert picks.count(1) == 3 * (every + 1) - 6 and picks[every - 1] == picks[every] == 8
    overhead = sum(cpu.cost(1, b) - cpu.cost(1, 1) for b in picks) / (len(picks) * cpu.cost(1, 1))
    assert overhead <= 0.02
    gpu = AdaptivePolicy(16, CostTable({1: {1: 1.00e-3, 2: 1.05e-3, 4: 1.06e-3, 8: 1.08e-3, 16: 1.12e-3}}))
    assert gpu.probe(1) == (16, 32)


class Pattern(FixedPolicy):
    """A policy that runs a fixed cycle of blocks (to drive the runner through block-1 runs and drafting)."""

    def __init__(self, blocks):
        self.blocks, self.i = blocks, 0

    def choose(self, batch):
        self.i += 1
        return self.blocks[(self.i - 1) % len(self.blocks)], "pattern"



def _run_pattern(pair, stash_steps: int, blocks, graph_paths: bool = False):
    eng = Engine.from_dirs(pair[0], pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=4))
    if graph_paths:
        eager_graph_paths(eng).runner._warm = True    # graphs made at first use (no start-up capture)
    eng.runner.stash_steps = stash_steps
    eng.policy = Pattern(blocks)
    seen = []   # per drafting step: the drafter's cached context K/V of each decoding row, positions < start
    draft, cache = eng.runner.draft, eng.runner.draft_cache

    def spy(last, pos, start, rows, ctx_len, num_drafts):
        seen.append([(cache.k[:, i, :, :s].clone(), cache.v[:, i, :, :s].clone())
                     for i, s in enumerate(start.tolist()) if eng.runner.decoding_host[i]])
        return draft(last, pos, start, rows, ctx_len, num_drafts)

    eng.runner.draft = spy
    reqs = eng.generate(prompts(6), SamplingParams(max_new_tokens=30, ignore_eos=True))
    return eng, seen, [r.output_ids for r in reqs]


@pytest.mark.parametrize("graph_paths", [False, True], ids=["eager", "graph_paths"])
def test_batched_block1_context_equals_per_step_appends(tiny_pair, graph_paths):
    """Block-1 steps hold the drafter's context back and append it in one call before the drafter or a prefill
    needs it: every drafting step reads the same context K/V as with one append per step, through admissions,
    finishes and stash overflows (6 requests, 4 slots, runs of 5 AR steps with a stash of 3). graph_paths: the
    CUDA-graph code (padded shapes; a graphed block-1 step holds its features in fixed buffers that the host
    stashes after the replay), run eagerly on the CPU."""
    blocks = [1, 1, 1, 1, 1, 4, 1, 2, 1, 1, 16]
    eager, seen_eager, out_eager = _run_pattern(tiny_pair, 0, blocks, graph_paths)   # 0: one append per step
    batched, seen_batched, out_batched = _run_pattern(tiny_pair, 3, blocks, graph_paths)
    assert out_batched == out_eager and len(seen_eager) == len(seen_batched) > 10
    for rows_e, rows_b in zip(seen_eager, seen_batched):
        assert len(rows_e) == len(rows_b)
        for (ke, ve), (kb, vb) in zip(rows_e, rows_b):
            assert ke.shape == kb.shape and ke.abs().sum() > 0
            torch.testing.assert_close(kb, ke, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(vb, ve, rtol=1e-5, atol=1e-6)
    assert batched.runner.context_appends < eager.runner.context_appends


def test_block1_steps_cost_what_ar_costs(tiny_pair):
    """At block 1 the DFlash engine runs no drafter pass and, per step, no drafter context append (they are
    batched, one per stash_steps steps): the op count of an AR step plus a feature copy."""
    eng = Engine.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(max_seq_len=256, max_batch_size=2))
    eng.policy = FixedPolicy(1)
    calls = {"draft": 0}
    forward = eng.drafter.forward
    eng.drafter.forward = lambda *a, **k: calls.__setitem__("draft", calls["draft"] + 1) or forward(*a, **k)
    eng.add_request(prompts(1)[0], SamplingParams(max_new_tokens=65, ignore_eos=True))
    eng.step()                                       # prefill: one append of the prompt's context
    assert eng.runner.context_appends == 1
    for _ in range(64):
        eng.step()
    assert calls["draft"] == 0 and eng.block_counts == {1: 64}
    # + 1: the step enqueued before the host read the request's last tokens (overlap) runs its row once more
    # and that step's stashed feature is appended when the slot is released
    assert eng.runner.stash_steps == 32 and eng.runner.context_appends == 1 + 64 // 32 + 1


def _op_counts(step) -> collections.Counter:
    """aten ops (views left out: no kernel) that ``step()`` runs, by name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func.overloadpacket.__name__ not in ("detach", "alias", "lift_fresh"):
                self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        step()
    return count.ops


@pytest.mark.parametrize("graph_paths", [False, True], ids=["eager", "graph_paths"])
def test_a_block1_step_is_the_ar_step_plus_keeping_its_features(tiny_pair, graph_paths):
    """Adaptive block 1 == AR: the DFlash engine at block 1 and an AR engine (same target, no drafter) run the
    same steps and emit the same tokens, and each block-1 step's device work is the AR step's op for op plus
    keeping the step's features for the drafter (graph path: the layers' output concatenation and the copies into
    the fixed buffers, inside the graph, then into the stash; eager: the concatenation and the stash copies). No
    drafter pass; the drafter's context goes in as one append per stash_steps (32) steps."""
    cfg = RuntimeConfig(max_seq_len=256, max_batch_size=4)
    dflash = Engine.from_dirs(tiny_pair[0], tiny_pair[1], cfg)
    ar = Engine.from_dirs(tiny_pair[0], None, RuntimeConfig(max_seq_len=256, max_batch_size=4, block_size=1))
    assert dflash.block_size == 8 and ar.block_size == 1 and ar.drafter is None
    dflash.policy = FixedPolicy(1)
    drafts = {"n": 0}
    forward = dflash.drafter.forward
    dflash.drafter.forward = lambda *a, **k: drafts.__setitem__("n", drafts["n"] + 1) or forward(*a, **k)
    reqs = {}
    for name, eng in (("dflash", dflash), ("ar", ar)):
        if graph_paths:
            eager_graph_paths(eng).runner._warm = True
        reqs[name] = [eng.add_request(p, SamplingParams(max_new_tokens=120, ignore_eos=True)) for p in prompts(3)]
        for _ in range(3):      # prefills and the first decode steps: every row decodes from here on
            eng.step()
    # the steady decode steps of the two engines, one against the other
    runner, extra, appends = dflash.runner, collections.Counter(), []
    for _ in range(64):
        before = runner.context_appends
        ops_dflash, ops_ar = _op_counts(dflash.step), _op_counts(ar.step)
        if runner.context_appends == before:    # not a flush step
            diff = ops_dflash.copy()
            diff.subtract(ops_ar)
            extra[tuple(sorted((k, v) for k, v in diff.items() if v))] += 1
        else:
            appends.append(runner.context_appends - before)
    # one stash of 32 block-1 steps -> one drafter append: 64 steps, 2 appends
    assert appends == [1, 1] and drafts["n"] == 0
    assert dflash.block_counts == ar.block_counts == {1: dflash.counters["steps"]} and dflash.counters["steps"] > 64
    kept = {("cat", 1), ("copy_", 4)} if graph_paths else {("cat", 1), ("copy_", 2)}
    assert extra == {tuple(sorted(kept)): 62}, extra
    for a, b in zip(reqs["dflash"], reqs["ar"]):
        assert a.output_ids == b.output_ids and len(a.output_ids) > 64


def test_break_even_says_why_a_cpu_engine_drafts_nothing():
    """Served on a CPU, the adaptive policy runs block 1 (0 draft tokens): its start-up line now says why."""
    from trtllm_dflash.runtime.draft_policy import AdaptivePolicy, CostTable, break_even

    costs = CostTable({1: {1: 0.010, 2: 0.017, 4: 0.020, 8: 0.025, 16: 0.033}})
    text = break_even(AdaptivePolicy(16, costs))
    assert "a block-16 step costs 3.3x an AR step (the cheapest drafting block 1.7x)" in text
    assert "more than 1.7 tokens a step" in text and "0 draft tokens" in text


def test_a_table_measured_under_load_is_corrected_on_both_sides():
    """The quick start on a CPU another job held while the costs were measured: the table priced AR at 2x its
    real cost, so drafting looked cheap and ran at 0.78x AR. Scaling by the observed block-16 cost
    alone keeps that ratio; the AR probes (one step in 1 / probe_budget while drafting) time AR itself, and the
    policy returns to AR."""
    table = CostTable({1: {1: 120e-3, 2: 130e-3, 4: 140e-3, 8: 150e-3, 16: 160e-3}})   # AR timed during a burst
    pol = AdaptivePolicy(16, table, probe_budget=0.02)
    for _ in range(50):
        pol.observe(16, [5, 5, 0, 0])          # 3.5 tokens a step at block 8: pays if it costs < 3.5x AR
    picks = []
    for _ in range(400):
        block, reason = pol.choose(1)
        picks.append(block)
        pol.observe_cost(1, block, 60e-3 if block == 1 else 250e-3)   # the real periods: drafting 4.2x AR
    assert picks[0] == 8 and picks[49] == 1                      # drafting, with an AR probe every 50 steps
    assert pol.costs.seconds[1][1] == pytest.approx(60e-3)       # 4 AR probes: the observed AR cost
    assert pol.choose(1)[0] == 1 and picks[-20:].count(1) >= 18   # back on AR, probing drafting now and then


def test_a_drafting_probe_runs_two_steps():
    pol = AdaptivePolicy(16, CostTable({1: {1: 1.0e-3, 2: 1.05e-3, 4: 1.06e-3, 8: 1.08e-3, 16: 1.12e-3}}))
    for _ in range(50):
        pol.observe(16, [0])
    picks = [pol.choose(1) for _ in range(66)]
    probes = [i for i, (b, _) in enumerate(picks) if b > 1]
    assert probes == [31, 32, 64, 65] and picks[32][0] == picks[31][0] == 16
    assert "second step" in picks[32][1]


def test_a_contender_timed_during_a_burst_is_timed_again():
    """Block 8 timed while another job held the CPU looks dearer than block 16 for as long as nothing times it again
    (a quick start at 1.52x against 1.96-2.16x in its other runs). Half-way between the AR probes the next-best
    drafting block at the lower of its observed and start-up prices, if within REFRESH_WITHIN of the best, runs
    min_cost_samples steps whose periods replace its old mean, and the policy goes back to it. A block far behind
    even at its lower price is not re-timed."""
    table = CostTable({2: {1: 127e-3, 2: 179e-3, 4: 188e-3, 8: 185e-3, 16: 282e-3}})
    real = {1: 127e-3, 2: 179e-3, 4: 188e-3, 8: 185e-3, 16: 256e-3}

    def policy(accepted, stale_8):
        pol = AdaptivePolicy(16, table, probe_budget=0.02)
        for _ in range(100):
            pol.observe(16, accepted)
        for _ in range(4):
            pol.observe_cost(2, 8, stale_8)
            pol.observe_cost(2, 16, real[16])
        return pol

    accepted = [7, 3, 12, 2]          # 5.5 tokens a step at block 8, 6.5 at block 16: block 8 wins at real prices
    pol = policy(accepted, stale_8=330e-3)
    assert pol.choose(2)[0] == 16     # at block 8's price from the burst, block 16 wins
    picks, reasons = [], []
    for _ in range(60):
        block, reason = pol.choose(2)
        picks.append(block)
        reasons.append(reason)
        if block > 1:
            pol.observe(block, [min(a, block - 1) for a in accepted][:2])
        pol.observe_cost(2, block, real[block])
    first = next(i for i, r in enumerate(reasons) if r.startswith("refresh block 8"))
    assert picks[first:first + pol.min_cost_samples] == [8] * pol.min_cost_samples
    assert pol.costs.seconds[2][8] == pytest.approx(real[8])        # its old mean is gone
    assert picks[-10:].count(8) >= 9, picks[-10:]                  # and the evidence puts it back on top
    # drafts 8-15 nearly always accepted: block 8 is far behind block 16 even at its table price, never re-timed
    far = policy([15, 15, 15, 14], stale_8=330e-3)
    assert not any(far.choose(2)[1].startswith("refresh") for _ in range(120))


def test_one_stalled_step_does_not_price_a_block_out():
    """A CPU quick start priced block 16 at seconds a step at batch 2 (its table: 176 ms) from one period that spanned
    something other than a step, and never timed it again. A period over STALL_FACTOR times the price the choice
    reads is left out; STALL_RUN of them in a row are a new price and count."""
    from trtllm_dflash.runtime.draft_policy import STALL_FACTOR, STALL_RUN
    table = CostTable({2: {1: 127e-3, 2: 150e-3, 4: 160e-3, 8: 170e-3, 16: 176e-3}})
    pol = AdaptivePolicy(16, table)
    for seconds in (180e-3, 175e-3, 3.2, 178e-3, 176e-3):     # one stall among the block's steady periods
        pol.observe_cost(2, 16, seconds)
    assert pol.stalls_refused == 1
    assert pol.observed_costs()[2][16] == [pytest.approx(177.25, abs=0.01), 4]
    assert pol.costs.seconds[2][16] == pytest.approx(177.25e-3)
    # the machine really got slower: the periods keep coming at 5x and are taken once STALL_RUN arrive in a row
    slow = STALL_FACTOR * 1.25 * 177e-3
    for i in range(STALL_RUN):
        pol.observe_cost(2, 16, slow)
    assert pol.stalls_refused == 1 + (STALL_RUN - 1)   # the stall before, then all but the last of the run
    assert pol.observed_costs()[2][16][1] == 5
    assert pol.costs.seconds[2][16] > 177.25e-3
