# SPDX-License-Identifier: Apache-2.0
"""dflash-serve: run ``tritonserver`` on a deployment's Triton repository until SIGTERM or Ctrl-C.

In: a deployment directory (serves ``DIR/triton``; ``--fill`` fills a temporary one from
``DIR/manifest.json`` instead) or a model repository. Out: HTTP, gRPC and metrics endpoints.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import http.client
from pathlib import Path

from ..bench.helpformat import HelpFormatter
from ..deployment import Deployment
from ..errors import DFlashError
from .grpc_guard import GrpcGuard, GrpcLimits
from .http_guard import GuardLimits, HttpGuard, metrics_only, triton_routes
from .launch import http_connection
from .deployment_check import check_deployment
from .repo import MODEL_NAME, fill_triton, link_mirror
from .protocol import CLIENT_HEADER
from .restricted import ADMIN_HEADER, RESTRICTED_APIS
from .triton_env import TritonBinary, find_tritonserver
from . import procfs
from .triton_model import CONTROL_DIR_ENV, SUPERVISOR_PID_ENV

EPILOG = """examples:
  dflash-serve engines/qwen3-8b/bf16/1-gpu
  dflash-serve engines/qwen3-8b/bf16/1-gpu --host 0.0.0.0 --http_port 8000 --grpc_port 8001
  dflash-serve engines/qwen3-8b/bf16/1-gpu --fill --decoupled_mode false   # one-response model
  dflash-serve engines/qwen3-8b/bf16/1-gpu --dry_run                        # print the command only
  dflash-serve engines/qwen3-8b/bf16/1-gpu -- --log-verbose=1               # extra tritonserver flags
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-serve", description=__doc__, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    p.add_argument("deployment_dir", type=Path, help="deployment directory (dflash-build output) or model repository")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all interfaces")
    p.add_argument("--http_port", type=int, default=8000, help="KServe v2 HTTP/REST (generate, generate_stream)")
    p.add_argument("--grpc_port", type=int, default=8001, help="KServe v2 gRPC (bidirectional stream)")
    p.add_argument("--metrics_port", type=int, default=8002, help="Prometheus /metrics, incl. dflash_*")
    p.add_argument("--fill", action="store_true",
                   help="serve a temporary repository filled from DIR/manifest.json instead of DIR/triton")
    p.add_argument("--decoupled_mode", choices=("true", "false"), default=None,
                   help="with --fill: true streams (gRPC stream, generate_stream); false allows unary gRPC infer "
                        "[default: true]")
    p.add_argument("--exit_timeout_secs", type=int, default=10,
                   help="seconds (named after tritonserver's --exit-timeout-secs): its own wait for in-flight "
                        "requests once it is told to stop (it is killed after this plus 5 s)")
    p.add_argument("--drain_timeout_s", type=float, default=10.0,
                   help="on SIGTERM / Ctrl-C, seconds for the model to end its running requests (each client gets "
                        "a final response saying the server is shutting down); after it, calls still open (an "
                        "idle gRPC stream, say) get a final error and tritonserver is stopped; a second "
                        "SIGTERM / Ctrl-C kills at once")
    p.add_argument("--http_guard", choices=("true", "false"), default="true",
                   help="true: a small guard listens on --http_port and relays to Triton on an internal loopback "
                        "port, answering itself (4xx, one line naming the field) bodies over --max_body_bytes, "
                        "form bodies over 1 MiB, JSON nested over 64 deep and /generate asked to stream, which "
                        "crash or confuse Triton 2.51, and a second one on --metrics_port serves only GET /metrics; "
                        "false: Triton listens on --http_port and --metrics_port itself")
    p.add_argument("--max_body_bytes", type=int, default=GuardLimits.max_body_bytes,
                   help="with --http_guard true: the largest HTTP request body relayed to Triton")
    p.add_argument("--idle_timeout_s", type=float, default=GuardLimits.idle_timeout_s,
                   help="with --http_guard true: seconds a connection may wait for a request's first byte (a new "
                        "one, or a keep-alive one between requests) before it is closed")
    p.add_argument("--read_timeout_s", type=float, default=GuardLimits.read_timeout_s,
                   help="with --http_guard true: seconds a client has to send a request's head and body once "
                        "it began (408 after it)")
    p.add_argument("--grpc_guard", choices=("true", "false"), default="true",
                   help="true: a gRPC relay listens on --grpc_port and passes calls to Triton on a private Unix "
                        "socket, refusing messages over --max_grpc_message_bytes (Triton 2.51 takes up to 2 GiB) "
                        "and bounding calls per client address (the deployment's max_batch_size + 16, at least 128) "
                        "and in total (twice that); false: Triton listens on --grpc_port itself")
    p.add_argument("--max_grpc_message_bytes", type=int, default=GrpcLimits.max_message_bytes,
                   help="with --grpc_guard true: the largest gRPC message relayed to Triton")
    p.add_argument("--grpc_idle_stream_s", type=float, default=GrpcLimits.idle_stream_s,
                   help="with --grpc_guard true: a stream with no request outstanding and no message either way "
                        "for this long ends (DEADLINE_EXCEEDED); at the call bound, streams idle over 1 s end first "
                        "to make room")
    p.add_argument("--max_grpc_bytes_in_flight", type=int, default=GrpcLimits.max_bytes_in_flight,
                   help="with --grpc_guard true: request bytes Triton may hold for all gRPC calls together (half "
                        "of it per client address); beyond it a message gets RESOURCE_EXHAUSTED")
    p.add_argument("--max_restarts", type=int, default=3,
                   help="restart tritonserver at most this many times in a row when it crashes or its engine "
                        "breaks (the count starts again after --restart_reset_s of serving)")
    p.add_argument("--restart_reset_s", type=float, default=600.0,
                   help="seconds of serving after which earlier restarts no longer count: a crash loop (a bad "
                        "engine, a request that kills every fresh server) shows within minutes; crashes hours "
                        "apart are separate events, not a loop")
    p.add_argument("--ready_timeout_s", "--ready_timeout", dest="ready_timeout", type=float, default=900.0,
                   help="seconds to wait for the model to load")
    p.add_argument("--dry_run", action="store_true", help="print the tritonserver command and exit")
    p.add_argument("extra", nargs="*", help="after --: more tritonserver flags, passed as they are")
    args = p.parse_args(argv)
    if args.decoupled_mode is not None and not args.fill:
        p.error("--decoupled_mode needs --fill (DIR/triton was filled by dflash-build with its own mode)")
    return args


