# SPDX-License-Identifier: Apache-2.0
"""Closed-loop drivers: keep C requests in flight until N have finished, replacing each finished request
at once, and return what the client saw (``RequestRecord``s) plus the wall time.

``run_engine_level``: the in-process engine, driven by ``add_request``/``step`` from this one thread (the
engine's step thread). ``run_threaded_level``: an endpoint, C client threads each sending one request
at a time with a blocking ``send(item) -> RequestRecord``.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ..config import SamplingParams
from .metrics import RequestRecord
from .workload import WorkItem


def run_engine_level(engine, items: list[WorkItem], concurrency: int, params: Callable[[int], SamplingParams],
                     on_done: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """Every item through ``engine`` with ``concurrency`` in flight. ``params(i)`` gives item i's sampling.

    Chunk times are taken in the engine's ``on_tokens`` callback, which runs after the step's one host
    sync, so on CUDA they are real completion times, not kernel launch times.
    """
    if concurrency > engine.cfg.max_batch_size:
        # More in flight than slots would queue inside the engine and measure queueing, not batching.
        raise ValueError(f"concurrency {concurrency} > engine max_batch_size {engine.cfg.max_batch_size}")
    pending = deque(enumerate(items))
    live: dict[int, RequestRecord] = {}
    records: list[RequestRecord] = []

    def submit() -> None:
        i, item = pending.popleft()
        rec = RequestRecord(t_sent=time.perf_counter(), num_prompt_tokens=len(item.prompt_ids))
        req = engine.add_request(list(item.prompt_ids), params(i),
                                 on_tokens=lambda _req, toks, rec=rec: rec.add_chunk(time.perf_counter(), len(toks)))
        live[req.request_id] = rec

    t0 = time.perf_counter()
    for _ in range(min(concurrency, len(pending))):
        submit()
    while live:
        for req in engine.step():
            rec = live.pop(req.request_id, None)
            if rec is None:
                continue
            rec.t_done = time.perf_counter()
            rec.finish_reason = req.finish_reason or ""
            rec.acceptance_lengths = list(req.stats.acceptance_lengths)
            rec.num_draft_tokens = req.stats.num_draft_tokens
            rec.num_accepted_draft_tokens = req.stats.num_accepted_draft_tokens
            records.append(rec)
            if on_done is not None:
                on_done(rec)
            if pending:   # closed loop: the replacement is admitted at the very next step
                submit()
    return records, time.perf_counter() - t0


def run_threaded_level(send: Callable[[int, WorkItem], RequestRecord], items: list[WorkItem], concurrency: int,
                       on_done: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """Every item through ``send(i, item)`` from ``concurrency`` threads. ``send`` never raises: a failed
    request comes back as a record with ``error`` set."""
    pending = deque(enumerate(items))
    records: list[RequestRecord] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                i, item = pending.popleft()
            rec = send(i, item)
            with lock:
                records.append(rec)
                if on_done is not None:
                    on_done(rec)

    threads = [threading.Thread(target=worker, name=f"dflash-sweep-{k}", daemon=True)
               for k in range(min(concurrency, len(items)))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0
