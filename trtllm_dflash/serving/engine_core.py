# SPDX-License-Identifier: Apache-2.0
"""The engine process: the torch runtime's loop alone in its interpreter, frontends over ZeroMQ.

    python -m trtllm_dflash.serving.engine_core <deployment_dir> --address ipc://@dflash-engine-1

dflash-openai and the Triton model start it (``EngineClient.spawn``) and talk to it through
``engine_client.EngineClient``; under tensor parallelism it is rank 0, the scheduler, and starts ranks
1..N-1 itself (as the in-process runtime did). Nothing else runs in this process: HTTP/gRPC parsing, SSE
framing, tokenizing and detokenizing stay in the frontends, so the loop that feeds the device shares no
interpreter lock with them.

One thread, one loop (as vLLM V1's EngineCore busy loop): take every message that has arrived (a
``poll`` that does not wait while there is work, and waits up to 50 ms when there is none), run one
engine step (``TorchRuntime.run_once``: the same failure rules as in-process), then send each frontend
one message with all its requests' updates of that step. Each frontend acknowledges those messages once its
readers took them in, and the loop stays at most MAX_UNACKED steps ahead of the slowest one. Sockets (engine_protocol.py has the messages):
``<address>-in`` PULL (requests from any number of frontends' PUSH sockets) and ``<address>-out`` ROUTER
(to each frontend's DEALER, by its id). An ``ipc://@name`` address is in Linux's abstract namespace: no
file is created, so none can be left behind.

The process ends when its owner says ``shutdown`` (exit 0), on SIGTERM or SIGINT (every request ends
cancelled, exit 0), when the engine is broken (steps keep failing: each frontend is told why, exit 3), or when the
process that started it is gone (its parent changes: nobody can read the results any more). Under dflash-serve
(``--supervisor``) it also ends a frontend that cannot end itself: see ``SupervisorWatch``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ..deployment import Deployment
from ..errors import DFlashError
from . import engine_protocol as wire
from . import procfs
from .record import Result, ServedRequest

log = logging.getLogger(__name__)
IDLE_POLL_MS = 50
# Flow control: a frontend acknowledges each "out" message once its readers have taken it in (engine_protocol.py);
# the engine does not step while one has MAX_UNACKED steps it has not taken in yet. Without it an engine that runs
# faster than a frontend can decode and send (64 streams on a busy CPU) filled the frontend's memory and queues
# without bound, and every client's latency with them; with it the engine runs at the pace of its slowest frontend,
# a few steps ahead: the frontend's own step (decode, SSE) overlaps the engine's next ones. Why 16 and not 4: a
# frontend that pays per response (Triton's python stub, ~0.1-0.3 ms per send) spends a round on one response per
# running request whatever each carries, so at 64 streams a round outlasts 4 steps and the engine idled through
# the rest of it; 16 steps let it keep stepping while the round's responses grow instead (Triton, 64 streams,
# 2.8 ms steps on 2 cores: 0.47 of the engine alone at 4, 0.52 at 8, 0.80 at 16, 0.71 at 32; dflash-openai 1.01 at
# 4, 1.02 at 16; on a one-H100 host's 16 cores, Triton 0.81 at 4, 1.06 at 16;
# benchmarks/results/serving_overhead_{cpu,h100host}_*_unacked_*.json).
MAX_UNACKED = 16
# An attached frontend that takes nothing in for this long is gone: its requests are cancelled, the engine goes on.
FRONTEND_SILENCE_S = 30.0


def socket_addresses(address: str) -> tuple[str, str]:
    """(requests in, results out) for an engine address."""
    return address + "-in", address + "-out"


def check_address(address: str) -> str:
    if not address.startswith("ipc://") or len(address) <= len("ipc://"):
        raise DFlashError("--address", f"is {address!r}", "pass ipc://@<name> (abstract) or ipc:///<path>")
    return address


class SupervisorWatch:
    """The Triton model's engine: our parent is the model's stub, a child of tritonserver, a child of dflash-serve
    (``supervisor``). When dflash-serve dies, tritonserver is told to stop and unloads the model, which stops us.
    But a tritonserver that crashed or hangs never unloads it, and the stub cannot tell: its parent still exists (a
    zombie that a container's init does not reap) and any call it makes into Triton, a log line included, blocks
    with its interpreter lock held. This process blocks on nothing of Triton's, so it decides for the stub: once
    dflash-serve is gone and tritonserver has not ended the stub within ``grace_s`` (or is dead), it kills the stub.

    Whoever kills the stub must also remove its shared memory: Triton removes the region when it unloads the model,
    and dflash-serve removes what a crash leaves, but here neither will (``release``)."""

    CHECK_EVERY_S = 0.5

    def __init__(self, supervisor: int, grace_s: float = 10.0):
        self.supervisor, self.grace_s = supervisor, grace_s
        self.next_check = 0.0
        self.orphaned_at: float | None = None
        # the stub maps its region before it loads the model, so before it starts this process
        self.regions = procfs.backend_regions(os.getppid())
        stub = procfs.stat(os.getppid())
        self.server_pid = stub[1] if stub is not None else -1      # tritonserver

    def frontend_stuck(self) -> bool:
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + self.CHECK_EVERY_S
        if not self.orphaned():
            return False
        server = procfs.stat(self.server_pid)
        return server is None or server[0] in ("Z", "X") or now - self.orphaned_at > self.grace_s

    def orphaned(self) -> bool:
        """dflash-serve is gone (tritonserver's parent is no longer it): it will neither restart nor clean up."""
        if self.orphaned_at is None:
            server = procfs.stat(self.server_pid)
            if server is not None and server[1] == self.supervisor:
                return False
            self.orphaned_at = time.monotonic()
        return True

    def release(self) -> list[Path]:
        """Remove the stub's shared-memory files once nobody else will: dflash-serve is gone and the stub is
        ended (by us, or it ended when tritonserver died without unloading the model). Removing a name frees
        nothing that a live process still maps, so a tritonserver still unloading loses nothing."""
        if not self.orphaned():
            return []
        removed = []
        for path in self.regions:
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
        return removed


class _Outbox:
    """The handoff of every request in this process: a step's updates, grouped by frontend, sent after it."""

    def __init__(self):
        self.rows: dict[bytes, list] = {}
        self.live: dict[tuple[bytes, int], ServedRequest] = {}

    def deliver(self, updates: list) -> None:
        for record, result in updates:
            fid, rid = record.frontend
            self.rows.setdefault(fid, []).append(wire.row(rid, result))
            if result.finished:
                self.live.pop((fid, rid), None)


class EngineCore:
    """A TorchRuntime stepped by this loop (no scheduler thread) behind the two sockets."""

    def __init__(self, runtime, address: str, supervisor: int | None = None):
        import zmq

        self.zmq, self.runtime = zmq, runtime
        runtime.detokenize = False          # the frontends decode
        self.info = runtime.info
        self.ctx = zmq.Context(io_threads=1)
        self.pull = self.ctx.socket(zmq.PULL)
        self.router = self.ctx.socket(zmq.ROUTER)
        for sock in (self.pull, self.router):
            sock.setsockopt(zmq.LINGER, 1000)
        self.router.setsockopt(zmq.SNDHWM, 0)      # never drop a frontend's results for want of queue room
        self.pull.setsockopt(zmq.RCVHWM, 0)
        addr_in, addr_out = socket_addresses(address)
        self.pull.bind(addr_in)
        self.router.bind(addr_out)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.poller.register(self.router, zmq.POLLIN)
        self.outbox = _Outbox()
        self.frontends: set[bytes] = set()
        self.unacked: dict[bytes, int] = {}    # "out" messages each frontend has not acknowledged yet
        self.waiting_since: float | None = None  # when the loop began waiting for a frontend's acknowledgement
        self.held_s = 0.0                # seconds the loop had work but waited for a frontend's acknowledgement
        self.stop = ""                   # why the loop ends ("" = running)
        self.parent = os.getppid()
        self.watch = SupervisorWatch(supervisor) if supervisor is not None else None

    # -- the loop --

    def run(self) -> int:
        runtime, rc = self.runtime, 0
        started = time.monotonic()
        while not self.stop:
            behind = self._behind()
            busy = runtime.engine.has_work() and not behind
            t0 = time.monotonic()
            if dict(self.poller.poll(0 if busy else IDLE_POLL_MS)):
                self._read()
            if behind and runtime.engine.has_work():   # work held back for a frontend's acknowledgement
                self.held_s += time.monotonic() - t0
            if not behind:
                runtime.run_once()
                self._flush()
            if runtime.broken:
                self._tell_all(["broken", runtime.broken])
                self.stop, rc = runtime.broken, 3
            elif os.getppid() != self.parent:     # a syscall of well under a microsecond: every iteration
                log.error("[dflash] engine process: the process that started it is gone; stopping")
                self.stop = "the frontend is gone"
            elif self.watch is not None and self.watch.frontend_stuck():
                log.error("[dflash] engine process: dflash-serve is gone and tritonserver did not unload the model; "
                          "ending the model's stub and stopping")
                os.kill(self.parent, signal.SIGKILL)
                self.stop = "dflash-serve is gone"
        # where a served run's time went: steps held back because a frontend had MAX_UNACKED steps to take in
        log.info("[dflash] engine process: %.1f s of %.1f s held back waiting for frontends (MAX_UNACKED %d)",
                 self.held_s, time.monotonic() - started, MAX_UNACKED)
        if self.watch is not None:
            for path in self.watch.release():
                log.error("[dflash] engine process: removed %s, left by the model's stub", path)
        runtime.shutdown()               # every request left ends (cancelled), ranks 1.. are released
        self._flush()
        self.pull.close()
        self.router.close()
        self.ctx.term()
        return rc

    def _behind(self) -> bool:
        """A frontend has MAX_UNACKED steps it has not taken in: wait for it (a silent one is dropped)."""
        late = [fid for fid, n in self.unacked.items() if n >= MAX_UNACKED]
        if not late:
            self.waiting_since = None
            return False
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
        elif now - self.waiting_since > FRONTEND_SILENCE_S:
            for fid in late:
                log.error("[dflash] a frontend took in no results for %.0f s: cancelling its requests", FRONTEND_SILENCE_S)
                self._drop(fid)
            self.waiting_since = None
        return True

    def _drop(self, fid: bytes) -> None:
        self.frontends.discard(fid)
        self.unacked.pop(fid, None)
        for (owner, _), record in list(self.outbox.live.items()):
            if owner == fid:
                self.runtime.cancel(record)

    def _read(self) -> None:
        zmq = self.zmq
        while True:                      # everything that has arrived, on both sockets
            got = False
            try:
                fid, raw = self.router.recv_multipart(zmq.NOBLOCK)
                got = True
                self._hello(fid, wire.unpack(raw))
            except zmq.Again:
                pass
            try:
                raw = self.pull.recv(zmq.NOBLOCK)
                got = True
                self._handle(wire.unpack(raw))
            except zmq.Again:
                pass
            if not got:
                return

    def _hello(self, fid: bytes, msg: list) -> None:
        if msg and msg[0] == "hello":
            self.frontends.add(fid)
            self._send(fid, wire.info_message(self.info))

    def _handle(self, msg: list) -> None:
        kind, fid = msg[0], msg[1]
        if kind == "add":
            _, _, rid, prompt_ids, params, client = msg
            self._add(fid, rid, prompt_ids, params, client)
        elif kind == "cancel":
            record = self.outbox.live.get((fid, msg[2]))
            if record is not None:
                self.runtime.cancel(record)
        elif kind == "stats":
            ok, reason = self.runtime.health()
            metrics = {**self.runtime.metrics(), "frontend_held_ms": int(1e3 * self.held_s)}
            self._send(fid, ["stats", msg[2], metrics, ok, reason])
        elif kind == "ack":
            self.unacked[fid] = max(0, self.unacked.get(fid, 0) - msg[2])
        elif kind == "bye":
            self._drop(fid)
        elif kind == "shutdown":
            self.stop = "its owner stopped it"

    def _add(self, fid: bytes, rid: int, prompt_ids: list[int], params: dict, client: str) -> None:
        record = ServedRequest(prompt_ids=prompt_ids, handoff=self.outbox, frontend=(fid, rid), client=client)
        try:
            if self.runtime.broken:
                raise DFlashError("engine", f"is broken ({self.runtime.broken})", "restart the server")
            self.outbox.live[(fid, rid)] = record
            self.runtime.enqueue(record, prompt_ids, params)
        except DFlashError as err:       # the frontend checked it: only the engine's own guard gets here
            self.outbox.deliver([(record, Result(finished=True, error=str(err)))])

    def _flush(self) -> None:
        rows, self.outbox.rows = self.outbox.rows, {}
        for fid, items in rows.items():
            if fid in self.frontends:
                self.unacked[fid] = self.unacked.get(fid, 0) + 1
            self._send(fid, ["out", items])

    def _send(self, fid: bytes, msg: list) -> None:
        self.router.send_multipart([fid, wire.pack(msg)])

    def _tell_all(self, msg: list) -> None:
        for fid in self.frontends:
            self._send(fid, msg)


def load_runtime(deployment_dir: Path, factory: str | None, overrides: dict | None = None):
    """The torch runtime of a deployment directory (no scheduler thread: EngineCore steps it), or for tests
    and benchmarks ``module:function``'s engine stand-in."""
    from .runtimes import TorchRuntime

    if factory:
        module, _, name = factory.partition(":")
        return TorchRuntime(getattr(importlib.import_module(module), name)(), threaded=False)
    deployment = Deployment.open(deployment_dir)
    deployment.require_backend("torch", "the engine process",
                               "serve a trtllm build in-process (TensorRT-LLM runs its own executor processes)")
    return TorchRuntime.from_deployment(deployment, overrides or {}, threaded=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.serving.engine_core",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("deployment_dir", type=Path, help="a dflash-build deployment directory (backend torch)")
    p.add_argument("--address", required=True, help="ipc://@<name>: sockets <address>-in and <address>-out")
    p.add_argument("--overrides", type=json.loads, default=None,
                   help="RuntimeConfig fields replacing the deployment's, as JSON (the server's --max_draft_len)")
    p.add_argument("--engine_factory", default=None,
                   help="module:function returning an engine stand-in (tests and benchmarks), instead of deployment_dir")
    p.add_argument("--supervisor", type=int, default=None,
                   help="dflash-serve's pid when the Triton model starts this process (see SupervisorWatch)")
    p.add_argument("--log_level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    try:
        address = check_address(args.address)
        runtime = load_runtime(args.deployment_dir.expanduser().resolve(), args.engine_factory, args.overrides)
        core = EngineCore(runtime, address, args.supervisor)
    except DFlashError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2

    def on_signal(sig, _frame):   # a frontend starts it in its own session: only a signal meant for it gets here
        core.stop = signal.Signals(sig).name
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    t0 = time.monotonic()
    rc = core.run()
    log.info("[dflash] engine process stops after %.1f s: %s", time.monotonic() - t0, core.stop)
    return rc


def run_and_exit(argv: list[str] | None = None) -> None:
    """main(), then exit at once: every result is sent (the sockets are closed and flushed) and the ranks are
    released, so the interpreter's teardown of torch and the model (seconds on a CPU) would only delay the
    frontend's own stop, and a drain's bound with it."""
    rc = main(argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    run_and_exit()
