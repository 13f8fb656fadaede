# SPDX-License-Identifier: Apache-2.0
"""The frontends' side of the engine process: the runtime interface of ``runtimes.py`` (submit, cancel,
records, health, metrics, shutdown) over ZeroMQ, so dflash-openai and the Triton model take it unchanged.

``EngineClient.spawn(deployment)`` starts ``engine_core`` as a child (its own session: a Ctrl-C or a
SIGTERM to the frontend's process group reaches the frontend, which drains and then stops the engine) and
waits for its ``ready``; ``EngineClient(address, tokenizer)`` attaches to one already running (several
frontends, one engine: each has its own id and gets only its own results).

Here, on the frontend's side: checking a request (``engine_protocol.check``, the one place), tokenizing
text, and the records: each step's results arrive as one message, become ``Result`` s on the receiver
thread, and reach the readers with one ``hand_over`` (one wake-up per frontend event loop or Triton sender
thread per step); text is decoded and stop strings found by the reader (``ServedRequest``), which cancels
the engine's slot when one ends the text.

Failure: if the engine process exits (or an attached engine stops answering for ``STATS_SILENCE_S``), every
request in flight ends at once with an error naming the cause, ``health()`` turns False (dflash-openai's
/health answers 503; the Triton model reports broken and dflash-serve restarts the server) and ``submit``
refuses with ``Unavailable``. ``shutdown()`` ends every request (cancelled), stops the engine it started and
closes the sockets: no process and no file stays behind (the sockets are abstract ``ipc://@`` names).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from ..deployment import Deployment
from ..errors import DFlashError
from . import engine_protocol as wire
from .engine_core import socket_addresses
from .handoff import hand_over
from .launch import stop_process
from .record import Result, ServedRequest, Unavailable

log = logging.getLogger(__name__)
STATS_SILENCE_S = 30.0     # an attached engine that answers no stats request for this long is taken as gone
# metrics(): how long to wait for the engine's answer before using the last one. Short: /health and /metrics
# call it on dflash-openai's event loop, and the engine answers between two steps (a few ms at most).
STATS_WAIT_S = 0.25


def _python() -> str:
    """This interpreter, to run the engine process. Inside Triton's python backend ``sys.executable`` can name the
    stub binary that embeds Python rather than an interpreter: then the python3 on PATH (the stub's own)."""
    exe = sys.executable
    if exe and Path(exe).name.startswith("python"):
        return exe
    import shutil
    return shutil.which("python3") or shutil.which("python") or exe


class EngineClient:
    """One frontend's connection to the engine process (any thread may call it)."""

    name = "torch"

    def __init__(self, address: str, tokenizer, proc: subprocess.Popen | None = None,
                 ready_timeout_s: float | None = None):
        import zmq

        self.zmq, self.address, self.tokenizer, self.proc = zmq, address, tokenizer, proc
        self.fid = uuid.uuid4().bytes
        self.ctx = zmq.Context(io_threads=1)
        addr_in, addr_out = socket_addresses(address)
        self._push = self.ctx.socket(zmq.PUSH)         # any thread, under _lock
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.connect(addr_in)
        self._dealer = self.ctx.socket(zmq.DEALER)     # the receiver thread's alone (after the handshake)
        self._dealer.setsockopt(zmq.IDENTITY, self.fid)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.RCVHWM, 0)
        self._dealer.connect(addr_out)
        self.broken = ""            # why the engine can no longer serve ("" = serving)
        self._stopping = False
        self._closed = False
        self._lock = threading.Lock()
        self._live: dict[int, ServedRequest] = {}
        self._ids = itertools.count()
        self._stats: dict = {}
        self._stats_seq = itertools.count()
        self._stats_cond = threading.Condition()
        self._last_answer = time.monotonic()
        try:
            self.info = self._handshake(ready_timeout_s)
        except BaseException:
            self._close_sockets()
            raise
        self.max_seq_len = self.info.max_seq_len
        self.max_prompt_bytes = self.info.max_prompt_bytes
        self._receiver = threading.Thread(target=self._receive, name="dflash-engine-client", daemon=True)
        self._receiver.start()
        if proc is not None:
            threading.Thread(target=self._watch, name="dflash-engine-watch", daemon=True).start()

    @classmethod
    def spawn(cls, deployment, *, overrides: dict | None = None, engine_factory: str | None = None,
              tokenizer=None, ready_timeout_s: float | None = None, env: dict | None = None,
              supervisor: int | None = None) -> "EngineClient":
        """Start the engine process for a deployment (a ``Deployment``, or its directory: opened here) and
        connect to it once it is loaded. ``engine_factory`` (tests, benchmarks): an engine stand-in instead,
        read with ``tokenizer`` (``deployment`` is then only passed on). ``supervisor``: the Triton model's
        dflash-serve (engine_core's --supervisor)."""
        from ..checkpoints.text import load_tokenizer

        if not engine_factory:
            deployment = Deployment.of(deployment)
        where = deployment.path if isinstance(deployment, Deployment) else Path(deployment)
        address = f"ipc://@dflash-engine-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        argv = [_python(), "-m", "trtllm_dflash.serving.engine_core", str(where), "--address", address]
        if overrides:
            argv += ["--overrides", json.dumps(overrides)]
        if engine_factory:
            argv += ["--engine_factory", engine_factory]
        if supervisor is not None:
            argv += ["--supervisor", str(supervisor)]
        log.info("[dflash] starting the engine process: %s", " ".join(argv))
        # Its output goes where this process's does; its own session: group signals stop at the frontend.
        proc = subprocess.Popen(argv, start_new_session=True, env=env)
        try:
            if not engine_factory:
                tokenizer = load_tokenizer(deployment.target_dir)
            if tokenizer is None and not engine_factory:
                raise DFlashError("target", f"{deployment.target_dir} has no tokenizer files",
                                  "the servers take text: add the tokenizer to the target checkpoint")
            return cls(address, tokenizer, proc, ready_timeout_s)
        except BaseException:
            stop_process(proc)
            raise

    # -- the runtime interface --

    def submit(self, record: ServedRequest) -> None:
        if self.broken:
            raise Unavailable("engine", f"is not serving ({self.broken})", "restart the server")
        if self._stopping:
            raise Unavailable("server", "is shutting down", "send the request to a running server")
        prompt_ids, params = wire.check(record, self.info, self.tokenizer)
        record.num_prompt_tokens = len(prompt_ids)
        record.times_ns["arrival_time_ns"] = time.time_ns()
        if self.tokenizer is not None:
            record.attach_detokenizer(self.tokenizer, on_stop=lambda: self.cancel(record))
        with self._lock:              # registered before it is sent: its results find it
            rid = next(self._ids)
            record.handle = rid
            self._live[rid] = record
            self._send(wire.add_message(self.fid, rid, prompt_ids, params, record.client))

    def cancel(self, record: ServedRequest) -> None:
        """The engine frees the slot at its next step and then sends the final result."""
        with self._lock:
            if record.handle in self._live and not self.broken:
                self._send(["cancel", self.fid, record.handle])

    def records(self) -> list[ServedRequest]:
        with self._lock:
            return list(self._live.values())

    def health(self) -> tuple[bool, str]:
        if self.broken:
            return False, f"engine: {self.broken}"
        return True, "ok"

    def metrics(self) -> dict:
        """The engine's counters (asked for now; the last ones if it does not answer within STATS_WAIT_S),
        with this frontend's own count of live requests."""
        if not self.broken:
            seq = self._ask_stats()
            with self._stats_cond:
                self._stats_cond.wait_for(lambda: self._stats.get("seq", -1) >= seq or self.broken, STATS_WAIT_S)
        with self._lock:
            live = len(self._live)
        stats = dict(self._stats.get("metrics", {}))
        return {**stats, "live_requests": live, "healthy": int(not self.broken),
                "running": stats.get("running", 0), "waiting": stats.get("waiting", 0)}

    def shutdown(self) -> None:
        """End every request (cancelled), stop the engine this client started (or leave an attached one),
        close the sockets."""
        self._stopping = True
        if self.proc is not None:
            with self._lock:
                if not self.broken:
                    self._send(["shutdown", self.fid])
            try:
                self.proc.wait(timeout=30)    # it sends every request's final result first
            except subprocess.TimeoutExpired:
                log.error("[dflash] the engine process did not stop within 30 s: killing it")
            stop_process(self.proc)
        else:
            with self._lock:
                self._send(["bye", self.fid])
        self._fail_all("the server is shutting down", finish_reason="cancelled")
        self._receiver.join(timeout=5)
        self._close_sockets()

    # -- inside --

    def _send(self, msg: list) -> None:
        """Under self._lock (one socket, many threads)."""
        try:
            self._push.send(wire.pack(msg), self.zmq.NOBLOCK)
        except self.zmq.ZMQError as err:
            raise Unavailable("engine", f"does not take messages ({err})", "restart the server") from None

    def _handshake(self, timeout_s: float | None) -> wire.EngineInfo:
        """Wait for the engine's ready (it answers once loaded: minutes for a large model with graphs)."""
        self._dealer.send(wire.pack(["hello"]))
        t0 = time.monotonic()
        while not self._dealer.poll(200):
            if self.proc is not None and self.proc.poll() is not None:
                raise DFlashError("engine process", f"exited with code {self.proc.returncode} while loading",
                                  "its error is printed above; fix it and start the server again")
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise DFlashError("engine", f"at {self.address} did not answer within {timeout_s:g} s",
                                  "start the engine process first (python -m trtllm_dflash.serving.engine_core)")
        msg = wire.unpack(self._dealer.recv())
        if msg[0] != "ready":
            raise DFlashError("engine", f"answered {msg[0]!r} to hello", "use the same trtllm-dflash on both sides")
        return wire.EngineInfo(**msg[1])

    def _receive(self) -> None:
        """The receiver thread: results -> records, stats -> metrics(); pings an attached engine."""
        next_ping = time.monotonic() + 1.0
        while not (self._stopping and not self._live) and not self.broken:
            try:
                ready = self._dealer.poll(100)
            except self.zmq.ZMQError:
                return
            if ready:
                self._last_answer = time.monotonic()
                msg = wire.unpack(self._dealer.recv())
                if msg[0] == "out":
                    self._deliver(msg[1])
                elif msg[0] == "stats":
                    with self._stats_cond:
                        self._stats = {"seq": msg[1], "metrics": msg[2], "ok": msg[3], "reason": msg[4]}
                        self._stats_cond.notify_all()
                elif msg[0] == "broken":
                    self._break(f"the engine is broken: {msg[1]}")
            now = time.monotonic()
            if self.proc is None and not self._stopping and now > next_ping:
                next_ping = now + 1.0
                if now - self._last_answer > STATS_SILENCE_S:
                    self._break(f"the engine at {self.address} has not answered for {STATS_SILENCE_S:g} s")
                else:
                    self._ask_stats()

    def _ask_stats(self) -> int:
        seq = next(self._stats_seq)
        with self._lock:
            if not self.broken:
                try:
                    self._send(["stats", self.fid, seq])
                except Unavailable:
                    pass
        return seq

    def _deliver(self, rows: list) -> None:
        """One step's rows -> (record, Result) updates, handed over at once (one wake-up per reader loop)."""
        now = time.time_ns()
        updates = []
        with self._lock:
            for r in rows:
                record = self._live.get(r[0])
                if record is None:            # ended here already (a stop string, a failure)
                    continue
                result = wire.result_of(r)
                if result.finished:
                    del self._live[r[0]]
                    result.times_ns = dict(record.times_ns)
                else:
                    record.times_ns.setdefault("first_token_time_ns", now)
                    record.times_ns["last_token_time_ns"] = now
                updates.append((record, result))
        hand_over(updates)
        self._ack_when_taken_in(updates)

    def _ack_when_taken_in(self, updates: list) -> None:
        """Acknowledge an "out" message once every reader side it went to has taken it in: a handoff with
        ``after(callback)`` runs the callback behind what it was handed (dflash-openai's event loop, Triton's
        sender thread); records without one were pushed on this thread already."""
        waits = [h for h in {record.handoff for record, _ in updates} if hasattr(h, "after")]
        if not waits:
            self._ack()
            return
        left = [len(waits)]
        lock = threading.Lock()

        def one_taken_in():
            with lock:
                left[0] -= 1
                done = left[0] == 0
            if done:
                self._ack()
        for handoff in waits:
            handoff.after(one_taken_in)

    def _ack(self) -> None:
        with self._lock:
            if not self.broken and not self._closed:
                try:
                    self._send(["ack", self.fid, 1])
                except Unavailable:
                    pass

    def _watch(self) -> None:
        rc = self.proc.wait()
        if not self._stopping:
            log.error("[dflash] the engine process exited with code %s; failing every request in flight", rc)
            self._break(f"the engine process exited with code {rc}")

    def _break(self, why: str) -> None:
        with self._lock:
            if self.broken:
                return
            self.broken = why
        with self._stats_cond:
            self._stats_cond.notify_all()
        self._fail_all(why)

    def _fail_all(self, error: str, finish_reason: str = "") -> None:
        with self._lock:
            records, self._live = list(self._live.values()), {}
        hand_over([(record, Result(finished=True, finish_reason=finish_reason, times_ns=dict(record.times_ns),
                                   error="" if finish_reason else f"engine: {error}")) for record in records])

    def _close_sockets(self) -> None:
        with self._lock:
            self._closed = True
        self._push.close()
        self._dealer.close()
        self.ctx.term()
