# SPDX-License-Identifier: Apache-2.0
"""``dflash-openai --api_server_count N``: N frontend processes on one port, one engine process behind them.

One frontend tops out at what one interpreter can parse, template, detokenize and frame: on an H200 host, served
AR at concurrency 64 stopped at ~18k request updates/s (SmolLM2, where the engine alone made ~31k tokens/s;
benchmarks/results/e2e_smollm2_h200_v2.json), about 55 us of frontend CPU per update; with 4 API servers the same
load kept 0.91x of the engine's tokens/s (e2e_smollm2_h200_v3.json). More API servers scale that
out, as vLLM's ``--api-server-count`` does: the processes share the listening socket (the kernel hands each new
connection to one of those accepting on it), each talks to the engine over its own sockets, and the engine keeps
each frontend's requests apart (engine_core.py routes results by frontend id, and paces itself by the slowest one).

The parent binds the port, starts the engine process (or uses ``--engine_address``'s), starts the API servers
(``openai_server`` with ``--listen_fd``), and says ready once every one is. It serves nothing itself.

* /metrics: each API server publishes its request-level series (``ServingMetrics.snapshot``) every ``PUBLISH_S``
  to a folder of the parent's, and renders its own plus the others' latest: any scrape sees the whole port (the
  others' part up to PUBLISH_S old). The engine-level series come from the one engine, not summed.
* SIGTERM / SIGINT: every API server drains (``--drain_timeout_s``), then the engine stops; exit 0.
* An API server that exits on its own: the others are stopped too and the parent exits 1, so a supervisor
  restarts the whole server rather than leaving part of the port's connections to a dead process.
* The parent gone (SIGKILL): the engine ends (it watches its parent) and each API server ends (it watches its
  own); the metrics folder is then left in the temp dir.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import DFlashError

log = logging.getLogger(__name__)
PUBLISH_S = 1.0
READY = "ready-{}"
SNAPSHOT = "frontend-{}.json"


# ---- in each API server ---------------------------------------------------------------------------------------
class MetricsBoard:
    """The folder where the API servers of one port leave their request-level series for each other."""

    def __init__(self, folder: str | Path, index: int):
        self.folder, self.index = Path(folder), index

    def publish(self, snapshot: dict) -> None:
        tmp = self.folder / f".{SNAPSHOT.format(self.index)}.tmp"
        tmp.write_text(json.dumps(snapshot))
        os.replace(tmp, self.folder / SNAPSHOT.format(self.index))   # readers never see half a file

    def peers(self) -> list[dict]:
        out = []
        for path in sorted(self.folder.glob(SNAPSHOT.format("*"))):
            if path.name != SNAPSHOT.format(self.index):
                try:
                    out.append(json.loads(path.read_text()))
                except (OSError, ValueError):    # removed at shutdown: nothing to add
                    pass
        return out

    def mark_ready(self) -> None:
        (self.folder / READY.format(self.index)).touch()

    def start_publishing(self, metrics, stop: threading.Event) -> None:
        def loop():
            while not stop.wait(PUBLISH_S):
                try:
                    self.publish(metrics.snapshot())
                except OSError:                  # the parent removed the folder: it is stopping
                    return
        threading.Thread(target=loop, name="dflash-metrics-publish", daemon=True).start()


def watch_parent(on_gone) -> None:
    """Call ``on_gone`` once the process that started this one has gone (it can no longer stop us)."""
    parent = os.getppid()

    def loop():
        while os.getppid() == parent:
            time.sleep(0.5)
        on_gone()
    threading.Thread(target=loop, name="dflash-parent-watch", daemon=True).start()


# ---- the parent -----------------------------------------------------------------------------------------------
def listen(host: str, port: int) -> socket.socket:
    """The port's listening socket, bound here once and inherited by every API server."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise DFlashError("--port", f"{host}:{port} cannot be bound ({err.strerror})",
                          "pick a free port or stop what holds it") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def worker_argv(args, deployment_dir: Path, address: str, fd: int, index: int, folder: Path) -> list[str]:
    argv = [sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(deployment_dir),
            "--engine_address", address, "--listen_fd", str(fd), "--api_server_index", str(index),
            "--metrics_dir", str(folder), "--host", args.host, "--port", str(args.port),
            "--served_model_name", args.served_model_name, "--drain_timeout_s", str(args.drain_timeout_s),
            "--request_timeout_s", str(args.request_timeout_s), "--log_level", args.log_level]
    if args.tokenize_workers is not None:
        argv += ["--tokenize_workers", str(args.tokenize_workers)]
    return argv


def serve(args, deployment, overrides: dict, drain_s: float) -> int:
    """Run ``args.api_server_count`` API servers on args.host:args.port until a signal (0) or until one of
    them fails (1). ``drain_s``: how long an API server may take to stop after SIGTERM."""
    from .engine_client import EngineClient
    from .engine_core import check_address

    n = args.api_server_count
    sock = listen(args.host, args.port)
    folder = Path(tempfile.mkdtemp(prefix="dflash-openai-"))
    stop = threading.Event()
    engine, procs, rc = None, [], 0
    old = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.engine_address:
            address = check_address(args.engine_address)
        else:
            engine = EngineClient.spawn(deployment, overrides=overrides or None)
            address = engine.address
        for i in range(n):
            # each in a session of its own: a terminal's Ctrl-C (SIGINT to the whole foreground group) reaches the
            # parent alone, which sends each one SIGTERM once; a second signal would make uvicorn skip the drain
            procs.append(subprocess.Popen(worker_argv(args, deployment.path, address, sock.fileno(), i, folder),
                                          pass_fds=(sock.fileno(),), start_new_session=True))
        while len(list(folder.glob(READY.format("*")))) < n:
            failed = [p for p in procs if p.poll() is not None]
            if failed or stop.is_set():
                if failed:
                    print(f"dflash-openai: an API server exited with code {failed[0].returncode} while starting; "
                          "stopping (its error is printed above)", file=sys.stderr, flush=True)
                return 1 if failed else 0
            time.sleep(0.05)
        print(f"dflash-openai: ready on http://{args.host}:{args.port}/v1 (model {args.served_model_name!r}, "
              f"{n} API servers)", flush=True)
        while not stop.wait(0.2):
            failed = [p for p in procs if p.poll() is not None]
            if failed:
                print(f"dflash-openai: an API server exited with code {failed[0].returncode}; stopping",
                      file=sys.stderr, flush=True)
                rc = 1
                break
        return rc
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + drain_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("dflash-openai: API server pid %d did not stop within %.0f s: killing it", p.pid, drain_s)
                p.kill()
                p.wait()
        if engine is not None:
            engine.shutdown()
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)
        for sig, handler in old.items():
            signal.signal(sig, handler)
