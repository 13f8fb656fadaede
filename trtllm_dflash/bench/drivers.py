# SPDX-License-Identifier: Apache-2.0
"""Closed-loop drivers: keep C requests in flight until N have finished, replacing each finished request
at once, and return what the client saw (``RequestRecord``s) plus the wall time.

``run_engine_level``: the in-process engine, driven by ``add_request``/``step`` from this one thread (the
engine's step thread). ``run_threaded_level``: an endpoint, C client threads each sending one request
at a time with a blocking ``send(item) -> RequestRecord``. ``run_process_level``: the same spread over several
client processes, so the client's own interpreter lock is not what limits a fast server.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import queue
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


def client_processes(setting: int, concurrency: int) -> int:
    """Client processes for a level: ``setting`` when > 0 (no more than the requests in flight); 0 = auto: one per
    32 requests in flight, at most a quarter of this machine's cores (so the client leaves the server most of
    them), at least one."""
    if setting > 0:
        return min(setting, concurrency)
    return max(1, min(math.ceil(concurrency / 32), (os.cpu_count() or 1) // 4))


def run_process_level(make_client: Callable[[], object], items: list[WorkItem], concurrency: int, processes: int,
                      on_done: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """``run_threaded_level`` over ``processes`` client processes, each with its share of the requests in flight
    and of the items, each with its own client from ``make_client()`` (``send(i, item) -> RequestRecord`` and
    ``close()``; picklable: the processes are spawned, so no socket or gRPC channel crosses a fork). They start
    sending together (a barrier after their clients are up); the wall time runs from the first send to the last
    response of any of them.

    Why: one Python process that reads every stream's chunks under one interpreter lock caps what it can see
    (``bench/client_capacity.py``: a stand-in server of known pace, read by one and by several processes)."""
    processes = max(1, min(processes, concurrency, len(items)))
    ctx = multiprocessing.get_context("spawn")
    results, start = ctx.Queue(), ctx.Barrier(processes, timeout=600)
    procs = [ctx.Process(target=_client_process, name=f"dflash-sweep-client-{k}", daemon=True,
                         args=(k, make_client, list(enumerate(items))[k::processes],
                               concurrency // processes + (k < concurrency % processes), start, results))
             for k in range(processes)]
    for p in procs:
        p.start()
    records: list[RequestRecord] = []
    spans, failed = {}, {}
    while len(spans) + len(failed) < processes:
        try:
            kind, k, value = results.get(timeout=1.0)
        except queue.Empty:   # a process that died without a word (killed, crashed in C) fails the level
            failed.update({k: f"exited with code {p.exitcode}" for k, p in enumerate(procs)
                           if p.exitcode not in (None, 0) and k not in spans and k not in failed})
            continue
        if kind == "record":
            records.append(value)
            if on_done is not None:
                on_done(value)
        elif kind == "span":
            spans[k] = value
        else:
            failed[k] = value
    for p in procs:
        p.join(timeout=10)
    if failed:
        k, why = next(iter(failed.items()))
        raise RuntimeError(f"client process {k} of {processes} failed: {why}")
    return records, max(end for _, end in spans.values()) - min(t0 for t0, _ in spans.values())


def _client_process(k: int, make_client, share: list[tuple[int, WorkItem]], concurrency: int, start,
                    results) -> None:
    try:
        client = make_client()
        index = [i for i, _ in share]   # send gets the item's index in the whole level (its seed offset)
        start.wait()
        t0 = time.perf_counter()   # CLOCK_MONOTONIC: the same clock in every process of this machine
        run_threaded_level(lambda j, item: client.send(index[j], item), [item for _, item in share], concurrency,
                           lambda rec: results.put(("record", k, rec)))
        results.put(("span", k, (t0, time.perf_counter())))
        client.close()
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the level with it
        start.abort()
        results.put(("error", k, f"{type(err).__name__}: {err}"))
