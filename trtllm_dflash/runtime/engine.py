# SPDX-License-Identifier: Apache-2.0
"""The torch DFlash runtime: continuous batching over a static KV cache, one draft + verify per step.

    step() = schedule (scheduler.py: who runs, prompt chunks under the token budget, the block)
           -> run (runner.py: prefill chunks, then draft + verify on the device)
           -> postprocess (here: commit tokens, stop conditions, streaming, statistics)

``block`` = 1 anchor + block-1 drafted tokens (z-lab's block_size); block 1 is autoregressive decoding
through the same loop. The draft policy (draft_policy.py) picks the block per step, fixed by default.

Threading: ``add_request`` and ``cancel`` may be called from any thread; ``step`` from one thread only.
Tensor parallelism: every rank runs ``step``; rank 0 schedules and broadcasts its SchedulerOutput,
ranks > 0 call ``follow()``.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..config import RuntimeConfig, SamplingParams
from ..deployment import Deployment
from ..errors import DFlashError
from . import loader
from .distributed import TPGroup
from .draft_policy import AdaptivePolicy, CostTable, FixedPolicy, break_even, candidate_blocks, measure_costs
from .kernels import Kernels
from .runner import Launched, Runner
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence

__all__ = ["Engine", "Sequence"]


@dataclass
class _Step:
    """A step in flight: what was scheduled, where its results land, and who its rows belonged to then."""

    out: SchedulerOutput
    handle: Launched
    first: list[tuple[int, Sequence]]   # (slot, request) whose prompt this step completes
    rows: list[tuple[int, Sequence]]    # (slot, request) decoding in this step
    queued: bool = False                # enqueued while the previous step still ran: it started as that one ended


def _check_kernels(cfg: RuntimeConfig, target, drafter) -> Kernels:
    """The Kernels that cfg's kernels / batch_invariant choose for these models' device and dtype, which both models
    must have been built with (loader.load_pair builds them so): a module's kernels are fixed at construction."""
    p = next(target.parameters())
    want = Kernels.choose(cfg.kernels, cfg.batch_invariant, p.device, p.dtype)
    for who, model in (("target", target), ("drafter", drafter)):
        if model is not None and model.kernels != want:
            raise DFlashError("kernels", f"the {who} was built with {model.kernels}, but RuntimeConfig(kernels="
                              f"{cfg.kernels!r}, batch_invariant={cfg.batch_invariant}) chooses {want} on {p.device}",
                              "build both models with kernels=Kernels.choose(...) of this config (runtime.loader does)")
    return want


