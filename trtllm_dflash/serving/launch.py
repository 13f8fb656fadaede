# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism of the torch runtime behind Triton: rank 0 lives in the Triton model process, ranks
1..N-1 run ``python -m trtllm_dflash.runtime.worker DIR`` under ``mpiexec -n N-1`` with
TRTLLM_DFLASH_RANK_OFFSET=1 and a rendezvous (MASTER_ADDR/MASTER_PORT) that rank 0 picks.
The command is built as a list (tested as data), never a shell string."""
from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ..errors import DFlashError


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (Triton's internal HTTP front end behind dflash-serve's guard)."""

    def __init__(self, path: str, timeout: float = 60.0):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def http_connection(target: str, timeout: float = 60.0) -> http.client.HTTPConnection:
    """A connection to ``host:port`` or ``unix:/path``."""
    if target.startswith("unix:"):
        return UnixHTTPConnection(target[5:], timeout)
    host, port = target.rsplit(":", 1)
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)


def tp_env(tp_size: int, master_port: int | None = None) -> dict[str, str]:
    """Rendezvous of all ranks: rank 0 (this process) listens on MASTER_PORT."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port or free_loopback_port()),
            "TRTLLM_DFLASH_WORLD_SIZE": str(tp_size)}


def mpi_flavor(mpiexec: str) -> str:
    """``mpich`` (the PyPI package; Hydra) or ``openmpi`` (GPU hosts), from ``mpiexec --version``."""
    out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    if "HYDRA" in text:
        return "mpich"
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    raise DFlashError("mpiexec", f"{mpiexec} is neither MPICH nor Open MPI", "put one of them first on PATH")


def follower_argv(deployment_dir: Path, tp_size: int, env: dict[str, str], *, mpiexec: str | None = None,
                  flavor: str | None = None, python: str = sys.executable, is_root: bool | None = None) -> list[str]:
    """``mpiexec -n N-1 ... python -m trtllm_dflash.runtime.worker DIR``: ranks 1..N-1 of the torch runtime."""
    mpiexec = mpiexec or shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        raise DFlashError("tp_size", f"is {tp_size} but mpiexec is not on PATH",
                          "pip install 'trtllm-dflash[mpi]' (MPICH) or install Open MPI")
    flavor = flavor or mpi_flavor(mpiexec)
    env = {**env, "TRTLLM_DFLASH_RANK_OFFSET": "1"}
    argv = [mpiexec, "-n", str(tp_size - 1)]
    if flavor == "mpich":
        for key, value in env.items():
            argv += ["-genv", key, value]
    else:
        if os.geteuid() == 0 if is_root is None else is_root:
            argv.append("--allow-run-as-root")
        for key, value in env.items():
            argv += ["-x", f"{key}={value}"]
    return argv + [python, "-m", "trtllm_dflash.runtime.worker", str(deployment_dir)]


def die_with_parent() -> None:
    # mpiexec (and through it every rank) goes when this process goes, however it goes.
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def stop_process(proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