def engine_slots(path: Path) -> int | None:
    """The deployment's max_batch_size (the engine's request slots); None for a bare model repository."""
    if not Deployment.is_deployment(path):
        return None
    return Deployment.open(path).manifest.get("runtime", {}).get("max_batch_size")


def resolve_repo(path: Path, fill: bool, decoupled_mode: bool, workdir: Path) -> Path:
    """The model repository to serve for ``path`` (a deployment directory or a repository)."""
    if Deployment.is_deployment(path):
        # a broken file is one line naming it now, not a model-load failure in Triton's log
        deployment = check_deployment(Deployment.open(path))
        if fill:
            return fill_triton(path, deployment.manifest, decoupled_mode=decoupled_mode, repo_dir=workdir / "triton")
        repo = deployment.triton_repo
        if not (repo / MODEL_NAME / "config.pbtxt").is_file():
            raise DFlashError("deployment_dir", f"{path} has no filled triton/ repository",
                              "rebuild with dflash-build, or pass --fill")
        return repo
    if (path / MODEL_NAME / "config.pbtxt").is_file():
        if fill:
            raise DFlashError("--fill", f"{path} is a model repository, not a deployment", "pass the deployment dir")
        return path
    raise DFlashError("deployment_dir", f"{path} is neither a deployment (manifest.json) nor a model repository",
                      "pass the output directory of dflash-build")


# Triton's restricted APIs (serving/restricted.py) answer 403 unless a request carries the admin header.
# The key is in tritonserver's argv (Triton 2.51 reads it from its command line only: no config file or
# environment variable), which any local user can read in /proc, so it must open nothing: behind the guards
# Triton's HTTP, gRPC and metrics listen only on Unix sockets in dflash-serve's private (0700) temporary
# directory, and the guards refuse the restricted APIs by name and drop the header under every spelling.


