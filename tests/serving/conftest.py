# SPDX-License-Identifier: Apache-2.0
"""Serving fixtures: tiny deployment directories (random Llama target with SmolLM2's real tokenizer and an
untrained drafter) and real tritonserver processes started by dflash-serve on free loopback ports."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from trtllm_dflash.serving.launch import free_loopback_port as free_port

RUNTIME = {"max_batch_size": 8, "max_seq_len": 256, "block_size": 8, "dtype": "float32"}
# One torch thread in every process a test starts (server, reference runs): tiny models gain nothing from
# more, and on a busy 2-core machine OpenMP's spinning threads made them several times slower.
TEST_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def terminate(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM (the way an operator stops a server), SIGKILL after ``timeout``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_logged(proc: subprocess.Popen, log: Path, line: str, timeout: float, stop_timeout: float) -> None:
    """Until ``line`` is in ``log`` (a server says it is ready); if ``proc`` exits first or ``timeout``
    passes, stops it and raises with the log's tail."""
    t0 = time.monotonic()
    while line not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            terminate(proc, stop_timeout)
            raise RuntimeError(f"no {line!r} in {log.name} (exit code {proc.returncode}):\n"
                               f"{log.read_text(errors='replace')[-6000:]}")
        time.sleep(0.1)


def make_deployment(root: Path, target: Path, drafter: Path, *, backend: str = "torch", tp_size: int = 1,
                    runtime: dict = RUNTIME, fill: bool = True) -> Path:
    """The parts of a dflash-build directory the server reads: manifest.json, target/, drafter/, triton/."""
    from trtllm_dflash.serving.repo import fill_triton

    root.mkdir(parents=True, exist_ok=True)
    for name, src in (("target", target), ("drafter", drafter)):
        if not (root / name).exists():
            os.symlink(src.resolve(), root / name)
    from trtllm_dflash.deployment import FORMAT_VERSION

    manifest = {"format_version": FORMAT_VERSION, "backend": backend, "tp_size": tp_size, "runtime": dict(runtime),
                "target": {"path": "target"}, "drafter": {"path": "drafter"}}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if fill:
        fill_triton(root, manifest)
    return root


@pytest.fixture(scope="session")
def tiny_target_with_tokenizer(tmp_path_factory, smollm2_dir) -> tuple[Path, Path]:
    """(target, drafter): a 2-layer random Llama with SmolLM2's vocabulary and tokenizer (so text works and
    a server test takes seconds), plus an untrained 1-layer drafter (greedy output = the target's)."""
    from trtllm_dflash.testing import write_tiny_pair_with_tokenizer

    return write_tiny_pair_with_tokenizer(tmp_path_factory.mktemp("tiny_smol"), smollm2_dir)


@pytest.fixture(scope="session")
def tiny_deployment(tmp_path_factory, tiny_target_with_tokenizer) -> Path:
    return make_deployment(tmp_path_factory.mktemp("deploy") / "tiny", *tiny_target_with_tokenizer)


@dataclass
class Server:
    proc: subprocess.Popen
    http: str
    grpc: str
    metrics: str
    log: Path
    ready_s: float

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str, **labels) -> float:
        """Sum of the samples of one Prometheus metric whose labels include ``labels``."""
        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5).read().decode()
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.rsplit(" ", 1)[1])
                    found = True
        if not found:
            raise KeyError(f"{name}{labels} not in /metrics")
        return total

    def metric_or_zero(self, name: str, **labels) -> float:
        """``metric``, or 0 while no sample has those labels yet (a counter Triton has not created)."""
        try:
            return self.metric(name, **labels)
        except KeyError:
            return 0.0

    def stop(self, timeout: float = 60.0) -> int:
        return terminate(self.proc, timeout)


def start_server(deployment_dir: Path, log: Path, *extra: str, timeout: float = 120.0) -> Server:
    """``dflash-serve deployment_dir`` as a subprocess on free ports; returns once it printed "ready"."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "trtllm_dflash.serving.server", str(deployment_dir), "--http_port", str(http),
           "--grpc_port", str(grpc), "--metrics_port", str(metrics), "--exit_timeout_secs", "5", *extra]
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=TEST_ENV)
    wait_logged(proc, log, "dflash-serve: ready", timeout, stop_timeout=10)
    return Server(proc, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log,
                  time.monotonic() - t0)


@pytest.fixture(scope="module")
def tiny_server(tiny_deployment, tmp_path_factory):
    """One server on the tiny deployment (decoupled) for a test module; stopped with SIGTERM at the end."""
    server = start_server(tiny_deployment, tmp_path_factory.mktemp("server") / "dflash-serve.log")
    yield server
    rc = server.stop()
    assert rc == 0, f"dflash-serve exit code {rc}:\n{server.log_text()[-4000:]}"
