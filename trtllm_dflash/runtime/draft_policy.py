# SPDX-License-Identifier: Apache-2.0
"""How many tokens to verify per step (the block; 1 = autoregressive), chosen per step from the batch size,
the running acceptance and measured step costs.

Expected tokens committed by a block of b = 1 + sum_{j<b} P(the first j drafts are all accepted). The drafter
always drafts its trained block (its attention over the block's mask tokens is what it learned), so the
chance that draft j is accepted does not depend on b: per position we keep the conditional acceptance
rate r_j = P(draft j accepted | drafts < j accepted), counted from every verify that reached j (a block of
b observes positions up to b - 1) and decayed so it follows the current traffic. The policy picks the
block with the most tokens per second, E[tokens](b) / cost(batch, b), from a cost table measured on the
device that runs it (``measure_costs``). At block 1 nothing is observed, so now and then it probes: one step
at a drafting block to refresh the rates. A probe costs what its block costs over block 1, so it is paced by
that price: at most ``probe_budget`` of the block-1 time goes to probes (every ``probe_every`` steps where
probes are nearly free, e.g. a launch-bound GPU step; every ~120 steps on a CPU where block 2 costs 1.3x
block 1), and it runs the largest block that costs about as much as the cheapest one (every drafting block
pays for draft 1 being accepted first, so that rate decides whether drafting can pay at all).

Drafting is chosen on evidence, not on the prior: for the choice the prior counts as rejected drafts, so the
first probe (run because the prior says drafting might pay) does not by itself start a run of drafting steps
that each cost more than an AR step (on a CPU the quick start's short answers paid for such runs; issue #24).
Costs are measured in rounds over all blocks so that a burst of load on a shared CPU does not skew one block, and
taken as measured: a larger block can cost less than a smaller one (on an H200 a block-2 step took 2.9 ms where
block 4 took 1.2 ms: its kernels take another path), so forcing the table to grow with the block priced every
block at block 2's cost and kept the policy on AR.

The start-up table is a prior, not the truth: it times one synchronous step at a time, while the engine overlaps
the host's work for a step with the device's run of the previous one. On an H200 the table made drafting look
dearer than it was and the policy ran AR at 0.97x where the fixed block ran 1.47x (SmolLM2, HumanEval,
concurrency 1). So the engine also reports each step's real period (``observe_cost``): once a (batch, block)
has ``min_cost_samples`` of them their running mean replaces the table's figure, and the blocks not yet seen that
often keep the table's ratios at the scale the seen ones show. Scale alone cannot fix the table's *ratios*, which
decide between AR and drafting (a table measured while another job held the CPU had the quick start draft at block
16 at 0.78x AR, and only block 16 was ever observed), so both sides are observed: a probe runs its drafting block
for two steps (the first pays for appending the drafter context of the block-1 steps before it and is not timed;
the second is), and while drafting wins, one step in ``1 / probe_budget`` runs block 1 to time AR.

The ratios *between drafting blocks* need the same care: a block the policy never runs is never timed, so a table
that prices it too dear keeps it unchosen for good. On an H100 (SmolLM2, HumanEval, concurrency 1) the policy ran
block 4 for 503 of 572 steps and block 16 never, while the fixed block 16 ran 1.94x AR to the policy's 1.83x: a
real block-16 step there cost what a block-4 step did. The same holds for acceptance: a policy that only ever ran
block 2 has no evidence about drafts 2-15, so it counts them rejected and block 2 stays best (a CPU quick start whose
cost table was measured under load ran block 2 for 173 steps at 1.57x, where runs that reached blocks 8 and 16
printed 2.0-2.2x). So while drafting wins, a drafting block whose cost is not yet observed at this batch size is
tried for ``min_cost_samples`` timed steps when it would beat the current choice at the cheapest drafting cost
observed there with its draft positions counted at the optimistic prior where they lack evidence (optimistic on
both counts: a larger block can cost less than a smaller one). That happens at most once per block and batch size
(``EXPLORE_STEPS`` caps it where steps are rarely timed), and the evidence then decides.

An observed cost also goes stale: a block timed during a burst of load on a shared CPU keeps that price while another
block is chosen, since nothing times it again (a quick start printed 1.52x where its other runs printed 1.96-2.16x:
its last three rounds ran at ~1.5x with block 16 the choice at batch 2, where the start-up table had blocks 4 and 8
at two thirds of block 16's cost). So while drafting wins, once per ``1 / probe_budget`` drafting steps (half-way
between the block-1 probes) the drafting block next best at the lower of its observed and start-up prices, if that
rate is within ``REFRESH_WITHIN`` of the best, runs ``min_cost_samples`` steps whose periods replace its old mean: a
close contender's price is never older than that. Nor does one period that spans more than a step set a price (every
quick start had three, its AR rounds read as DFlash steps, until ``Engine.generate`` stopped leaving a step to be
timed across its caller's work): a period several times what the choice reads for its block is left out unless such
periods keep coming (``STALL_FACTOR``, ``STALL_RUN``).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path


# A probe runs the largest drafting block that costs at most this much over the cheapest one: it observes more draft
# positions for about the same price. At 1.1 the quick start's CPU tables (blocks 2, 4 and 8 within ~15% of each
# other) flipped between blocks 2 and 8 from run to run with the timing noise, and the probes' yield with them (the
# printed DFlash/AR moved 13% over five runs).
PROBE_COST_SLACK = 1.25
# An unobserved drafting block is tried only where it would beat the current choice by more than this at the cheapest
# observed drafting cost: a block that adds no expected tokens (its extra positions never accepted) is not worth timing.
EXPLORE_MARGIN = 1.02
EXPLORE_STEPS = 16   # steps an unobserved block may run to collect its timed samples, once per block and batch size
# A drafting block whose rate at its lower price (observed or start-up table) is at least this share of the best one's
# is re-timed now and then: that close, its real price could make it the best; one further behind costs more to
# re-time than it can win.
REFRESH_WITHIN = 0.9
# A step period this many times the price the choice reads for its block spans more than the step (a stall, a gap the
# engine's timing did not see), and is not counted, unless STALL_RUN come in a row: then the price has changed.
STALL_FACTOR = 4.0
STALL_RUN = 3


def candidate_blocks(block_size: int) -> list[int]:
    """1, powers of two below the trained block, and the block itself: few shapes, few CUDA graphs.
    The same series over max_batch_size is the runner's batch buckets (runner._bucket), measured by
    Engine.use_adaptive_policy."""
    out, b = [1], 2
    while b < block_size:
        out.append(b)
        b *= 2
    return out + [block_size] if block_size > 1 else out


@dataclass
class CostTable:
    """Measured seconds per step, {batch: {block: s}}, at the batch buckets the engine runs."""

    seconds: dict[int, dict[int, float]]
    device: str = ""
    context: int = 0   # tokens in the KV cache per row when measured

    def bucket(self, batch: int) -> int:
        """The measured batch size a batch is charged at: the smallest >= batch (the engine pads to a bucket;
        never underestimates), else the largest."""
        sizes = sorted(self.seconds)
        return next((s for s in sizes if s >= batch), sizes[-1])

    def cost(self, batch: int, block: int) -> float:
        row = self.seconds[self.bucket(batch)]
        if block in row:
            return row[block]
        blocks = sorted(row)
        hi = next((k for k in blocks if k >= block), blocks[-1])
        lo = max((k for k in blocks if k <= block), default=blocks[0])
        if hi == lo:
            return row[hi]
        return row[lo] + (row[hi] - row[lo]) * (block - lo) / (hi - lo)

    def describe(self) -> str:
        return "; ".join(f"batch {n}: " + " ".join(f"b{b}={1e3 * s:.1f}ms" for b, s in sorted(row.items()))
                         for n, row in sorted(self.seconds.items()))

    def to_json(self) -> dict:
        return {"device": self.device, "context": self.context,
                "seconds": {str(b): {str(k): v for k, v in r.items()} for b, r in self.seconds.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "CostTable":
        return cls({int(b): {int(k): float(v) for k, v in r.items()} for b, r in d["seconds"].items()},
                   d.get("device", ""), int(d.get("context", 0)))

    @classmethod
    def load(cls, path) -> "CostTable":
        return cls.from_json(json.loads(Path(path).read_text()))


@dataclass
class AcceptanceStats:
    """Decayed per-position counts of drafts tried and accepted (position j = the j-th draft, 1-based)."""

    block_size: int
    decay: float = 0.98          # per observed step: ~50 steps of memory
    prior_rate: float = 0.5      # before any evidence: half the drafts accepted at each position ...
    prior_weight: float = 2.0    # ... worth this many observations
    tried: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.tried = [0.0] * self.block_size
        self.passed = [0.0] * self.block_size

    def observe(self, block: int, accepted: list[int]) -> None:
        """accepted: drafts accepted per row of one verify of ``block`` tokens. Only the positions this block
        reaches (1 .. block - 1) decay: a step at block 2 says nothing about draft 3, and decaying what a larger
        block once observed there let the evidence fade to the prior (counted as rejections for the choice), so a
        policy that chose block 2 once could never again find block 4 worth it (the CPU quick start ran 134 steps at
        block 2 and printed 1.56x where runs at blocks 4 and 8 printed 2.06-2.14x)."""
        if block < 2 or not accepted:
            return
        reach = min(block, self.block_size)
        self.tried = [t * self.decay if j < reach else t for j, t in enumerate(self.tried)]
        self.passed = [p * self.decay if j < reach else p for j, p in enumerate(self.passed)]
        for a in accepted:
            for j in range(1, min(a + 1, block - 1) + 1):   # positions up to the first rejection were tried
                self.tried[j] += 1
                self.passed[j] += j <= a

    def rate(self, j: int, prior_rate: float | None = None) -> float:
        w, r = self.prior_weight, self.prior_rate if prior_rate is None else prior_rate
        return (self.passed[j] + w * r) / (self.tried[j] + w)

    def expected_tokens(self, block: int, prior_rate: float | None = None) -> float:
        total, p = 1.0, 1.0
        for j in range(1, block):
            p *= self.rate(j, prior_rate)
            total += p
        return total


class FixedPolicy:
    def __init__(self, block: int):
        self.block = block

    def choose(self, batch: int) -> tuple[int, str]:
        return self.block, "fixed"

    def observe(self, block: int, accepted: list[int]) -> None:
        pass

    def observe_cost(self, batch: int, block: int, seconds: float) -> None:
        pass


class AdaptivePolicy:
    """The block with the most expected tokens per second at this batch size (see the module docstring)."""

    def __init__(self, block_size: int, costs: CostTable, probe_every: int = 32, stats: AcceptanceStats | None = None,
                 probe_budget: float = 0.02, min_cost_samples: int = 4, cost_decay: float = 0.9):
        self.block_size, self.probe_every, self.probe_budget = block_size, probe_every, probe_budget
        self.measured = costs   # the start-up table, kept as measured (describe, break_even)
        # the table the choices read: the measured one, each entry replaced by the running mean of the engine's
        # observed step periods once it has min_cost_samples of them
        self.costs = CostTable({n: dict(row) for n, row in costs.seconds.items()}, costs.device, costs.context)
        self.min_cost_samples, self.cost_decay = min_cost_samples, cost_decay
        self._observed: dict[tuple[int, int], tuple[float, int]] = {}   # (bucket, block) -> (mean s, samples)
        self._usable: dict[int, dict[int, float]] = {}   # bucket -> {block: mean s} of those with enough samples
        self.stats = stats or AcceptanceStats(block_size)
        self.blocks = candidate_blocks(block_size)
        self._ar_steps = self._draft_steps = 0
        self.ar_probe_every = math.ceil(1 / probe_budget)   # while drafting wins: one block-1 step in this many
        self._probe_next = 0   # a probe's second step (its block), chosen with the first
        self._explored: dict[tuple[int, int], int] = {}   # (bucket, block) -> steps run to time it
        self._refresh: tuple[int, int] = (0, 0)   # (block, steps left) of a re-timing under way
        self._stalls: dict[tuple[int, int], int] = {}   # (bucket, block) -> stall-sized periods in a row
        self.stalls_refused = 0

    def probe(self, batch: int) -> tuple[int, int]:
        """(block, steps between probes) at this batch size: the largest drafting block within PROBE_COST_SLACK of
        the cheapest one's cost, often enough to spend at most ``probe_budget`` of the block-1 time on probes."""
        drafting = [b for b in self.blocks if b > 1]
        cheapest = min(self.costs.cost(batch, b) for b in drafting)
        block = max(b for b in drafting if self.costs.cost(batch, b) <= PROBE_COST_SLACK * cheapest)
        ar = self.costs.cost(batch, 1)
        extra = 2 * max(self.costs.cost(batch, block) - ar, 0.0)   # a probe is two steps
        return block, max(self.probe_every, math.ceil(extra / (self.probe_budget * ar)))

    def rates(self, batch: int, prior_rate: float | None = 0.0) -> dict[int, float]:
        """Expected tokens per second per row-step for each candidate block. Drafting is chosen on evidence:
        the prior counts as ``prior_weight`` rejected drafts (prior_rate 0), so a block > 1 wins only once
        observed acceptance pays for its cost; the optimistic prior (None: ``stats.prior_rate``) only decides
        whether a first probe is worth running."""
        return {b: self.stats.expected_tokens(b, prior_rate) / self.costs.cost(batch, b) for b in self.blocks}

    def choose(self, batch: int) -> tuple[int, str]:
        if self._probe_next:
            block, self._probe_next = self._probe_next, 0
            return block, f"probe at block {block}: its second step (timed: the first appended the AR steps' context)"
        if self._refresh[1]:
            block, left = self._refresh
            self._refresh = (block, left - 1)
            self._draft_steps += 1     # drafting steps all the same: the AR probes keep their pace
            return block, f"refresh block {block}: re-timing its step ({left - 1} more)"
        rates = self.rates(batch)
        best = max(rates, key=rates.get)
        hopeful = self.rates(batch, prior_rate=None)
        if max(hopeful, key=hopeful.get) > 1 and not any(self.stats.tried):
            # only the prior says drafting pays: learn the acceptance with one probe before drafting more (on a CPU,
            # the prior alone had the smollm2 quick start run 3-5 steps at block 4 that each cost 1.7x block 1)
            block = self.probe(batch)[0]
            return block, f"probe at block {block}: no acceptance observed yet"
        if best == 1 and self.block_size > 1:
            self._ar_steps += 1
            block, every = self.probe(batch)
            if self._ar_steps >= every:   # not a modulo: the pace moves as observed costs replace the table's
                ran, self._ar_steps = self._ar_steps, 0
                self._probe_next = block
                return block, (f"probe at block {block}: refresh acceptance and cost (AR for {ran} steps; a "
                               f"two-step probe per {every} steps keeps probes under {self.probe_budget:.0%} of "
                               f"the AR time)")
        elif best > 1:
            self._ar_steps = 0
            self._draft_steps += 1
            if self._draft_steps >= self.ar_probe_every:
                self._draft_steps = 0
                return 1, (f"probe at block 1: refresh the AR step's cost (one step per {self.ar_probe_every} "
                           "drafting steps)")
            if self._draft_steps == self.ar_probe_every // 2:
                runner = self.stale_contender(batch, rates, best)
                if runner is not None:
                    n = self.costs.bucket(batch)
                    mean, _ = self._observed[n, runner]
                    self._observed[n, runner] = (mean, 0)     # the next samples replace the old mean
                    self._refresh = (runner, self.min_cost_samples - 1)
                    return runner, (f"refresh block {runner}: {rates[runner]:.0f} tok/s per row at a price timed "
                                    f"earlier vs {rates[best]:.0f} at block {best}; re-timing it "
                                    f"({self.min_cost_samples} steps per {self.ar_probe_every} drafting steps)")
            explore = self.unobserved_worth_timing(batch, rates[best])
            if explore is not None:
                block, floor = explore
                key = (self.costs.bucket(batch), block)
                self._explored[key] = self._explored.get(key, 0) + 1
                return block, (f"explore block {block}: its cost at batch {batch} is not observed yet, and at the "
                               f"cheapest drafting step observed there ({1e3 * floor:.2f} ms) it would beat block "
                               f"{best} ({rates[best]:.0f} tok/s per row)")
        full = self.block_size
        return best, (f"batch {batch}: {self.stats.expected_tokens(best, 0.0):.2f} tok / "
                      f"{1e3 * self.costs.cost(batch, best):.1f} ms = {rates[best]:.0f} tok/s per row at block {best}"
                      + (f" vs {rates[full]:.0f} at block {full}" if best != full else "")
                      + (f" vs {rates[1]:.0f} at block 1 (AR)" if best != 1 else ""))

    def stale_contender(self, batch: int, rates: dict[int, float], best: int) -> int | None:
        """The drafting block other than ``best`` whose cost is observed at this batch size and whose rate at the
        lower of its two prices (observed, start-up table) is the highest, if that rate is within REFRESH_WITHIN of
        the best's: the one whose price is worth timing again. The lower price, because a price timed during a
        burst is exactly what makes a block look far behind."""
        seen = self._usable.get(self.costs.bucket(batch), {})
        hopeful = {b: self.stats.expected_tokens(b, 0.0) / min(c, self.measured.cost(batch, b))
                   for b, c in seen.items() if b > 1 and b != best}
        if not hopeful:
            return None
        runner = max(hopeful, key=hopeful.get)
        return runner if hopeful[runner] >= REFRESH_WITHIN * rates[best] else None

    def unobserved_worth_timing(self, batch: int, best_rate: float) -> tuple[int, float] | None:
        """(block, the cheapest observed drafting cost) for the largest drafting block whose cost is not observed at
        this batch size and that would beat ``best_rate`` at that cost with the optimistic prior's acceptance where
        it has no evidence; None when no such block is left (or no drafting cost is observed here yet, so there is
        no bound to be optimistic with)."""
        n = self.costs.bucket(batch)
        seen = self._usable.get(n, {})
        floor = min((c for b, c in seen.items() if b > 1), default=None)
        if floor is None:
            return None
        for b in reversed(self.blocks[1:]):
            if b in seen or self._explored.get((n, b), 0) >= EXPLORE_STEPS:
                continue
            if self.stats.expected_tokens(b, None) / floor > EXPLORE_MARGIN * best_rate:
                return b, floor
        return None

    def observe(self, block: int, accepted: list[int]) -> None:
        self.stats.observe(block, accepted)

    def observe_cost(self, batch: int, block: int, seconds: float) -> None:
        """One step's real period at this batch and block (the engine's wall time between two results while the
        device ran back to back): a running mean per (batch bucket, block) that replaces the start-up table's entry
        from the ``min_cost_samples``-th sample on; the bucket's other entries follow at the observed scale. A period
        over STALL_FACTOR times the price the choice reads is left out unless STALL_RUN such come in a row: one such
        sample once priced block 16 at seconds a step on a CPU quick start (the table: 176 ms), and nothing timed it
        again. Its source, the step Engine.generate left in flight, is gone; this guards against the next one."""
        n = self.costs.bucket(batch)
        if block not in self.costs.seconds[n] or seconds <= 0:
            return
        if seconds > STALL_FACTOR * self.costs.seconds[n][block]:
            run = self._stalls.get((n, block), 0) + 1
            self._stalls[n, block] = run
            if run < STALL_RUN:
                self.stalls_refused += 1
                return
        self._stalls.pop((n, block), None)
        mean, k = self._observed.get((n, block), (seconds, 0))
        w = min(self.cost_decay, k / (k + 1))   # a plain mean over the first samples, then exponential
        self._observed[n, block] = (w * mean + (1 - w) * seconds, k + 1)
        # the blocks with enough samples take their observed cost; the others keep the table's shape at the
        # observed scale (a table that times every step too dear must not make the blocks run less look dearer)
        if k + 1 < self.min_cost_samples:
            return
        table = self.measured.seconds[n]
        seen = self._usable.setdefault(n, {})
        seen[block] = self._observed[n, block][0]
        scale = math.exp(sum(math.log(m / table[b]) for b, m in seen.items()) / len(seen))
        self.costs.seconds[n] = {b: seen.get(b, v * scale) for b, v in table.items()}

    def observed_costs(self) -> dict:
        """{batch: {block: [mean ms, samples]}} of the observed step periods (what replaced the table)."""
        out: dict = {}
        for (n, b), (mean, k) in sorted(self._observed.items()):
            out.setdefault(n, {})[b] = [round(1e3 * mean, 4), k]
        return out


