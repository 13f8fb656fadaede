# SPDX-License-Identifier: Apache-2.0
"""dflash-serve: run ``tritonserver`` on a deployment's Triton repository until SIGTERM or Ctrl-C.

In: a deployment directory (serves ``DIR/triton``; ``--fill`` fills a temporary one from
``DIR/manifest.json`` instead) or a model repository. Out: HTTP, gRPC and metrics endpoints.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import DFlashError
from .launch import stop_process
from .repo import MODEL_NAME, fill_triton
from .triton_env import TritonBinary, find_tritonserver

EPILOG = """examples:
  dflash-serve engines/qwen3-8b/bf16/1-gpu
  dflash-serve engines/qwen3-8b/bf16/1-gpu --host 0.0.0.0 --http_port 8000 --grpc_port 8001
  dflash-serve engines/qwen3-8b/bf16/1-gpu --fill --decoupled_mode false   # one-response model
  dflash-serve engines/qwen3-8b/bf16/1-gpu --dry_run                        # print the command only
  dflash-serve engines/qwen3-8b/bf16/1-gpu -- --log-verbose=1               # extra tritonserver flags
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-serve", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("engine_dir", type=Path, help="deployment directory (dflash-build output) or model repository")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all interfaces")
    p.add_argument("--http_port", type=int, default=8000, help="KServe v2 HTTP/REST (generate, generate_stream)")
    p.add_argument("--grpc_port", type=int, default=8001, help="KServe v2 gRPC (bidirectional stream)")
    p.add_argument("--metrics_port", type=int, default=8002, help="Prometheus /metrics, incl. dflash_*")
    p.add_argument("--fill", action="store_true",
                   help="serve a temporary repository filled from DIR/manifest.json instead of DIR/triton")
    p.add_argument("--decoupled_mode", choices=("true", "false"), default=None,
                   help="with --fill: true streams (gRPC stream, generate_stream); false allows unary gRPC infer "
                        "[default: true]")
    p.add_argument("--exit_timeout_secs", type=int, default=10, help="how long in-flight requests get on shutdown")
    p.add_argument("--ready_timeout", type=float, default=900.0, help="seconds to wait for the model to load")
    p.add_argument("--dry_run", action="store_true", help="print the tritonserver command and exit")
    p.add_argument("extra", nargs="*", help="after --: more tritonserver flags, passed as they are")
    args = p.parse_args(argv)
    if args.decoupled_mode is not None and not args.fill:
        p.error("--decoupled_mode needs --fill (DIR/triton was filled by dflash-build with its own mode)")
    return args


def resolve_repo(path: Path, fill: bool, decoupled_mode: bool, workdir: Path) -> Path:
    """The model repository to serve for ``path`` (a deployment directory or a repository)."""
    if (path / "manifest.json").is_file():
        if fill:
            manifest = json.loads((path / "manifest.json").read_text())
            return fill_triton(path, manifest, decoupled_mode=decoupled_mode, repo_dir=workdir / "triton")
        repo = path / "triton"
        if not (repo / MODEL_NAME / "config.pbtxt").is_file():
            raise DFlashError("engine_dir", f"{path} has no filled triton/ repository",
                              "rebuild with dflash-build, or pass --fill")
        return repo
    if (path / MODEL_NAME / "config.pbtxt").is_file():
        if fill:
            raise DFlashError("--fill", f"{path} is a model repository, not a deployment", "pass the deployment dir")
        return path
    raise DFlashError("engine_dir", f"{path} is neither a deployment (manifest.json) nor a model repository",
                      "pass the output directory of dflash-build")