class Engine:
    def __init__(self, target, drafter, tokenizer, cfg: RuntimeConfig, tp: TPGroup, eos_ids: set[int]):
        self.target, self.drafter, self.tokenizer, self.cfg, self.tp = target, drafter, tokenizer, cfg, tp
        self.block_size = cfg.block_size or (drafter.config.block_size if drafter is not None else 1)
        if self.block_size > 1 and drafter is None:
            raise DFlashError("drafter", f"block_size {self.block_size} needs a drafter", "pass --drafter or use block_size 1")
        self.eos_ids = set(eos_ids)
        self.kernels = _check_kernels(cfg, target, drafter)
        self.runner = Runner(target, drafter, cfg, tp, self.block_size, propose=self._propose)
        self.scheduler = Scheduler(cfg.max_batch_size, cfg.max_num_tokens, self.runner.prefill_shape,
                                   self.runner.chunk_cap)
        self.device, self.dtype = self.runner.device, self.runner.dtype
        self.policy = FixedPolicy(self.block_size)
        self.counters = {"steps": 0, "max_active_batch": 0, "prefills": 0, "finished": 0}
        self.block_counts: dict[int, int] = {}   # steps run at each block
        self.last_block, self.last_reason = 0, ""
        self._in_flight: _Step | None = None     # the step the device runs while the host post-processes
        self._last_read: float | None = None     # when the last step's results were read (perf_counter)
        self._last_block = 0                     # the block of the last decode step read (0: it had none)
        self.startup_capture = {"graphs": 0, "seconds": 0.0}
        if self.runner.use_graphs and cfg.capture_graphs_at_start:
            self._capture([self.block_size])

    def _capture(self, blocks: list[int]) -> None:
        self.startup_capture = self.runner.warm_up(blocks)
        if self.tp.rank == 0:
            print(f"[trtllm_dflash] captured {self.startup_capture['graphs']} CUDA graphs at start-up in "
                  f"{self.startup_capture['seconds']:.1f}s (blocks {blocks})", file=sys.stderr)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dirs(cls, target_dir, drafter_dir=None, cfg: RuntimeConfig = RuntimeConfig(), *, tp_size: int = 1,
                  allow_pickle: bool = False, presharded: dict | None = None, ep_size: int = 1) -> "Engine":
        return cls(**vars(loader.load_pair(target_dir, drafter_dir, cfg, tp_size=tp_size, allow_pickle=allow_pickle,
                                           presharded=presharded, ep_size=ep_size)))

    @classmethod
    def from_deployment(cls, deployment, draft_policy: str | None = None, **overrides) -> "Engine":
        """Load a torch deployment (a ``Deployment``, or its directory: opened here) and run the draft policy it
        names (older directories: fixed) unless ``draft_policy`` says otherwise. ``overrides``: RuntimeConfig
        fields replacing the deployment's. adaptive measures this device's step costs here, before the first
        request (the slots are empty)."""
        deployment = Deployment.of(deployment)
        policy = draft_policy or deployment.draft_policy
        if policy not in ("adaptive", "fixed"):   # before any weight is loaded
            raise DFlashError("draft_policy", f"{policy!r} is not adaptive or fixed", "rebuild with dflash-build")
        engine = cls(**vars(loader.load(deployment, overrides)))
        if policy == "adaptive" and engine.block_size > 1:
            if engine.tp.size > 1:
                raise DFlashError("draft_policy", "adaptive measures step costs on rank 0 alone (needs tp_size 1)",
                                  "rebuild with --draft_policy fixed")
            engine.measure_adaptive_policy("[trtllm_dflash] draft policy adaptive:")
        return engine

    def use_adaptive_policy(self, costs: CostTable | None = None, context: int = 256,
                            max_batch: int | None = None) -> AdaptivePolicy:
        """Pick the block per step (draft_policy.AdaptivePolicy); without a cost table, measure one now on
        this device at the batch buckets up to ``max_batch`` (default max_batch_size; the slots must be empty)."""
        if self.runner.use_graphs and self.cfg.capture_graphs_at_start:
            self._capture(candidate_blocks(self.block_size))   # every block the policy may pick
        if costs is None:
            top = min(max_batch or self.cfg.max_batch_size, self.cfg.max_batch_size)
            # batches: 1, the powers of two below top, and top (the runner's batch buckets: same series)
            costs = measure_costs(self.runner, candidate_blocks(top), candidate_blocks(self.block_size),
                                  min(context, self.cfg.max_seq_len - self.block_size - 1))
        self.policy = AdaptivePolicy(self.block_size, costs)
        return self.policy

    def measure_adaptive_policy(self, tag: str, context: int = 256, max_batch: int | None = None) -> AdaptivePolicy:
        """use_adaptive_policy measuring this device's step costs, on stderr under ``tag``: announced first (a CPU
        sits silent for the 5-80 s it takes) and explained after (why the engine may then draft nothing)."""
        print(f"{tag} measuring step costs on this device (once; 5-80 s on a CPU)...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        pol = self.use_adaptive_policy(context=context, max_batch=max_batch)
        print(f"{tag} measured step costs in {time.perf_counter() - t0:.1f}s: {pol.measured.describe()}; "
              f"{break_even(pol)}", file=sys.stderr)
        return pol

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                    on_tokens: Callable | None = None, client: str = "") -> Sequence:
        if not prompt_ids:
            raise DFlashError("prompt", "is empty", "send at least one token")
        limit = self.cfg.max_seq_len - self.block_size - 1
        if len(prompt_ids) > limit:
            raise DFlashError("prompt", f"has {len(prompt_ids)} tokens; this engine takes at most {limit}",
                              f"shorten the prompt or rebuild with a larger max_seq_len (now {self.cfg.max_seq_len})")
        vocab = self.target.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DFlashError("prompt", f"has token ids outside [0, {vocab})", "tokenize with the target's tokenizer")
        seq = Sequence(list(prompt_ids), params, on_tokens, client=client)
        self.scheduler.add(seq)
        return seq

    def cancel(self, request_id: int) -> None:
        self.scheduler.cancel(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    @property
    def slots(self) -> list[Sequence | None]:
        return self.scheduler.slots

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] = SamplingParams()) -> list[Sequence]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        while not all(r.done for r in reqs):
            self.step()
        # A step may still be in flight (a finished row runs once more); the next call reads it after whatever the
        # caller did meanwhile, so its read-to-read period is no price (the quick start reported the AR round between
        # two DFlash rounds as one step of seconds).
        self._last_read = None
        return reqs

    def metrics(self) -> dict:
        return {**self.counters, "graphs": self.runner.num_graphs, "graphs_captured_mid_run": self.runner.captured_mid_run,
                "active": self.scheduler.num_running(),
                "waiting": self.scheduler.num_waiting(), "block_size": self.block_size,
                "max_batch_size": self.cfg.max_batch_size, "adaptive_policy": int(isinstance(self.policy, AdaptivePolicy)),
                "last_block": self.last_block,
                **{f"steps_block_{b}": k for b, k in sorted(self.block_counts.items())}}   # flat ints: /metrics

    # ---- the loop -------------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Schedule and enqueue this step (prefill chunks, then one draft + verify over the decoding slots), then
        read and post-process the previous one while the device runs this one (the overlap of SGLang's and vLLM
        V1's schedulers). Returns the requests that finished; a request's tokens come one step after its step ran.
        The scheduler sees a finish one step late, so a finished row may run once more: its results are dropped."""
        out, finished, arriving = self._schedule()
        finished += self._apply(out, arriving)
        launched = self._launch(out) if out.chunks or out.decode_rows else None
        if self._in_flight is not None:
            if launched is not None:
                launched.queued = True
            finished += self._postprocess(self._in_flight)
            self._time(self._in_flight)
        self._in_flight = launched
        return finished

    def _time(self, st: "_Step") -> None:
        """Tell the policy what a decode step really cost: a step queued behind the previous one started when that
        one's results were read, so the time between the two reads is its period (the GPU's run time when the GPU is
        the bottleneck, the host loop's when the host is). Steps that do more than their block's steady work do not
        count: a step that also prefills, and a drafting step after block-1 steps or a prefill (it first appends
        their drafter context: on an H200 such steps took 2x a steady block-16 step, which would have kept the
        policy on AR). A block-1 step after drafting steps, or a drafting block after another, counts."""
        now, last = time.perf_counter(), self._last_read
        previous, self._last_read, self._last_block = self._last_block, now, st.out.block if st.out.decode_rows else 0
        appends = st.out.block > 1 and previous <= 1
        if st.queued and last is not None and st.out.decode_rows and not st.out.chunks and not appends:
            self.policy.observe_cost(st.out.decode_rows, st.out.block, now - last)

    def _schedule(self) -> tuple[SchedulerOutput, list[Sequence], dict[int, Sequence]]:
        """Rank 0 decides and broadcasts; the other ranks receive the same SchedulerOutput.
        Returns it, the waiting requests cancelled, and the admitted Sequences by request id."""
        if self.tp.rank == 0:
            out, dropped, arriving = self.scheduler.schedule(self.policy.choose)
            if self.tp.active:
                self.tp.broadcast_object(out)
            return out, [self._finish(s, "cancelled") for s in dropped], arriving
        out = self.tp.broadcast_object(None)
        if out.stop:
            raise StopIteration
        return out, [], {rid: Sequence(p, sp, request_id=rid, slot=slot) for slot, p, sp, rid in out.admit}

    def _apply(self, out: SchedulerOutput, arriving: dict[int, Sequence]) -> list[Sequence]:
        """Cancelled requests leave their slots, then admitted ones take theirs."""
        leaving = set(out.cancel)
        finished = [self._finish(s, "cancelled") for s in self.slots if s is not None and s.request_id in leaving]
        for slot, _, params, rid in out.admit:
            self.slots[slot] = arriving[rid]
            self.runner.admit(slot, params)
        return finished

    def _launch(self, out: SchedulerOutput) -> "_Step":
        prompts = {}
        for s, _, end in out.chunks:
            seq = self.slots[s]
            prompts[s], seq.num_prefilled = seq.prompt_ids, end   # the next schedule sees this chunk as done
        ahead = self._in_flight.out.block if self._in_flight is not None and self._in_flight.out.decode_rows else 0
        handle = self.runner.launch(out.chunks, prompts, out.decode_rows, out.block, ahead)
        first = [(s, self.slots[s]) for s, _, end in out.chunks if end == len(self.slots[s].prompt_ids)]
        rows = [(i, seq) for i, seq in enumerate(self.slots[: out.decode_rows]) if seq is not None and seq.decoding]
        return _Step(out, handle, first, rows)

    def _postprocess(self, st: "_Step") -> list[Sequence]:
        firsts, t, a = self.runner.collect(st.handle)   # the step's one host sync
        finished = []
        for slot, seq in st.first:
            if seq.done:   # cancelled while its prefill ran
                continue
            seq.stats.num_prompt_tokens = len(seq.prompt_ids)
            seq.stats.ttft_s = time.perf_counter() - seq.t_arrival
            self.counters["prefills"] += 1
            done = self._emit(seq, [firsts[slot]])
            if done:
                finished.append(self._finish(seq, done))
        if st.out.decode_rows:
            live = [(i, seq) for i, seq in st.rows if self.slots[i] is seq]   # rows still held by their request
            self.runner.advance([i for i, _ in live], a)
            finished += self._postprocess_decode(st.out, live, t, a)
        return finished

    def _postprocess_decode(self, out: SchedulerOutput, rows, t: list[list[int]], a: list[int]) -> list[Sequence]:
        b = out.block
        self.counters["steps"] += 1
        running = self.scheduler.num_running()
        if running > self.counters["max_active_batch"]:
            self.counters["max_active_batch"] = running
        self.block_counts[b] = self.block_counts.get(b, 0) + 1
        self.last_block, self.last_reason = b, out.reason
        finished, accepted = [], []
        for i, seq in rows:
            if seq.done:
                continue
            k = a[i]
            accepted.append(k)
            seq.stats.acceptance_lengths.append(k + 1)
            seq.stats.num_draft_tokens += b - 1
            seq.stats.num_accepted_draft_tokens += k
            done = self._emit(seq, t[i][: k + 1])
            if done:
                finished.append(self._finish(seq, done))
        self.policy.observe(b, accepted)
        return finished

    def _propose(self, last, pos, start, rows, ctx_len: int, num_drafts: int):
        """The first ``num_drafts`` drafts [n, >= num_drafts] for the block at positions pos [n, B] (tests plant
        drafters here; extra columns are cut)."""
        return self.runner.draft(last, pos, start, rows, ctx_len, num_drafts)

    # ---- bookkeeping ----------------------------------------------------------------------------
    def _emit(self, req: Sequence, toks: list[int]) -> str | None:
        """Append committed tokens (cut at a stop token or the budget); returns a finish reason or None."""
        p, reason = req.params, None
        if req.stop_ids is None:   # once per request: this runs for every row of every step
            req.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(self.eos_ids))
        stops = req.stop_ids
        cut = next((j for j, tok in enumerate(toks) if tok in stops), None) if not stops.isdisjoint(toks) else None
        if cut is not None:
            toks, reason = toks[: cut + 1], "stop"
        room = p.max_new_tokens - len(req.output_ids)
        if len(toks) > room or (len(toks) == room and reason is None):
            toks, reason = toks[:room], "length"
        req.output_ids.extend(toks)
        if reason is None and self.runner.start_host[req.slot] + self.block_size > self.cfg.max_seq_len:
            reason = "length"  # the KV cache row is full
        now = time.perf_counter()
        if len(req.output_ids) > len(toks):
            req.stats.decode_s = now - req.t_arrival - req.stats.ttft_s
        req.stats.num_output_tokens = len(req.output_ids)
        if req.on_tokens is not None and toks:
            req.on_tokens(req, toks)
        return reason

    def _finish(self, req: Sequence, reason: str) -> Sequence:
        req.finish_reason = reason
        if req.slot >= 0 and self.slots[req.slot] is req:
            self.slots[req.slot] = None
            self.runner.release(req.slot)
        self.counters["finished"] += 1
        req.done_event.set()
        return req

    def follow(self, close: bool = True) -> None:
        """Ranks > 0: mirror rank 0's steps until it calls shutdown(); then leave the group unless
        ``close`` is False (another engine will use it)."""
        try:
            while True:
                self.step()
        except StopIteration:
            if close:
                self.tp.close()

    def shutdown(self, close: bool = True) -> None:
        """Rank 0: release the follower ranks (and leave the tensor-parallel group unless ``close`` is False)."""
        if self.tp.active and self.tp.rank == 0:
            self.tp.broadcast_object(SchedulerOutput(stop=True))
            if close:
                self.tp.close()