def build_cmd(binary: TritonBinary, repo: Path, host: str, http_port: int, grpc_port: int, metrics_port: int,
              exit_timeout_secs: int = 10, extra: list[str] = (), admin_key: str = "",
              http: tuple[str, int] | None = None, grpc: tuple[str, int] | None = None,
              metrics: tuple[str, int] | None = None) -> list[str]:
    """The tritonserver command line, as a list (printed by --dry_run, tested as data). ``admin_key``:
    the value of the header that opens the restricted APIs (random per server by default); ``http`` /
    ``grpc`` / ``metrics``: (address, port) of Triton's HTTP / gRPC / metrics front end when it is not
    ``host`` and the user's port (behind the guards: ``unix:PATH``, which Triton 2.51 binds as a Unix
    socket)."""
    http_host, http_port = http or (host, http_port)
    grpc_host, grpc_port = grpc or (host, grpc_port)
    metrics_host, metrics_port = metrics or (host, metrics_port)
    key = admin_key or secrets.token_hex(16)
    cmd = [binary.path, f"--model-repository={Path(repo).resolve()}"]
    if binary.backend_dir:
        cmd.append(f"--backend-directory={binary.backend_dir}")
    cmd += [f"--http-address={http_host}", f"--http-port={http_port}",
            f"--grpc-address={grpc_host}", f"--grpc-port={grpc_port}",
            f"--metrics-address={metrics_host}", f"--metrics-port={metrics_port}",
            f"--exit-timeout-secs={exit_timeout_secs}",
            f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={key}",
            f"--http-header-forward-pattern=^{CLIENT_HEADER}$", f"--grpc-header-forward-pattern=^{CLIENT_HEADER}$"]
    if binary.source == "nvidia-pytriton":
        cmd.append("--allow-gpu-metrics=false")   # the wheel's DCGM cannot start outside NGC images
    return cmd + list(extra)


def server_env(binary: TritonBinary) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE: no bytecode from the processes the model starts (TP ranks). It does not reach the
    # python-backend stub itself (isolated interpreter): main() serves a linked copy of the repository for that.
    return {**binary.env, "PYTHONDONTWRITEBYTECODE": "1"}


# Run as ``python -c _EXEC_DYING_WITH_PARENT cmd...``: the server runs in its own session (so Ctrl-C reaches it
# once, from us); PR_SET_PDEATHSIG makes the kernel stop it should dflash-serve itself be killed, and it
# survives the exec. Set in a launcher rather than a preexec_fn: with a preexec_fn Python forks, and a fork of
# this process, whose gRPC guard has threads inside gRPC, ran gRPC's fork handlers in the child, which
# aborted now and then before the exec ("skipping fork() handlers", then epoll "Bad file descriptor": the
# SIGABRT seen in about 1 of 20 starts). Without one, subprocess uses vfork, which runs no fork handlers.
_EXEC_DYING_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
                           "os.execvp(sys.argv[1], sys.argv[1:])")


def start(cmd: list[str], env: dict[str, str], stdout=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _EXEC_DYING_WITH_PARENT, *cmd], env={**os.environ, **env},
                            stdout=stdout, stderr=subprocess.STDOUT if stdout else None, start_new_session=True)


def is_ready(target: str) -> bool:
    """GET /v2/health/ready on ``host:port`` or ``unix:/path`` answers 200."""
    conn = http_connection(target, timeout=2)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_ready(proc: subprocess.Popen, target: str, timeout: float, stopping=lambda: False) -> float:
    """Seconds until ``target``'s /v2/health/ready answers 200 (or ``stopping()``); raises if the server
    exits or times out."""
    t0 = time.monotonic()
    while not stopping():
        if is_ready(target):
            return time.monotonic() - t0
        if proc.poll() is not None:
            raise DFlashError("tritonserver", f"exited with code {proc.returncode} before it was ready",
                              "see its log above")
        if time.monotonic() - t0 > timeout:
            raise DFlashError("tritonserver", f"not ready after {timeout:.0f} s",
                              "see its log, or raise --ready_timeout")
        time.sleep(0.2)
    return time.monotonic() - t0