def build_cmd(binary: TritonBinary, repo: Path, host: str, http_port: int, grpc_port: int, metrics_port: int,
              exit_timeout_secs: int = 10, extra: list[str] = ()) -> list[str]:
    """The tritonserver command line, as a list (printed by --dry_run, tested as data)."""
    cmd = [binary.path, f"--model-repository={Path(repo).resolve()}"]
    if binary.backend_dir:
        cmd.append(f"--backend-directory={binary.backend_dir}")
    cmd += [f"--http-address={host}", f"--http-port={http_port}",
            f"--grpc-address={host}", f"--grpc-port={grpc_port}",
            f"--metrics-address={host}", f"--metrics-port={metrics_port}",
            f"--exit-timeout-secs={exit_timeout_secs}"]
    if binary.source == "nvidia-pytriton":
        cmd.append("--allow-gpu-metrics=false")   # the wheel's DCGM cannot start outside NGC images
    return cmd + list(extra)


def server_env(binary: TritonBinary) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE: the stub would otherwise write __pycache__ into the repository.
    return {**binary.env, "PYTHONDONTWRITEBYTECODE": "1"}


def _die_with_parent() -> None:
    # The server runs in its own session (so Ctrl-C reaches it once, from us); this makes the kernel
    # stop it should dflash-serve itself be killed.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def start(cmd: list[str], env: dict[str, str], stdout=None) -> subprocess.Popen:
    return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                            start_new_session=True, preexec_fn=_die_with_parent)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> float:
    """Seconds until ``url/v2/health/ready`` answers 200; raises if the server exits or times out."""
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None:
            raise DFlashError("tritonserver", f"exited with code {proc.returncode} before it was ready",
                              "see its log above")
        if time.monotonic() - t0 > timeout:
            raise DFlashError("tritonserver", f"not ready after {timeout:.0f} s",
                              "see its log, or raise --ready_timeout")
        time.sleep(0.2)


def endpoints(host: str, http_port: int, grpc_port: int, metrics_port: int) -> str:
    return (f"  HTTP     http://{host}:{http_port}/v2/models/{MODEL_NAME}/generate  (and /generate_stream)\n"
            f"  gRPC     {host}:{grpc_port}  (model {MODEL_NAME}; stream for decoupled mode)\n"
            f"  metrics  http://{host}:{metrics_port}/metrics")


def stop(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, wait for Triton's graceful shutdown, SIGKILL if it hangs; then reap what it left."""
    stop_process(proc, timeout)
    reap_group(proc.pid)
    return proc.returncode


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dflash-serve-") as work:
        repo = resolve_repo(args.engine_dir, args.fill, args.decoupled_mode != "false", Path(work))
        binary = find_tritonserver()
        cmd = build_cmd(binary, repo, args.host, args.http_port, args.grpc_port, args.metrics_port,
                        args.exit_timeout_secs, args.extra)
        env = server_env(binary)
        if args.dry_run:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(cmd))
            return 0
        print(f"dflash-serve: tritonserver from {binary.source}: {binary.path}", flush=True)
        proc = start(cmd, env)
        stopping = []

        def on_signal(signum, _frame):
            stopping.append(signum)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            seconds = wait_ready(proc, f"http://{args.host}:{args.http_port}", args.ready_timeout)
        except DFlashError:
            if stopping:
                return 0 if stop(proc, args.exit_timeout_secs + 20) in (0, -signal.SIGTERM) else 1
            stop(proc, 5)
            raise
        print(f"dflash-serve: ready in {seconds:.1f} s, serving {repo}\n"
              f"{endpoints(args.host, args.http_port, args.grpc_port, args.metrics_port)}\n"
              f"dflash-serve: Ctrl-C or SIGTERM stops the server", flush=True)
        rc = proc.wait()
        reap_group(proc.pid)
        if stopping:
            print(f"dflash-serve: stopped (tritonserver exit code {rc})", flush=True)
            return 0 if rc in (0, -signal.SIGTERM) else 1
        raise DFlashError("tritonserver", f"exited with code {rc}", "see its log above")


if __name__ == "__main__":
    from ..cli import serve_main

    sys.exit(serve_main(sys.argv[1:]))