def break_even(policy: AdaptivePolicy, batch: int = 1) -> str:
    """Why an adaptive engine may report 0 draft tokens: what a drafting step must accept to beat AR here."""
    costs = policy.measured
    ar = costs.cost(batch, 1)
    full = policy.block_size
    ratio = costs.cost(batch, full) / ar
    best = min(costs.cost(batch, b) / ar for b in policy.blocks if b > 1)
    return (f"at batch {batch} a block-{full} step costs {ratio:.1f}x an AR step (the cheapest drafting block "
            f"{best:.1f}x): drafting pays only when it yields more than {best:.1f} tokens a step, so until the "
            f"acceptance it observes does, it runs block 1 (AR: 0 draft tokens, same output) and probes now and then")


def best_block(policy: AdaptivePolicy, batch: int) -> int:
    """The block the policy prefers at this batch size at its acceptance estimate, prior included (a schedule
    derived for TensorRT-LLM has only the assumed acceptance to go on), without probing."""
    rates = policy.rates(batch, prior_rate=None)
    return max(rates, key=rates.get)


def measure_costs(runner, batches: list[int], blocks: list[int], context: int, reps: int = 3) -> CostTable:
    """Seconds per decode step of ``runner`` at each batch and block, the KV cache holding ``context``
    tokens per row (warm-up and CUDA-graph capture excluded; the slots must be empty)."""
    import torch
    seconds: dict[int, dict[int, float]] = {}
    saved = runner.start_host[:]
    for n in batches:
        times: dict[int, list[float]] = {b: [] for b in blocks}
        # rounds over all blocks (the first one a warm-up), so a burst of load on a shared CPU lands on one
        # sample of every block rather than on every sample of one block
        for i in range(reps + 1):
            for b in blocks:
                runner.start_host[:n] = [context] * n
                runner.start[:n] = context
                # the block-1 step just timed left its drafter context stashed and the next drafting step appends it
                # first: a transition's cost, not the block's, which block 2 (next in the round) used to pay here
                # (the likely cause of an H200 table with block 2 at 2.9 ms against 1.2 ms at block 4)
                runner.flush_context()
                if runner.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                runner.decode(n, b)
                if i:
                    times[b].append(time.perf_counter() - t0)
        seconds[n] = {b: sorted(t)[len(t) // 2] for b, t in times.items()}
    runner.start_host[:] = saved
    runner.start.zero_()
    return CostTable(seconds, str(runner.device), context)