def endpoints(host: str, http_port: int, grpc_port: int, metrics_port: int) -> str:
    return (f"  HTTP     http://{host}:{http_port}/v2/models/{MODEL_NAME}/generate  (and /generate_stream)\n"
            f"  gRPC     {host}:{grpc_port}  (model {MODEL_NAME}; stream for decoupled mode)\n"
            f"  metrics  http://{host}:{metrics_port}/metrics")


def reap_group(pgid: int, grace: float = 3.0) -> None:
    """Stop what is left of the server's process group: a tritonserver that gave up on its exit timeout
    leaves its python-backend stubs running."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Each port free on ``host``, or a one-line error naming the flag (a second dflash-serve, say)."""
    for flag, port in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            # as tritonserver binds: a listener makes bind fail, a connection in TIME_WAIT does not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as err:
                raise DFlashError(flag, f"port {port} on {host} is not free ({err.strerror}): another dflash-serve "
                                  "or tritonserver may be running", f"stop it, or pass another {flag}") from None


def shm_regions(pgid: int) -> set[Path]:
    """The python backend's shared-memory files that the processes of the server's group map: they are
    left in /dev/shm when tritonserver or a stub dies without cleaning up."""
    return procfs.group_regions(pgid)


class Supervisor:
    """Runs tritonserver until SIGTERM / Ctrl-C: restarts it when it crashes or its engine breaks
    (``--max_restarts``), and stops it so that every client gets a final response, nothing is left
    running and nothing is left in /dev/shm."""

    def __init__(self, cmd: list[str], env: dict[str, str], control: Path, args: argparse.Namespace,
                 guard: HttpGuard | None = None, triton_http: str | None = None, grpc_guard: GrpcGuard | None = None,
                 sockets: tuple[Path, ...] = ()):
        self.cmd, self.env, self.control, self.args, self.guard = cmd, env, control, args, guard
        self.grpc_guard = grpc_guard
        # Triton's Unix sockets: its HTTP front end leaves its socket file behind, and a restarted
        # tritonserver then fails with "already in use"
        self.sockets = sockets
        # where to ask Triton itself whether it is ready: its internal socket behind the guard
        self.triton_http = triton_http or f"{args.host}:{args.http_port}"
        self.proc: subprocess.Popen | None = None
        self.signals: list[int] = []
        self.shm: set[Path] = set()

    def on_signal(self, signum, _frame) -> None:
        self.signals.append(signum)
        if len(self.signals) > 1 and self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)     # a second signal: stop now, whatever is running

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        restarts = 0
        while True:
            for path in (*(self.control / name for name in ("stop", "drained", "broken")), *self.sockets):
                path.unlink(missing_ok=True)
            self.proc = start(self.cmd, self.env)
            print("dflash-serve: loading the model (up to a minute or more: weights, and on a CPU the adaptive draft "
                  "policy measures step costs first)...", flush=True)
            try:
                seconds = wait_ready(self.proc, self.triton_http, self.args.ready_timeout,
                                     stopping=lambda: bool(self.signals))
            except DFlashError:
                exited = self.proc.poll() is not None
                self.stop(graceful=False)
                if self.signals:
                    return 0
                if not exited or restarts >= self.args.max_restarts:
                    raise
                # tritonserver 2.51 aborts now and then before it is ready (gRPC's "skipping fork()
                # handlers", then epoll "Bad file descriptor"): a start is retried as a crash is
                restarts += 1
                print(f"dflash-serve: tritonserver exited with code {self.proc.returncode} before it was ready; "
                      f"starting it again ({restarts} of at most {self.args.max_restarts})", flush=True)
                continue
            if self.signals:
                return self.stop()
            self.shm |= shm_regions(self.proc.pid)
            print(f"dflash-serve: ready in {seconds:.1f} s, serving {self.args.repo}\n"
                  f"{endpoints(self.args.host, self.args.http_port, self.args.grpc_port, self.args.metrics_port)}\n"
                  f"dflash-serve: Ctrl-C or SIGTERM stops the server", flush=True)
            serving_since = time.monotonic()
            event = self.watch()
            if time.monotonic() - serving_since >= self.args.restart_reset_s:
                restarts = 0          # served long enough since the last restart: not a crash loop
            if event == "signal":
                return self.stop()
            if event == "broken":
                why = (self.control / "broken").read_text(errors="replace")
                print(f"dflash-serve: the model reports {why}; restarting tritonserver", flush=True)
                self.stop()
            else:
                rc = self.proc.returncode
                name = f" ({signal.Signals(-rc).name})" if rc < 0 and -rc in signal.Signals._value2member_map_ else ""
                print(f"dflash-serve: tritonserver exited with code {rc}{name} while serving; its log is above",
                      flush=True)
                self.stop(graceful=False)
            if restarts >= self.args.max_restarts:
                raise DFlashError("tritonserver", f"stopped serving {restarts + 1} times (--max_restarts "
                                  f"{self.args.max_restarts})", "see its log above")
            restarts += 1
            print(f"dflash-serve: restarting tritonserver ({restarts} of at most {self.args.max_restarts})",
                  flush=True)

    def watch(self) -> str:
        """Until a signal ("signal"), tritonserver exits ("exited") or the model reports a broken engine."""
        next_scan = time.monotonic() + 2.0
        while True:
            if self.signals:
                return "signal"
            if self.proc.poll() is not None:
                return "exited"
            if (self.control / "broken").exists():
                return "broken"
            if time.monotonic() >= next_scan:      # a stub restarted by Triton maps a new region
                self.shm |= shm_regions(self.proc.pid)
                next_scan = time.monotonic() + 2.0
            time.sleep(0.1)

    def stop(self, graceful: bool = True) -> int:
        """Drain (the model ends every running request with a final response), SIGTERM, SIGKILL if it
        hangs; then reap the process group and remove its shared-memory files. 0 if it stopped cleanly."""
        proc, args = self.proc, self.args
        clean = True
        final = bool(self.signals)             # the server stops for good (not a restart)
        if final and self.guard is not None:
            self.guard.draining = True           # new HTTP requests and /v2/health/ready: 503
        if final and self.grpc_guard is not None:
            self.grpc_guard.refuse_new()
        t0 = time.monotonic()
        if graceful and proc.poll() is None:
            (self.control / "stop").write_text("")
            print("dflash-serve: stopping: ending the running requests", flush=True)
            deadline = t0 + args.drain_timeout_s
            while (not (self.control / "drained").exists() and proc.poll() is None and len(self.signals) < 2
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        drained = (self.control / "drained").exists()
        if final and self.grpc_guard is not None:
            # What the model ended has had its final response; what is still open (an idle stream: Triton
            # 2.51 waits for it when it exits, then is killed) ends now with UNAVAILABLE, within the drain.
            ended = self.grpc_guard.close(max(0.0, min(1.0, t0 + args.drain_timeout_s - time.monotonic())))
            if ended:
                print(f"dflash-serve: ended {ended} gRPC call(s) still open after the drain", flush=True)
        if self.guard is not None:
            # Triton 2.51 waits for open HTTP connections (idle keep-alive ones too) before it unloads the
            # model, out of the same --exit_timeout_secs: with them gone it stops at once.
            self.guard.close_connections()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=args.exit_timeout_secs + 5)
        except subprocess.TimeoutExpired:
            print("dflash-serve: tritonserver did not exit in time; killing it", flush=True)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            clean = False
        reap_group(proc.pid)
        for path in self.shm:
            if path.exists():
                path.unlink(missing_ok=True)
                print(f"dflash-serve: removed {path}, left by tritonserver", flush=True)
        self.shm = set()
        # tritonserver exits 1 when its exit timeout passes with the model still loaded (its unload waits
        # for the python stub, which a long tokenization can hold): once the model had ended every request
        # that is still the stop that was asked for. A crash, a kill or requests left running are not.
        timed_out = proc.returncode == 1 and drained
        clean = clean and (proc.returncode in (0, -signal.SIGTERM) or timed_out) and len(self.signals) < 2
        note = ": its exit timeout passed while unloading the model, after every request had ended" if timed_out else ""
        print(f"dflash-serve: stopped (tritonserver exit code {proc.returncode}{note})", flush=True)
        return 0 if clean else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dflash-serve-") as work:
        args.repo = resolve_repo(args.deployment_dir, args.fill, args.decoupled_mode != "false", Path(work))
        binary = find_tritonserver()
        guarded, grpc_guarded = args.http_guard == "true", args.grpc_guard == "true"
        # Behind a guard, Triton listens on a Unix socket in this private (0700) directory: only the guard
        # (and this user) can reach it, so no one goes around the guard's checks.
        # Triton's metrics port goes with the HTTP guard: Triton 2.51 crashes on a 5 MiB form POST to /metrics.
        http_sock, grpc_sock = f"unix:{work}/triton-http.sock", f"unix:{work}/triton-grpc.sock"
        # Triton serves links to the repository from this private directory, so that nothing it writes (the python
        # backend's __pycache__) lands in the deployment (repo.link_mirror). A dry run prints the repository itself.
        served = args.repo if args.dry_run else link_mirror(args.repo, Path(work) / "served")
        metrics_sock = f"unix:{work}/triton-metrics.sock"
        cmd = build_cmd(binary, served, args.host, args.http_port, args.grpc_port, args.metrics_port,
                        args.exit_timeout_secs, args.extra, http=(http_sock, 1) if guarded else None,
                        grpc=(grpc_sock, 1) if grpc_guarded else None, metrics=(metrics_sock, 1) if guarded else None)
        env = server_env(binary)
        if args.dry_run:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(cmd))
            return 0
        check_ports(args.host, {"--http_port": args.http_port, "--grpc_port": args.grpc_port,
                                "--metrics_port": args.metrics_port})
        control = Path(work) / "control"
        control.mkdir()
        env.update({CONTROL_DIR_ENV: str(control), SUPERVISOR_PID_ENV: str(os.getpid())})
        print(f"dflash-serve: tritonserver from {binary.source}: {binary.path}", flush=True)
        guard = grpc_guard = metrics_guard = None
        try:
            if guarded:
                limits = GuardLimits(max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout_s,
                                     idle_timeout_s=args.idle_timeout_s,
                                     max_buffered_bytes=max(GuardLimits.max_buffered_bytes, 4 * args.max_body_bytes),
                                     max_client_bytes=max(GuardLimits.max_client_bytes, args.max_body_bytes + (1 << 20)))
                guard = HttpGuard(args.host, args.http_port, http_sock, limits, drop_header=ADMIN_HEADER,
                                  route=triton_routes)
                guard.start()
                print(f"dflash-serve: HTTP guard on {args.host}:{args.http_port} -> Triton on {http_sock}", flush=True)
                metrics_guard = HttpGuard(args.host, args.metrics_port, metrics_sock, limits, route=metrics_only,
                                          name="--metrics_port")
                metrics_guard.start()
                print(f"dflash-serve: metrics guard on {args.host}:{args.metrics_port} -> Triton on {metrics_sock}",
                      flush=True)
            if grpc_guarded:
                # Triton binds "unix:PATH" + ":" + port: the socket file's name ends in ":1"
                grpc_guard = GrpcGuard(args.host, args.grpc_port, f"{grpc_sock}:1", ADMIN_HEADER,
                                       GrpcLimits.for_slots(engine_slots(args.deployment_dir),
                                                            max_message_bytes=args.max_grpc_message_bytes,
                                                            idle_stream_s=args.grpc_idle_stream_s,
                                                            max_bytes_in_flight=args.max_grpc_bytes_in_flight,
                                                            max_client_bytes_in_flight=max(
                                                                args.max_grpc_message_bytes,
                                                                args.max_grpc_bytes_in_flight // 2)))
                grpc_guard.start()
                print(f"dflash-serve: gRPC guard on {args.host}:{args.grpc_port} -> Triton on {grpc_sock}:1",
                      flush=True)
            sockets = (Path(work) / "triton-http.sock", Path(work) / "triton-grpc.sock:1",
                       Path(work) / "triton-metrics.sock")
            return Supervisor(cmd, env, control, args, guard, http_sock if guarded else None, grpc_guard,
                              sockets).run()
        finally:
            for g in (guard, grpc_guard, metrics_guard):
                if g is not None:
                    g.stop()


if __name__ == "__main__":
    from ..cli import serve_main

    sys.exit(serve_main(sys.argv[1:]))
