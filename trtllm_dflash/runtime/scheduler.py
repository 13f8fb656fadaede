# SPDX-License-Identifier: Apache-2.0
"""Which requests run in the next step, and how: admission into free KV-cache slots (fair between clients, FIFO
within one), cancellation,
and a per-step token budget (TensorRT-LLM's ``max_num_tokens``) shared by the running requests' verify
blocks and the prompt chunks of arriving ones (chunked prefill mixed with decode: an arrival delays the
running requests by at most one chunk's forward, whatever the prompt's length).

Admission is fair between clients (a request's ``client``: the peer address a server saw): a free slot goes to
the oldest waiting request of the client that holds the fewest slots, so one address that queues hundreds of
requests takes its turn with the others instead of holding every slot. With one client (the default ``""``: in
process, dflash-generate, benchmarks) it is plain FIFO.

Only tensor-parallel rank 0 schedules; the other ranks receive its ``SchedulerOutput`` and apply it.
"""
from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from ..config import SamplingParams
from .sequence import Sequence


@dataclass
class SchedulerOutput:
    """One step's decisions: everything a follower rank needs to mirror rank 0."""

    admit: list[tuple[int, list[int], SamplingParams, int]] = field(default_factory=list)  # (slot, prompt, params, id)
    cancel: list[int] = field(default_factory=list)          # request ids that leave before this step
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, begin, end): prompt tokens to prefill
    decode_rows: int = 0        # draft + verify over slots [0, decode_rows) (0 = no decode this step)
    block: int = 1              # tokens verified per row this step (1 = autoregressive)
    reason: str = ""            # why this block (the draft policy's words)
    stop: bool = False          # rank 0 is shutting down


def _exact(m: int, T: int) -> tuple[int, int]:
    return m, T


class Scheduler:
    def __init__(self, max_batch_size: int, max_num_tokens: int, prefill_shape=_exact, chunk_cap=None):
        """``prefill_shape(m, T) -> (rows, tokens)`` is the padded shape the runner runs m chunks of at most T
        tokens at, which is what the budget counts; ``chunk_cap(budget)`` the longest first chunk (default:
        the budget)."""
        self.slots: list[Sequence | None] = [None] * max_batch_size
        self.max_num_tokens = max_num_tokens
        self.prefill_shape = prefill_shape
        self.chunk_cap = chunk_cap or (lambda budget: budget)
        self.waiting: dict[str, deque[Sequence]] = {}   # by client, each oldest first
        self._cancel: set[int] = set()
        self._lock = threading.Lock()  # add/cancel come from any thread; schedule from the step thread

    def add(self, seq: Sequence) -> None:
        with self._lock:
            self.waiting.setdefault(seq.client, deque()).append(seq)

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancel.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)

    def num_waiting(self) -> int:
        return sum(map(len, self.waiting.values()))

    def _next_waiting(self, holding: Counter) -> Sequence:
        """The oldest request of the waiting client that holds the fewest slots (``holding``: slots per client,
        updated). O(clients) per admission, nothing per running row."""
        client = min(self.waiting, key=lambda c: (holding[c], self.waiting[c][0].t_arrival))
        queue = self.waiting[client]
        seq = queue.popleft()
        if not queue:
            del self.waiting[client]
        holding[client] += 1
        return seq

    def num_running(self) -> int:
        return sum(s is not None for s in self.slots)

    def schedule(self, choose_block) -> tuple[SchedulerOutput, list[Sequence], dict[int, Sequence]]:
        """Rank 0's decisions for the next step. ``choose_block(batch) -> (block, reason)`` is the draft
        policy. Returns the output, the waiting requests cancelled before admission (already out of the
        queue; running ones are named in ``output.cancel``) and the admitted requests by id."""
        out, arriving = SchedulerOutput(), {}
        with self._lock:
            ids, self._cancel = self._cancel, set()
            dropped = []
            if ids:
                for client, queue in list(self.waiting.items()):
                    dropped += [s for s in queue if s.request_id in ids]
                    kept = deque(s for s in queue if s.request_id not in ids)
                    if kept:
                        self.waiting[client] = kept
                    else:
                        del self.waiting[client]
            out.cancel = [s.request_id for s in self.slots if s is not None and s.request_id in ids]
            free = [i for i, s in enumerate(self.slots) if s is None or s.request_id in ids]
            holding = Counter(s.client for s in self.slots if s is not None and s.request_id not in ids)
            for slot in free:
                if not self.waiting:
                    break
                seq = self._next_waiting(holding)
                seq.slot = slot
                arriving[seq.request_id] = seq
                out.admit.append((slot, seq.prompt_ids, seq.params, seq.request_id))
        leaving = set(out.cancel)
        admitted = {slot: (prompt, 0) for slot, prompt, _, _ in out.admit}
        decoding = [i for i, s in enumerate(self.slots) if s is not None and s.request_id not in leaving
                    and i not in admitted and s.decoding]
        prefilling = {i: (s.prompt_ids, s.num_prefilled) for i, s in enumerate(self.slots)
                      if s is not None and s.request_id not in leaving and i not in admitted and not s.decoding}
        # the policy prices a step at the rows it runs over (slots 0 .. the last decoding one, the engine's
        # decode_rows), not the requests decoding: with slot 0 free and slot 1 decoding the step costs 2 rows, and
        # the engine reports its period at 2 (choosing at 1 read one bucket's costs and fed another's)
        out.block, out.reason = choose_block(max(decoding) + 1) if decoding else (1, "")
        # The running requests' verify tokens come first; prompts share what is left, oldest slot first
        # (one chunk per request per step), padded to the first chunk's (padded) length: the forward's real cost.
        budget = max(self.max_num_tokens - len(decoding) * out.block, 1)
        # A prompt longer than one chunk continues alone, one chunk per step: its forward attends over the cache
        # before the chunk (keys > tokens), a shape of one row that start-up captures for every length; arrivals
        # wait for it (at most ~prompt / chunk steps). New prompts prefill together, keys = tokens.
        started = [i for i, (_, done) in prefilling.items() if done]
        pending = {started[0]: prefilling[started[0]]} if started else {**prefilling, **admitted}
        chunks, width = [], 0
        for slot in pending:
            prompt, done = pending[slot]
            take = min(len(prompt) - done, width if chunks else self.chunk_cap(budget))
            if chunks:   # the first chunk always runs: every step makes progress
                m, T = self.prefill_shape(len(chunks) + 1, width)
                if m * T > budget:
                    break
            else:
                width = self.prefill_shape(1, take)[1]
            chunks.append((slot, done, done + take))
        out.chunks = chunks
        finishing = {slot for slot, _, end in chunks if end == len(pending[slot][0])}
        rows = decoding + sorted(finishing)
        out.decode_rows = max(rows) + 1 if rows else 0
        if not decoding and finishing:  # the first decode of new requests: the policy decides for them too
            out.block, out.reason = choose_block(out.decode_rows)
        return out, dropped, arriving
