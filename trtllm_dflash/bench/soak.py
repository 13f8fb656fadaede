# SPDX-License-Identifier: Apache-2.0
"""Soak a served deployment: start dflash-serve on free loopback ports, drive it with N concurrent mixed clients
for a given time while injecting faults, then check that it held.

Phases, in order (each bounded in time; nothing leaves this machine's loopback interface):
  solo       each prompt alone over HTTP, greedy: the reference answers
  load       --streams client threads for --duration seconds, kinds taken in turn (http = /generate,
             sse = /generate_stream, grpc = tritonclient bidirectional stream), every answer compared with
             its solo answer; meanwhile, every --fault_every seconds, one fault in turn:
               kill       a dflash-client process SIGKILLed once it streamed some text
               cancel     a gRPC stream request cancelled through the `stop` input (same request id)
               malformed  bodies that are not JSON, deeply nested, of wrong types, empty, unknown fields,
                          a seed of 2**64-1, 5,000 stop strings, invalid UTF-8 over gRPC
               oversized  a 5 MB prompt as JSON and a 4 MB form-urlencoded body (what `curl -d` sends)
               timeout    6 non-streaming requests whose clients give up after 0.5 s
               absolute   absolute-form targets (RFC 9112 3.2.2): JSON 1,000,000 deep behind
                          Inference-Header-Content-Length 2, invalid JSON, an escaped path; then one
                          absolute-form request that reaches the model (refused there: max_tokens)
               metrics_port  a 5 MiB form POST to the metrics port, then GET /metrics
               desync     a generate sent "Transfer-Encoding: CHUNKED" twice on one connection (both
                          reach the model), and bad chunk sizes (0x.., +N, N_M) each answered 400
               idle_stream  64 idle gRPC streams held while a gRPC request reaches the model
             and once, half way, a burst of --burst requests at once on one gRPC stream
  kills      on the idle server: --kills clients killed mid-stream one by one; how long until the slot is
             free (seconds and engine steps), and the latency of the next request against the idle baseline;
             then 6 non-streaming clients that time out: every slot must be free within 1 s

--server openai tests dflash-openai the same way: clients openai (/v1/completions streamed) and openai_plain
(not streamed), solo answers from openai_plain, faults kill (a streaming client SIGKILLed), malformed (bad
JSON, nesting, a lone surrogate, out-of-range values, 5,000 stop strings), oversized (a 4 MB prompt refused by
its size, a 5 MiB body refused from its Content-Length) and timeout; the burst is --burst requests at once;
active requests come from its /health (running + waiting), finished requests by finish reason from its /metrics
(dflash:request_success_total).
  sigterm    (--sigterm) 16 streams in flight, SIGTERM to dflash-serve: when and how each client ended,
             whether the server's processes and /dev/shm files are gone

Checks (exit code 1 when one fails): every request answered correctly or with a clear error; greedy answers
equal to the solo answers; active requests back to 0; RSS growth of the server's processes below
--max_rss_growth (last samples against the samples after warm-up); the metrics endpoint's finished-request
counts by finish reason equal to what the clients saw; each fault handled within its time bound; with
--sigterm, every client ended with a final response within 10 s, no process or /dev/shm file left behind.

Out: --out JSON (provenance, settings, counts, latency percentiles, RSS and load average over time, fault
outcomes, pass/fail per check, and `summary`) and the same name with .png (latency and RSS over time).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]   # the folder holding trtllm_dflash: the servers it starts import it too

from trtllm_dflash import provenance
from trtllm_dflash.bench.helpformat import HelpFormatter
from trtllm_dflash.bench.metrics import distribution
from trtllm_dflash.deployment import Deployment
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import client
from trtllm_dflash.serving.launch import free_loopback_port
from trtllm_dflash.serving.procfs import alive, descendants

MODEL = "tensorrt_llm"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,",
           "Hello, my name is", "import numpy as np", "The quick brown fox", "Q: What is 2+2?\nA:",
           "Water boils at", "class Stack:\n    def push(self, item):", "The three primary colors are",
           "SELECT name FROM users WHERE"]
LONG_PROMPT = "Tell me a long story about a lighthouse keeper"
KINDS = ("http", "sse", "grpc", "openai", "openai_plain")
FAULTS = ("kill", "cancel", "malformed", "oversized", "timeout", "absolute", "metrics_port", "desync", "idle_stream")
# --server openai: what dflash-openai has (no gRPC `stop` input to cancel with)
OPENAI_FAULTS = ("kill", "malformed", "oversized", "timeout")
# gRPC/HTTP transport failures: the connection went away without a response that says why. (A server that
# answers "shutting down" with gRPC status UNAVAILABLE did say why: the status alone is not a drop.)
TRANSPORT = ("Socket closed", "Stream removed", "failed to connect", "Connection reset", "Connection aborted",
             "Broken pipe", "RemoteDisconnected", "IncompleteRead", "cannot reach", "Connection refused")

EPILOG = """examples:
  # the CPU demo, as committed in benchmarks/results/soak_smollm2_cpu.json:
  dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml --out engines/smollm2
  python -m trtllm_dflash.bench.soak --deployment_dir engines/smollm2 --streams 64 --duration 600 --sigterm \\
      --out benchmarks/results/soak_smollm2_cpu.json
  # a quick look (2 minutes, no faults):
  python -m trtllm_dflash.bench.soak --deployment_dir engines/smollm2 --streams 8 --duration_s 60 --faults none --kills 0 \\
      --out /tmp/s.json

what passes: see the checks above; `summary` in the JSON also states the issue's goals (met or not):
0 failed or wrong requests, 0 leaked slots, RSS growth < 10%, killed clients' slots free within one step with
the next request's latency unchanged, SIGTERM with 16 streams -> every client answered within 10 s, no orphans.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-bench soak", description=__doc__, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    p.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="engine", type=Path, required=True,
                   help="deployment directory (dflash-build output)")
    p.add_argument("--out", type=Path, required=True, help="report JSON; the plot goes next to it as .png")
    p.add_argument("--streams", type=int, default=16, help="concurrent client threads in the load phase")
    p.add_argument("--duration_s", "--duration", dest="duration", type=float, default=60.0,
                   help="seconds of the load phase")
    p.add_argument("--kinds", default=None,
                   help=f"client kinds, taken in turn, of {', '.join(KINDS)} [default: http,sse,grpc, plus openai "
                        "with --openai]")
    p.add_argument("--server", choices=("triton", "openai"), default="triton",
                   help="the server under test: dflash-serve (Triton: HTTP, SSE, gRPC) or dflash-openai "
                        "(/v1/completions, streamed and not); one report per server")
    p.add_argument("--openai", action="store_true",
                   help="also start dflash-openai on the deployment (its own engine) and send its clients "
                        "/v1/completions streams; their answers are compared with the same solo answers")
    p.add_argument("--max_tokens", type=int, default=32, help="tokens per request (greedy)")
    p.add_argument("--prompts", type=int, default=8, help=f"distinct prompts (at most {len(PROMPTS)}); each is "
                   "answered alone first, as the reference")
    p.add_argument("--probe_tokens", type=int, default=8,
                   help="tokens of the probe request after each kill (and of its idle baseline)")
    p.add_argument("--faults", default=None,
                   help=f"faults in turn ({', '.join(FAULTS)}) or none [default: all; with --server openai "
                        f"{', '.join(OPENAI_FAULTS)}]")
    p.add_argument("--skip_cases", default="",
                   help="malformed/oversized cases to leave out, comma-separated (e.g. deeply_nested while a known "
                        "crash is being fixed); the report records them")
    p.add_argument("--fault_every_s", "--fault_every", dest="fault_every", type=float, default=10.0,
                   help="seconds between faults in the load phase")
    p.add_argument("--burst", type=int, default=None,
                   help="requests sent at once half way [default: 8 x the deployment's max_batch_size; 0 = none]")
    p.add_argument("--fault_wait_s", "--fault_wait", dest="fault_wait", type=float, default=60.0,
                   help="seconds a kill or cancel fault waits for its stream's first text (under a deep queue the "
                        "request may still be waiting for a slot: it is killed or cancelled there)")
    p.add_argument("--kills", type=int, default=20, help="clients killed mid-stream one by one on the idle server")
    p.add_argument("--sigterm", action="store_true", help="end with SIGTERM while --sigterm_streams stream")
    p.add_argument("--sigterm_streams", type=int, default=16)
    p.add_argument("--sigterm_deadline_s", "--sigterm_deadline", dest="sigterm_deadline", type=float, default=10.0,
                   help="seconds after SIGTERM by which every client must have its final response")
    p.add_argument("--max_rss_growth", type=float, default=0.10, help="allowed RSS growth over the load phase")
    p.add_argument("--warmup_s", "--warmup", dest="warmup", type=float, default=None,
                   help="seconds of the load phase before the RSS baseline [default: 10%% of --duration]")
    p.add_argument("--sample_every_s", "--sample_every", dest="sample_every", type=float, default=2.0,
                   help="seconds between RSS/metrics samples")
    p.add_argument("--request_timeout_s", "--request_timeout", dest="request_timeout", type=float, default=300.0,
                   help="seconds a client waits for a response")
    p.add_argument("--hostile_timeout_s", "--hostile_timeout", dest="hostile_timeout", type=float, default=10.0,
                   help="seconds within which a malformed or oversized request must be refused")
    p.add_argument("--ready_timeout_s", "--ready_timeout", dest="ready_timeout", type=float, default=600.0,
                   help="seconds for dflash-serve to become ready")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    openai_only = args.server == "openai"
    args.kinds = ([k for k in args.kinds.split(",") if k] if args.kinds else
                  ["openai", "openai_plain"] if openai_only else ["http", "sse", "grpc"] + ["openai"] * args.openai)
    if args.faults is None:
        args.faults = ",".join(OPENAI_FAULTS if openai_only else FAULTS)
    args.faults = [] if args.faults == "none" else [f for f in args.faults.split(",") if f]
    args.skip_cases = [c for c in args.skip_cases.split(",") if c]
    known = ({name for name, _, _ in malformed_cases()} | set(OVERSIZED)
             | {name for name, _ in openai_malformed_cases()} | set(OPENAI_OVERSIZED))
    for c in args.skip_cases:
        if c not in known:
            p.error(f"--skip_cases: unknown {c!r}; choose from {', '.join(sorted(known))}")
    for k in args.kinds:
        if k not in KINDS:
            p.error(f"--kinds: unknown {k!r}; choose from {', '.join(KINDS)}")
    for f in args.faults:
        if f not in (OPENAI_FAULTS if openai_only else FAULTS):
            p.error(f"--faults: {f!r} is not one of {', '.join(OPENAI_FAULTS if openai_only else FAULTS)} or none")
    if openai_only and any(not k.startswith("openai") for k in args.kinds):
        p.error("--kinds: --server openai takes openai and openai_plain only")
    if any(k.startswith("openai") for k in args.kinds) and not (args.openai or openai_only):
        p.error("--kinds: openai needs --openai (the OpenAI server is started beside dflash-serve)")
    try:
        args.deployment = Deployment.open(args.engine)
    except DFlashError as err:
        p.error(str(err))
    if not 1 <= args.prompts <= len(PROMPTS):
        p.error(f"--prompts must be in [1, {len(PROMPTS)}]")
    if args.streams < 1 or args.duration <= 0:
        p.error("--streams and --duration must be positive")
    if args.out.exists():
        p.error(f"--out: {args.out} exists; move it away first")
    return args


# ---------------------------------------------------------------------------------------------------
# the server under test: dflash-serve, its process tree, its metrics


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def shm_files(pids) -> set[str]:
    """/dev/shm files the processes hold open or mapped (Triton's python-backend regions)."""
    found = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/shm/"):
                    found.add(target.split(" (deleted)")[0])
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    found.add(line[line.index("/dev/shm/"):].split(" (deleted)")[0])
        except OSError:
            continue
    return found


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(name, sorted label pairs): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, labels = head, ()
        if "{" in head:
            name, body = head[:head.index("{")], head[head.index("{") + 1:head.rindex("}")]
            labels = tuple(sorted(tuple(kv.split("=", 1)) for kv in body.split('",') if "=" in kv))
            labels = tuple((k, v.strip('"')) for k, v in labels)
        try:
            out[(name, labels)] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(metrics: dict, name: str, **labels) -> float:
    return sum(v for (n, lab), v in metrics.items()
               if n == name and all((k, str(x)) in lab for k, x in labels.items()))


def finish_counts(metrics: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, lab), v in metrics.items():
        if n == "dflash_requests_total":
            reason = dict(lab).get("finish_reason", "?")
            out[reason] = out.get(reason, 0.0) + v
    return out


@dataclass
class Server:
    proc: subprocess.Popen
    http: str
    grpc: str
    metrics_url: str
    log: Path
    ready_s: float = 0.0
    openai: OpenAIServer | None = None
    only_openai: bool = False     # --server openai: proc is dflash-openai, and there is no Triton

    @classmethod
    def start_openai(cls, engine: Path, log: Path, timeout: float) -> "Server":
        """dflash-openai as the server under test: its /health gives the active requests (running + waiting)."""
        t0 = time.monotonic()
        oa = OpenAIServer.start(engine, log, timeout)
        srv = cls(oa.proc, oa.url, "", "", log, openai=oa, only_openai=True)
        srv.ready_s = time.monotonic() - t0
        return srv

    @classmethod
    def start(cls, engine: Path, log: Path, timeout: float) -> "Server":
        http, grpc, metrics = free_loopback_port(), free_loopback_port(), free_loopback_port()
        cmd = [sys.executable, "-m", "trtllm_dflash.serving.server", str(engine), "--http_port", str(http),
               "--grpc_port", str(grpc), "--metrics_port", str(metrics), "--exit_timeout_secs", "5"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        t0 = time.monotonic()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        srv = cls(proc, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics", log)
        while "dflash-serve: ready" not in srv.log_text():
            if proc.poll() is not None or time.monotonic() - t0 > timeout:
                srv.kill_tree()
                tail = srv.log_text()[-3000:]
                raise DFlashError("dflash-serve", f"not ready after {time.monotonic() - t0:.0f} s "
                                  f"(exit code {proc.poll()}); its log ends:\n{tail}\n", f"see {log}")
            time.sleep(0.2)
        srv.ready_s = time.monotonic() - t0
        return srv

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> dict:
        if self.only_openai:     # the same names as Triton's: /health's counts, /metrics' finished requests
            with urllib.request.urlopen(f"http://{self.http}/health", timeout=10) as r:
                h = json.loads(r.read())
            with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10) as r:
                exposed = parse_metrics(r.read().decode())
            out = {("dflash_active_requests", ()): float(h["running"] + h["waiting"]),
                   ("dflash_steps_total", ()): float(h.get("steps", 0))}
            for (name, labels), v in exposed.items():
                if name == "dflash:request_success_total":
                    out[("dflash_requests_total", (("finish_reason", dict(labels)["finished_reason"]),))] = v
            return out
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return parse_metrics(r.read().decode())

    def ready(self) -> bool:
        try:
            path = "/health" if self.only_openai else "/v2/health/ready"
            with urllib.request.urlopen(f"http://{self.http}{path}", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def tree(self) -> dict[int, tuple[str, int]]:
        """dflash-serve's processes (tritonserver, the python-backend stub, ranks)."""
        return descendants(self.proc.pid)

    def all_processes(self) -> dict[int, tuple[str, int]]:
        """Every server process this script started, dflash-openai's included (for RSS)."""
        return {**self.tree(), **(descendants(self.openai.proc.pid) if self.openai else {})}

    def kill_tree(self) -> None:
        """SIGKILL what is left of the processes this script started (by pid)."""
        for pid, (_, start) in self.tree().items():
            if alive(pid, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc.wait(timeout=30)


@dataclass
class OpenAIServer:
    """dflash-openai on the same deployment (a process of its own, with its own engine)."""

    proc: subprocess.Popen
    url: str
    model: str = ""

    @classmethod
    def start(cls, engine: Path, log: Path, timeout: float) -> "OpenAIServer":
        port = free_loopback_port()
        cmd = [sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(engine), "--port", str(port)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        srv, t0 = cls(proc, f"127.0.0.1:{port}"), time.monotonic()
        while not srv.model:
            try:
                with urllib.request.urlopen(f"http://{srv.url}/v1/models", timeout=5) as r:
                    srv.model = json.loads(r.read())["data"][0]["id"]
            except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
                if proc.poll() is not None or time.monotonic() - t0 > timeout:
                    srv.stop()
                    raise DFlashError("dflash-openai", f"not ready after {time.monotonic() - t0:.0f} s; its log "
                                      f"ends:\n{log.read_text(errors='replace')[-3000:]}\n", f"see {log}") from None
                time.sleep(0.5)
        return srv

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                for pid, (_, start) in descendants(self.proc.pid).items():
                    if alive(pid, start):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@contextmanager
def _openai_completion(url: str, body: dict, timeout: float):
    """POST ``body`` to /v1/completions; the response, with HTTP, connection and timeout failures (also those while
    it is read) as one-line DFlashErrors."""
    req = urllib.request.Request(f"http://{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            yield r
    except urllib.error.HTTPError as err:
        raise DFlashError("server", f"HTTP {err.code}: {err.read()[:300].decode('utf-8', 'replace')}") from None
    except urllib.error.URLError as err:
        raise DFlashError("url", f"cannot reach {url} ({err.reason})") from None
    except TimeoutError:
        raise DFlashError("server", f"no response within {timeout:.0f} s") from None


def generate_openai_plain(url: str, model: str, prompt: str, timeout: float, **sampling):
    """/v1/completions not streamed: one dict like the streamed ones' last."""
    with _openai_completion(url, {"model": model, "prompt": prompt, **sampling}, timeout) as r:
        choice = json.loads(r.read())["choices"][0]
    yield {"text_output": choice["text"], "finish_reason": choice["finish_reason"]}


def generate_openai(url: str, model: str, prompt: str, timeout: float, **sampling):
    """/v1/completions streamed (server-sent events), as dicts like dflash-client's: ``text_output`` and, on the
    last chunk, ``finish_reason``."""
    with _openai_completion(url, {"model": model, "prompt": prompt, "stream": True, **sampling}, timeout) as r:
        for line in r:
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise DFlashError("server", json.dumps(event["error"])[:300])
            choice = event["choices"][0]
            out = {"text_output": choice.get("text", "")}
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
            yield out


# ---------------------------------------------------------------------------------------------------
# clients: one request of each kind, timed, never raising


@dataclass
class Outcome:
    phase: str
    kind: str
    prompt: int
    t0: float                      # seconds since the run started
    status: str = ""               # ok | wrong | error | cancelled | dropped | timeout
    latency_s: float | None = None
    ttft_s: float | None = None
    finish_reason: str | None = None
    error: str = ""
    text: str = ""


def classify_error(message: str) -> str:
    if "no response within" in message:
        return "timeout"
    if any(t in message for t in TRANSPORT):
        return "dropped"
    if "CANCELLED" in message or "cancelled" in message.lower():
        return "cancelled"
    return "error"


def responses_for(kind: str, srv: Server, prompt: str, timeout: float, request_id: str = "", **sampling):
    if kind == "openai":
        return generate_openai(srv.openai.url, srv.openai.model, prompt, timeout, **sampling)
    if kind == "openai_plain":
        return generate_openai_plain(srv.openai.url, srv.openai.model, prompt, timeout, **sampling)
    inputs = client.build_inputs(prompt, kind != "http", **sampling)
    if kind == "grpc":
        return client.generate_grpc(srv.grpc, inputs, request_id=request_id, timeout=timeout)
    return client.generate_http(srv.http, inputs, timeout=timeout)


def run_request(kind: str, srv: Server, prompt_index: int, prompt: str, phase: str, t_run: float, timeout: float,
                on_first=None, **sampling) -> Outcome:
    """One request; the outcome says how it ended (text compared later)."""
    out = Outcome(phase, kind, prompt_index, time.monotonic() - t_run)
    t0 = time.monotonic()
    pieces, last = [], {}
    try:
        for r in responses_for(kind, srv, prompt, timeout, **sampling):
            if out.ttft_s is None and r.get("text_output"):
                out.ttft_s = time.monotonic() - t0
                if on_first is not None:
                    on_first()
            pieces.append(r.get("text_output", ""))
            last = r
        out.text = "".join(pieces)
        out.finish_reason = last.get("finish_reason")
        if out.finish_reason is None:
            out.status, out.error = "dropped", "the stream ended without a final response"
        else:
            out.status = "cancelled" if out.finish_reason == "cancelled" else "ok"
    except DFlashError as err:
        out.error = str(err)
        out.status = classify_error(out.error)
    except Exception as err:  # noqa: BLE001 - a transport error mid-stream (IncompleteRead, reset, ...)
        out.error = f"{type(err).__name__}: {err}"
        out.status = "dropped" if not isinstance(err, TimeoutError) else "timeout"
    out.latency_s = time.monotonic() - t0
    return out


def client_process(srv: Server, protocol: str, max_tokens: int) -> subprocess.Popen:
    """A dflash-client process streaming a long answer (the one a fault kills)."""
    url = srv.grpc if protocol == "grpc" else srv.http
    cmd = [sys.executable, "-m", "trtllm_dflash.serving.client", LONG_PROMPT, "--protocol", protocol, "--url", url,
           "--streaming", "--max_tokens", str(max_tokens), "--ignore_eos"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    os.set_blocking(proc.stdout.fileno(), False)
    return proc


def wait_for_text(proc: subprocess.Popen, timeout: float) -> bool:
    t0, seen = time.monotonic(), b""
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        seen += proc.stdout.read() or b""
        if seen:
            return True
        time.sleep(0.01)
    return bool(seen)


# ---------------------------------------------------------------------------------------------------
# faults


def _post(url: str, body: bytes, content_type: str, timeout: float) -> tuple[int, str, float, str | None]:
    """(HTTP status or 0 for no answer, error text, seconds, finish_reason of an answer)."""
    t0 = time.monotonic()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            answer = json.loads(r.read())
            return r.status, "", time.monotonic() - t0, answer.get("finish_reason")
    except urllib.error.HTTPError as err:
        text = err.read()[:2000].decode("utf-8", "replace")
        try:
            text = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        return err.code, str(text)[:300], time.monotonic() - t0, None
    except Exception as err:  # noqa: BLE001 - no answer at all is what we measure here
        return 0, f"{type(err).__name__}: {err}"[:300], time.monotonic() - t0, None


def malformed_cases() -> list[tuple[str, bytes, str]]:
    """(name, body, content type) for /generate; each must be refused with a clear error."""
    def j(obj):
        return json.dumps(obj).encode()
    depth = 100_000
    return [
        ("not_json", b"{this is not json", "application/json"),
        ("deeply_nested", b'{"text_input": ' + b"[" * depth + b"]" * depth + b"}", "application/json"),
        ("empty_prompt", j({"text_input": ""}), "application/json"),
        ("wrong_type", j({"text_input": "hi", "sampling_param_max_tokens": "ten"}), "application/json"),
        ("negative_max_tokens", j({"text_input": "hi", "sampling_param_max_tokens": -3}), "application/json"),
        ("unknown_field", j({"text_input": "hi", "max_token": 5}), "application/json"),
        ("nan_temperature", b'{"text_input": "hi", "sampling_param_temperature": NaN}', "application/json"),
        ("stop_list_5000", j({"text_input": "hi", "sampling_param_max_tokens": 4,
                              "sampling_param_stop": [f"stop{i}" for i in range(5000)]}), "application/json"),
        # #25: the guard's depth check was skipped for other content types (Triton 2.51 then died), and
        # values Triton casts without a range check or answers 500 to
        ("nested_1M_octet_stream", b'{"text_input": ' + b"[" * 10**6 + b"]" * 10**6 + b"}", "application/octet-stream"),
        ("max_tokens_2^32+8", j({"text_input": "hi", "sampling_param_max_tokens": 2**32 + 8}), "application/json"),
        ("temperature_1e30", j({"text_input": "hi", "sampling_param_temperature": 1e30}), "application/json"),
        ("seed_-1", j({"text_input": "hi", "sampling_param_seed": -1}), "application/json"),
        ("seed_2^64", j({"text_input": "hi", "sampling_param_seed": 2**64}), "application/json"),
        ("empty_body", b"", "application/json"),
        ("non_utf8_body", b'{"text_input": "\xff\xfe"}', "application/json"),
    ]


def _finished(cases: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in cases:
        if c.get("finish_reason"):
            out[c["finish_reason"]] = out.get(c["finish_reason"], 0) + 1
    return out


def fault_malformed(srv: Server, timeout: float, skip: list[str] = ()) -> dict:
    import numpy as np

    url = f"http://{srv.http}/v2/models/{MODEL}/generate"
    cases = []
    for name, body, ctype in malformed_cases():
        if name in skip:
            continue
        code, text, secs, reason = _post(url, body, ctype, timeout + 5 if name != "stop_list_5000" else 900)
        # The 5,000 stop strings may be answered (then it may wait in the queue like any other request) or
        # refused by a server that caps the list; everything else must be refused. A refusal comes within
        # ``timeout`` with a message.
        refused = 400 <= code < 600 and bool(text) and secs <= timeout
        ok = (code == 200 or refused) if name == "stop_list_5000" else refused
        cases.append({"name": name, "code": code, "error": text, "seconds": round(secs, 3), "pass": ok,
                      "finish_reason": reason})
    # a seed of 2**64-1 (legal for the UINT64 input): answered or refused, never breaks the engine
    body = json.dumps({"text_input": "hi", "sampling_param_max_tokens": 4, "sampling_param_temperature": 0.7,
                       "sampling_param_seed": 2**64 - 1}).encode()
    code, text, secs, reason = _post(url, body, "application/json", 900)
    cases.append({"name": "seed_2^64-1", "code": code, "error": text, "seconds": round(secs, 3),
                  "pass": code == 200 or (code == 400 and secs <= timeout), "finish_reason": reason})
    # invalid UTF-8 over gRPC
    t0 = time.monotonic()
    reason = None
    try:
        got = client.collect(client.generate_grpc(srv.grpc, {"text_input": np.array([b"\xff\xfeabc"], dtype=np.object_),
                                                             "sampling_param_max_tokens": 4}, timeout=timeout))
        code, text, reason = 200, f"answered: {got.get('text_output', '')[:60]!r}", got.get("finish_reason")
    except DFlashError as err:
        code, text = 400, str(err)
    secs = time.monotonic() - t0
    cases.append({"name": "invalid_utf8_grpc", "code": code, "error": text[:300], "seconds": round(secs, 3),
                  "pass": code == 400 and "text_input" in text and secs <= timeout, "finish_reason": reason})
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.ready(), "finished": _finished(cases)}


OVERSIZED = ("prompt_5MiB_json", "body_4MiB_form_urlencoded", "grpc_message_8MiB", "slow_uploads_4x16MiB")


def fault_oversized(srv: Server, timeout: float, skip: list[str] = ()) -> dict:
    url = f"http://{srv.http}/v2/models/{MODEL}/generate"
    big = "word " * (1 << 20)     # 5 MiB of text
    cases = []
    for name, body, ctype in (
            (OVERSIZED[0], json.dumps({"text_input": big}).encode(), "application/json"),
            (OVERSIZED[1], json.dumps({"text_input": big[:4 << 20]}).encode(), "application/x-www-form-urlencoded")):
        if name in skip:
            continue
        code, text, secs, reason = _post(url, body, ctype, timeout + 5)
        ok = 400 <= code < 600 and bool(text) and secs <= timeout and srv.proc.poll() is None
        cases.append({"name": name, "code": code, "error": text[:300], "seconds": round(secs, 3), "pass": ok,
                      "finish_reason": reason})
    if OVERSIZED[2] not in skip:
        cases.append(_grpc_oversized(srv, 8 << 20, timeout))
    if OVERSIZED[3] not in skip:
        cases.append(_slow_uploads(srv, timeout))
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.ready(), "finished": _finished(cases)}


def _grpc_oversized(srv: Server, size: int, timeout: float) -> dict:
    """A gRPC message over dflash-serve's bound (4 MiB): refused with RESOURCE_EXHAUSTED naming the bound,
    before Triton buffers it (#25: 200 MB ones were held whole, 4 GB RSS)."""
    import numpy as np
    t0 = time.monotonic()
    try:
        got = client.collect(client.generate_grpc(srv.grpc, {"text_input": np.array([b"x" * size], dtype=np.object_)},
                                                  timeout=timeout))
        code, text = 200, f"answered: {got.get('finish_reason')}"
    except DFlashError as err:
        code, text = 400, str(err)
    secs = time.monotonic() - t0
    return {"name": OVERSIZED[2], "code": code, "error": text[:300], "seconds": round(secs, 3),
            "pass": code == 400 and "larger than max" in text and secs <= timeout, "finish_reason": None}


def _slow_uploads(srv: Server, timeout: float) -> dict:
    """Four connections announce 16 MiB bodies and send one byte (#25: they held the guard's whole 64-MiB budget
    for good; #37: for their read time, by what they announced): they hold the bytes they sent, nothing is
    refused, and a request's body still reaches the model while they are open."""
    import socket
    host, port = srv.http.rsplit(":", 1)
    t0 = time.monotonic()
    socks, replies = [], []
    try:
        for _ in range(4):
            s = socket.create_connection((host, int(port)), timeout=timeout)
            s.sendall(f"POST /v2/models/{MODEL}/generate HTTP/1.1\r\nHost: x\r\nContent-Length: {16 << 20}\r\n\r\n{{"
                      .encode())
            socks.append(s)
        # A body that reaches the model and is refused there at once (max_tokens over max_seq_len): proof that
        # bodies still get through, answered at once even while the load queues every request that decodes
        # (one that decodes waited minutes here, and its client's timeout then cancelled it).
        code, text, _, reason = _post(f"http://{srv.http}/v2/models/{MODEL}/generate",
                                      json.dumps({"text_input": "hi", "sampling_param_max_tokens": 1 << 30}).encode(),
                                      "application/json", timeout + 5)
    finally:
        for s in socks:
            s.close()
    secs = time.monotonic() - t0
    ok = code == 400 and "max_tokens" in text and secs <= 2 * timeout
    return {"name": OVERSIZED[3], "code": code, "error": "; ".join(replies)[:300], "seconds": round(secs, 3),
            "pass": ok, "finish_reason": reason}


def fault_kill(srv: Server, protocol: str, max_tokens: int, timeout: float) -> dict:
    proc = client_process(srv, protocol, max_tokens)
    streamed = wait_for_text(proc, timeout)
    proc.kill()
    proc.wait()
    # A client killed before it streamed may not have sent its request yet: its cancel is not certain.
    return {"protocol": protocol, "streamed_before_kill": streamed, "pass": True,
            "finished": {"cancelled": 1} if streamed else {}, "uncertain_cancelled": 0 if streamed else 1}


def fault_cancel(srv: Server, n: int, max_tokens: int, timeout: float, wait: float) -> dict:
    """A streaming request cancelled through the ``stop`` input, sent on the same gRPC stream with the same
    request id once text arrived. Two final responses must come back (the stop request's and the cancelled
    request's, both with finish_reason ``cancelled``), neither an error, within ``timeout``."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    rid = f"soak-cancel-{n}"
    c = grpcclient.InferenceServerClient(srv.grpc)
    responses: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: responses.put(error or result))
    finals, errors, t_stop, streamed = [], [], None, False

    def send_stop() -> float:
        stop = grpcclient.InferInput("stop", [1], "BOOL")
        stop.set_data_from_numpy(np.array([True]))
        c.async_stream_infer(MODEL, [client._grpc_input(grpcclient, "text_input", ""), stop],
                             request_id=rid, enable_empty_final_response=True)
        return time.monotonic()

    try:
        inputs = client.build_inputs(LONG_PROMPT, True, max_tokens=max_tokens, ignore_eos=True)
        c.async_stream_infer(MODEL, [client._grpc_input(grpcclient, k, v) for k, v in inputs.items()],
                             request_id=rid, enable_empty_final_response=True)
        t_sent = time.monotonic()
        deadline = time.monotonic() + timeout
        while len(finals) + len(errors) < 2 and time.monotonic() < deadline:
            try:
                item = responses.get(timeout=0.5)
            except queue.Empty:
                if t_stop is None and time.monotonic() - t_sent > wait:   # still queued: cancel it there
                    t_stop = send_stop()
                continue
            if isinstance(item, Exception):
                errors.append(str(item)[:300])
                if t_stop is None:
                    break
                continue
            resp = item.get_response()
            outputs = client._grpc_outputs(item) if resp.outputs else {}
            if t_stop is None and outputs.get("text_output"):
                streamed = True
                t_stop = send_stop()
            if resp.parameters["triton_final_response"].bool_param:
                finals.append((outputs.get("finish_reason"), time.monotonic()))
                if t_stop is None:
                    break         # finished before it could be cancelled: the fault did not happen
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
    reasons = sorted(str(r) for r, _ in finals)
    out = {"request_id": rid, "stop_sent": t_stop is not None, "streamed_before_stop": streamed, "finals": reasons,
           "errors": errors}
    if t_stop is not None and finals:
        out["seconds_to_final"] = round(max(t for _, t in finals) - t_stop, 3)
    if t_stop is None:
        out["finished"] = {str(finals[0][0]): 1} if finals else {}
    else:   # the cancelled request's final (the stop request's own final is not a model request)
        done = [r for r in reasons if r != "cancelled"]
        out["finished"] = {done[0]: 1} if done else {"cancelled": 1}
    out["pass"] = (t_stop is not None and not errors and len(finals) == 2 and "cancelled" in reasons
                   and "length" not in reasons and out.get("seconds_to_final", math.inf) <= timeout)
    return out


def burst(srv: Server, prompts: list[str], n: int, max_tokens: int, t_run: float, timeout: float) -> list[Outcome]:
    """``n`` greedy requests sent at once on one gRPC stream (non-streaming answers); with --server openai, ``n``
    non-streaming /v1/completions at once, one connection each."""
    if srv.only_openai:
        outs: list[Outcome | None] = [None] * n

        def one(i: int) -> None:
            outs[i] = run_request("openai_plain", srv, i % len(prompts), prompts[i % len(prompts)], "burst", t_run,
                                  timeout, max_tokens=max_tokens, temperature=0.0)
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30)
        return [o for o in outs if o is not None]
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(srv.grpc)
    responses: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: responses.put(error or result))
    outs = {}
    try:
        t0 = time.monotonic()
        for i in range(n):
            k = i % len(prompts)
            outs[str(i)] = Outcome("burst", "grpc", k, t0 - t_run)
            inputs = client.build_inputs(prompts[k], False, max_tokens=max_tokens, temperature=0.0)
            c.async_stream_infer(MODEL, [client._grpc_input(grpcclient, a, v) for a, v in inputs.items()],
                                 request_id=f"soak-burst-{i}", enable_empty_final_response=True)
        pending = set(outs)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            try:
                item = responses.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, Exception):      # the stream broke: every pending request is lost
                for rid in pending:
                    outs[rid].status, outs[rid].error = classify_error(str(item)), str(item)[:300]
                pending.clear()
                break
            resp = item.get_response()
            rid = resp.id.removeprefix("soak-burst-")
            o = outs[rid]
            if resp.outputs:
                got = client._grpc_outputs(item)
                o.text += got.get("text_output", "")
                o.finish_reason = got.get("finish_reason", o.finish_reason)
            if resp.parameters["triton_final_response"].bool_param:
                o.latency_s = o.ttft_s = time.monotonic() - t0
                o.status = "ok" if o.finish_reason and o.finish_reason != "cancelled" else "dropped"
                pending.discard(rid)
        for rid in pending:
            outs[rid].status, outs[rid].error = "timeout", f"no final response within {timeout:.0f} s"
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
    return list(outs.values())


# ---------------------------------------------------------------------------------------------------
# phases


class Sampler(threading.Thread):
    """RSS of every process of the server, the load average and the active requests, every ``every`` s."""

    def __init__(self, srv: Server, t_run: float, every: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.srv, self.t_run, self.every = srv, t_run, every
        self.samples: list[dict] = []
        self.stop_event = threading.Event()

    def sample(self) -> dict:
        by_proc: dict[str, int] = {}
        for pid, (comm, _) in self.srv.all_processes().items():
            by_proc[f"{comm}[{pid}]"] = rss_bytes(pid)
        try:
            active = metric_sum(self.srv.metrics(), "dflash_active_requests")
        except Exception:  # noqa: BLE001 - a sample without the metric is still an RSS sample
            active = None
        return {"t": round(time.monotonic() - self.t_run, 2), "rss_mb": round(sum(by_proc.values()) / 2**20, 1),
                "by_process_mb": {k: round(v / 2**20, 1) for k, v in by_proc.items()},
                "loadavg_1m": round(os.getloadavg()[0], 2), "active_requests": active}

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            self.samples.append(self.sample())


def log_line(args, text: str) -> None:
    if not args.quiet:
        print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def solo_phase(srv: Server, prompts: list[str], args, t_run: float) -> tuple[list[str], list[Outcome]]:
    outs = [run_request("openai_plain" if srv.only_openai else "http", srv, i, p, "solo", t_run, args.request_timeout, max_tokens=args.max_tokens,
                        temperature=0.0) for i, p in enumerate(prompts)]
    bad = [o for o in outs if o.status != "ok"]
    if bad:
        raise DFlashError("solo", f"reference request failed: {bad[0].error or bad[0].status}",
                          f"see {srv.log}")
    return [o.text for o in outs], outs


def load_phase(srv: Server, prompts: list[str], args, t_run: float, max_batch: int, long_tokens: int
               ) -> tuple[list[Outcome], list]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    t_end = time.monotonic() + args.duration

    def worker(w: int) -> None:
        n = 0
        while time.monotonic() < t_end:
            kind = args.kinds[(w + n) % len(args.kinds)]
            k = (w * 5 + n) % len(prompts)
            o = run_request(kind, srv, k, prompts[k], "load", t_run, args.request_timeout,
                            max_tokens=args.max_tokens, temperature=0.0)
            with lock:
                outcomes.append(o)
            n += 1
            if o.status != "ok":
                if srv.proc.poll() is not None:
                    return          # the server died: the checks report it, nothing more to learn here
                time.sleep(1.0)     # a failing server is not hammered by a tight loop

    threads = [threading.Thread(target=worker, args=(w,), name=f"soak-client-{w}", daemon=True)
               for w in range(args.streams)]
    for t in threads:
        t.start()
    faults: list[dict] = []
    burst_n = 8 * max_batch if args.burst is None else args.burst

    def run_burst() -> None:
        time.sleep(args.duration / 2)
        log_line(args, f"burst of {burst_n} requests at once")
        t = round(time.monotonic() - t_run, 1)
        got = burst(srv, prompts, burst_n, args.max_tokens, t_run, args.request_timeout)
        with lock:
            outcomes.extend(got)
            faults.append({"fault": "burst", "t": t, "requests": burst_n, "pass": True, "finished": {}})

    if burst_n:
        threads.append(threading.Thread(target=run_burst, name="soak-burst", daemon=True))
        threads[-1].start()
    next_fault = time.monotonic() + min(args.fault_every, args.duration / 4)
    i = 0
    # Faults in turn until the end, and each kind at least once even when they take longer than the load.
    while args.faults and (time.monotonic() < t_end or i < len(args.faults)):
        if time.monotonic() < next_fault:
            time.sleep(0.1)
            continue
        name = args.faults[i % len(args.faults)]
        log_line(args, f"fault {i}: {name} ({len(outcomes)} requests so far)")
        t = round(time.monotonic() - t_run, 1)
        try:
            f = run_fault(name, i, srv, args, long_tokens)
        except Exception as err:  # noqa: BLE001 - a fault that could not even be delivered fails its check
            f = {"pass": False, "error": f"{type(err).__name__}: {err}"[:300], "finished": {}}
        with lock:
            faults.append({"fault": name, "t": t, **f})
        i += 1
        next_fault = time.monotonic() + args.fault_every
        if srv.proc.poll() is not None:
            log_line(args, f"dflash-serve exited (code {srv.proc.returncode}): ending the load phase")
            break
    for t in threads:
        t.join(max(1.0, t_end + args.request_timeout + 30 - time.monotonic()))
    return outcomes, sorted(faults, key=lambda f: f["t"])


# ---- dflash-openai's faults (--server openai), and the non-streaming timeout of both servers (#25) ----------
OPENAI_OVERSIZED = ("prompt_4MB_openai", "body_5MiB_openai")
# A streaming /v1/completions client, the process a kill fault SIGKILLs once it printed some text.
_OPENAI_STREAMER = """import json, sys, urllib.request
url, model, prompt, n = sys.argv[1:5]
body = {"model": model, "prompt": prompt, "max_tokens": int(n), "stream": True, "ignore_eos": True, "temperature": 0}
req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=900) as r:
    for line in r:
        sys.stdout.write(line.decode()); sys.stdout.flush()
"""


def openai_malformed_cases() -> list[tuple[str, bytes]]:
    """(name, body) for /v1/completions; each must get an OpenAI-shaped 4xx."""
    def j(obj):
        return json.dumps({"model": "{model}", **obj}).encode()
    depth = 100_000
    return [
        ("openai_not_json", b"{this is not json"),
        ("openai_deeply_nested", b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"),
        ("openai_empty_body", b""),
        ("openai_non_utf8_body", b'{"model": "{model}", "prompt": "\xff\xfe"}'),
        ("openai_lone_surrogate", b'{"model": "{model}", "prompt": "a\\ud800b"}'),
        ("openai_wrong_type", j({"prompt": "hi", "max_tokens": "ten"})),
        ("openai_max_tokens_2^32+8", j({"prompt": "hi", "max_tokens": 2**32 + 8})),
        ("openai_temperature_1e30", j({"prompt": "hi", "temperature": 1e30})),
        ("openai_seed_2^64", j({"prompt": "hi", "seed": 2**64})),
        ("openai_unknown_field", j({"prompt": "hi", "max_token": 5})),
        ("openai_stop_list_5000", j({"prompt": "hi", "stop": [f"stop{i}" for i in range(5000)]})),
    ]


def fault_malformed_openai(srv: Server, timeout: float, skip: list[str] = ()) -> dict:
    url = f"http://{srv.openai.url}/v1/completions"
    cases = []
    for name, body in openai_malformed_cases():
        if name in skip:
            continue
        body = body.replace(b"{model}", srv.openai.model.encode())
        code, text, secs, _ = _post(url, body, "application/json", timeout + 5)
        ok = 400 <= code < 500 and bool(text) and secs <= timeout and srv.proc.poll() is None
        cases.append({"name": name, "code": code, "error": text, "seconds": round(secs, 3), "pass": ok,
                      "finish_reason": None})
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.ready(), "finished": {}}


def fault_oversized_openai(srv: Server, timeout: float, skip: list[str] = ()) -> dict:
    """A ~4 MB prompt under the 4 MiB body bound (refused by its size before tokenizing: 400 naming prompt), and
    a 5 MiB body (413), each within ``timeout``."""
    import http.client

    url = f"http://{srv.openai.url}/v1/completions"
    cases = []
    if OPENAI_OVERSIZED[0] not in skip:
        body = json.dumps({"model": srv.openai.model, "prompt": "word " * 800_000}).encode()
        code, text, secs, _ = _post(url, body, "application/json", timeout + 5)
        cases.append({"name": OPENAI_OVERSIZED[0], "code": code, "error": text, "seconds": round(secs, 3),
                      "pass": code == 400 and "prompt" in text and secs <= timeout, "finish_reason": None})
    if OPENAI_OVERSIZED[1] not in skip:
        # refused from its Content-Length before the body is read: the head alone is sent, the answer read
        host, port = srv.openai.url.rsplit(":", 1)
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout + 5)
        try:
            conn.putrequest("POST", "/v1/completions")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(5 << 20))
            conn.endheaders()
            resp = conn.getresponse()
            code, text = resp.status, resp.read()[:300].decode("utf-8", "replace")
        except OSError as err:
            code, text = 0, f"{type(err).__name__}: {err}"
        finally:
            conn.close()
        secs = time.monotonic() - t0
        cases.append({"name": OPENAI_OVERSIZED[1], "code": code, "error": text, "seconds": round(secs, 3),
                      "pass": code == 413 and secs <= timeout, "finish_reason": None})
    for c in cases:
        c["pass"] = c["pass"] and srv.proc.poll() is None
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.ready(), "finished": {}}


def fault_kill_openai(srv: Server, max_tokens: int, timeout: float) -> dict:
    cmd = [sys.executable, "-c", _OPENAI_STREAMER, f"http://{srv.openai.url}/v1/completions", srv.openai.model,
           LONG_PROMPT, str(max_tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    os.set_blocking(proc.stdout.fileno(), False)
    streamed = wait_for_text(proc, timeout)
    proc.kill()
    proc.wait()
    return {"streamed_before_kill": streamed, "pass": srv.proc.poll() is None and srv.ready(),
            "finished": {}, "uncertain_cancelled": 1}


def nonstream_timeouts(srv: Server, n: int, max_tokens: int, client_timeout: float = 0.5) -> list[str]:
    """``n`` non-streaming requests whose clients give up after ``client_timeout`` s (#25: their requests kept
    running on both servers); what each client saw."""
    if srv.only_openai:
        url = f"http://{srv.openai.url}/v1/completions"
        body = {"model": srv.openai.model, "prompt": LONG_PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
    else:
        url = f"http://{srv.http}/v2/models/{MODEL}/generate"
        body = {"text_input": LONG_PROMPT, "sampling_param_max_tokens": max_tokens, "sampling_param_ignore_eos": True}
    seen = []
    for _ in range(n):
        code, text, _, _ = _post(url, json.dumps(body).encode(), "application/json", client_timeout)
        seen.append(f"{code} {text[:80]}")
    return seen


def fault_timeout(srv: Server, max_tokens: int) -> dict:
    """Under load: 6 non-streaming clients time out; the server stays healthy (whether their slots come back is
    measured on the idle server, in the kill phase)."""
    seen = nonstream_timeouts(srv, 6, max_tokens)
    return {"clients": seen, "pass": srv.proc.poll() is None and srv.ready(), "finished": {},
            "uncertain_cancelled": 6}


def _raw(srv: Server, data: bytes, timeout: float, hostport: str = "", keep=None) -> tuple[int, bytes]:
    """(status or 0, body) of one raw request; ``keep``: a socket to send it on (kept open)."""
    import http.client
    import socket
    host, port = (hostport or srv.http).rsplit(":", 1)
    sock = keep or socket.create_connection((host, int(port)), timeout=timeout)
    try:
        sock.sendall(data)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        if keep is None:
            sock.close()


def _case(name: str, code: int, want, secs: float, timeout: float, text: bytes = b"") -> dict:
    ok = (code in want if isinstance(want, tuple) else code == want) and secs <= timeout
    return {"name": name, "code": code, "error": text[:200].decode("utf-8", "replace"), "seconds": round(secs, 3),
            "pass": ok}


def _request(path: str, body: bytes, *headers: str) -> bytes:
    extra = "".join(h + "\r\n" for h in headers)
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
            .encode() + body)


# A body that reaches the model and is refused there at once (max_tokens over max_seq_len, in INT32 so the guard
# passes it): proof that a request got through the guard whole, answered at once even while the load queues
# every request that decodes (one that decodes can wait longer than the fault's time bound, and its client's
# time-out then cancels it, a finish the clients' tally would not expect).
REACHES_MODEL = json.dumps({"text_input": "hi", "sampling_param_max_tokens": 1 << 30}).encode()


def _model_refused(code: int, text: bytes) -> bool:
    return code == 400 and b"max_tokens" in text


def fault_absolute(srv: Server, timeout: float) -> dict:
    """#37 finding 1: an absolute-form target was "not our endpoint" to the guard and generate to Triton,
    whose parser this body killed (four of them ended dflash-serve)."""
    gen = f"http://localhost/v2/models/{MODEL}/generate"
    cases = []
    for name, data, want in (
            ("absolute_deep", _request(gen, b"[" * 1_000_000 + b"]" * 1_000_000, "Inference-Header-Content-Length: 2"),
             400),
            ("absolute_not_json", _request(gen, b"not json", "Content-Type: application/json"), 400),
            ("escaped_path", _request(f"/v2/models/{MODEL.replace('_', '%5F')}/generate", b"{}"), 400),
            ("absolute_reaches_model", _request(gen, REACHES_MODEL, "Content-Type: application/json"), 400)):
        t0 = time.monotonic()
        code, text = _raw(srv, data, timeout + 5)
        cases.append(_case(name, code, want, time.monotonic() - t0, timeout, text))
    cases[-1]["pass"] = cases[-1]["pass"] and _model_refused(cases[-1]["code"], cases[-1]["error"].encode())
    ok = all(c["pass"] for c in cases) and srv.proc.poll() is None and srv.ready()
    return {"cases": cases, "pass": ok, "finished": {}}


def fault_metrics_port(srv: Server, timeout: float) -> dict:
    """#37 finding 3: a 5 MiB form POST to Triton's metrics port (unguarded) killed tritonserver."""
    metrics = srv.metrics_url.split("/")[2]
    big = b"a=" + b"x" * (5 << 20)
    t0 = time.monotonic()
    code, text = _raw(srv, _request("/metrics", big, "Content-Type: application/x-www-form-urlencoded"), timeout + 5,
                      metrics)
    cases = [_case("metrics_form_post", code, (405, 0), time.monotonic() - t0, timeout, text)]
    t0 = time.monotonic()
    code, text = _raw(srv, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout + 5, metrics)
    cases.append(_case("metrics_get", code, 200, time.monotonic() - t0, timeout))
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.proc.poll() is None and srv.ready(),
            "finished": {}}


def fault_desync(srv: Server, timeout: float) -> dict:
    """#37 finding 7: "Transfer-Encoding: CHUNKED" was decoded by the guard but not by Triton, which read the
    chunk bytes as the next request; odd chunk sizes closed the connection with no answer."""
    import socket
    body = REACHES_MODEL
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = f"POST /v2/models/{MODEL}/generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n".encode()
    host, port = srv.http.rsplit(":", 1)
    cases = []
    with socket.create_connection((host, int(port)), timeout=timeout + 5) as keep:
        for n in range(2):      # the second on the same connection: no chunk bytes left over upstream
            t0 = time.monotonic()
            code, text = _raw(srv, head + chunked, timeout + 5, keep=keep)
            cases.append(_case(f"chunked_upper_{n}", code, 400, time.monotonic() - t0, timeout, text))
            cases[-1]["pass"] = cases[-1]["pass"] and _model_refused(code, text)
    for size in ("0x10", "+10", "1_0"):
        t0 = time.monotonic()
        data = head.replace(b"CHUNKED", b"chunked") + f"{size}\r\n".encode() + b"x" * 16 + b"\r\n0\r\n\r\n"
        code, text = _raw(srv, data, timeout + 5)
        cases.append(_case(f"chunk_size_{size}", code, 400, time.monotonic() - t0, timeout, text))
    return {"cases": cases, "pass": all(c["pass"] for c in cases) and srv.ready(), "finished": {}}


def fault_idle_stream(srv: Server, timeout: float, n: int = 64) -> dict:
    """#37 finding 9: idle ModelStreamInfer streams held every call slot for as long as they stayed open."""
    import grpc
    stop = threading.Event()

    def never():
        stop.wait()
        return
        yield

    channel = grpc.insecure_channel(srv.grpc)
    calls = [channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(never()) for _ in range(n)]
    t0 = time.monotonic()
    try:                       # refused by the model at once (see REACHES_MODEL): it got a call slot
        got = client.collect(client.generate_grpc(srv.grpc, client.build_inputs("hi", max_tokens=1 << 30),
                                                  timeout=timeout))
        code, text = 200, f"answered: {got.get('finish_reason')}"
    except DFlashError as err:
        code, text = (400 if "max_tokens" in str(err) and "RESOURCE_EXHAUSTED" not in str(err) else 0), str(err)
    finally:
        stop.set()
        for call in calls:
            call.cancel()
        channel.close()
    case = _case("grpc_request_beside_idle_streams", code, 400, time.monotonic() - t0, timeout, text.encode())
    return {"cases": [case], "pass": case["pass"] and srv.ready(), "finished": {}}


def run_fault(name: str, i: int, srv: Server, args, long_tokens: int) -> dict:
    if name in ("absolute", "metrics_port", "desync", "idle_stream"):
        return {"absolute": fault_absolute, "metrics_port": fault_metrics_port, "desync": fault_desync,
                "idle_stream": fault_idle_stream}[name](srv, args.hostile_timeout)
    if name == "timeout":
        return fault_timeout(srv, long_tokens)
    if srv.only_openai:
        return {"kill": lambda: fault_kill_openai(srv, long_tokens, args.fault_wait),
                "malformed": lambda: fault_malformed_openai(srv, args.hostile_timeout, args.skip_cases),
                "oversized": lambda: fault_oversized_openai(srv, args.hostile_timeout, args.skip_cases)}[name]()
    if name == "kill":
        return fault_kill(srv, "grpc" if (i // len(args.faults)) % 2 == 0 else "http", long_tokens, args.fault_wait)
    if name == "cancel":
        return fault_cancel(srv, i, long_tokens, args.request_timeout, args.fault_wait)
    if name == "malformed":
        return fault_malformed(srv, args.hostile_timeout, args.skip_cases)
    return fault_oversized(srv, args.hostile_timeout, args.skip_cases)


def wait_idle(srv: Server, timeout: float = 15.0) -> float | None:
    """Seconds until dflash_active_requests reads 0 (None if it never does within ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if metric_sum(srv.metrics(), "dflash_active_requests") == 0:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.05)
    return None


def kill_phase(srv: Server, prompts: list[str], args, t_run: float, long_tokens: int) -> dict:
    """Clients killed mid-stream on the idle server, one at a time: seconds and engine steps until the slot is
    free (the cancelled count rose and no request is active), and the next request's latency."""
    def probe() -> Outcome:
        return run_request("openai_plain" if srv.only_openai else "http", srv, -1, prompts[0], "kills", t_run,
                           args.request_timeout, max_tokens=args.probe_tokens, temperature=0.0)

    def streamer(k: int) -> subprocess.Popen:
        if srv.only_openai:
            cmd = [sys.executable, "-c", _OPENAI_STREAMER, f"http://{srv.openai.url}/v1/completions",
                   srv.openai.model, LONG_PROMPT, str(long_tokens)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            os.set_blocking(proc.stdout.fileno(), False)
            return proc
        return client_process(srv, "grpc" if k % 2 == 0 else "http", long_tokens)

    baseline = [probe() for _ in range(5)]
    kills, after = [], []
    for k in range(args.kills):
        m0 = srv.metrics()
        cancelled0 = finish_counts(m0).get("cancelled", 0.0)
        proc = streamer(k)
        streamed = wait_for_text(proc, args.request_timeout)
        steps0 = metric_sum(srv.metrics(), "dflash_steps_total")
        t_kill = time.monotonic()
        proc.kill()
        proc.wait()
        freed_s, steps = None, None
        while time.monotonic() - t_kill < 10.0:
            m = srv.metrics()
            if (finish_counts(m).get("cancelled", 0.0) >= cancelled0 + 1
                    and metric_sum(m, "dflash_active_requests") == 0):
                freed_s = time.monotonic() - t_kill
                steps = metric_sum(m, "dflash_steps_total") - steps0
                break
            time.sleep(0.005)
        kills.append({"protocol": "openai" if srv.only_openai else "grpc" if k % 2 == 0 else "http",
                      "streamed_before_kill": streamed,
                      "freed_s": None if freed_s is None else round(freed_s, 4), "steps_after_kill": steps})
        after.append(probe())
    # #25: non-streaming clients that time out, more of them than max_batch_size: every slot free again
    # within 1 s of the last one giving up (they used to run to the end: the next request waited 11-12 s).
    gone = nonstream_timeouts(srv, 6, long_tokens)
    t_gone, nonstream_freed_s = time.monotonic(), None
    while time.monotonic() - t_gone < 10.0:
        if metric_sum(srv.metrics(), "dflash_active_requests") == 0:
            nonstream_freed_s = time.monotonic() - t_gone
            break
        time.sleep(0.02)
    after.append(probe())
    nonstream = {"clients": gone, "freed_s": None if nonstream_freed_s is None else round(nonstream_freed_s, 3),
                 "pass": nonstream_freed_s is not None and nonstream_freed_s <= 1.0}
    base = [o.latency_s for o in baseline]
    nxt = [o.latency_s for o in after]
    med = (lambda v: float(sorted(v)[len(v) // 2]) if v else None)
    texts = {o.text for o in baseline + after if o.status == "ok"}
    return {"kills": kills, "probe_answers_identical": len(texts) == 1, "baseline_latency_s": [round(x, 4) for x in base],
            "next_request_latency_s": [round(x, 4) for x in nxt],
            "next_over_baseline_median": (med(nxt) / med(base)) if nxt and base else None,
            "nonstream_timeouts": nonstream, "probes": baseline + after}


def sigterm_phase(srv: Server, args, t_run: float, max_tokens: int, max_batch: int) -> dict:
    """``--sigterm_streams`` long streams (gRPC and SSE in turn), SIGTERM to dflash-serve once each has text or
    is queued behind a full batch: when and how every client ended, and what the server left behind."""
    n = args.sigterm_streams
    outs: list[Outcome | None] = [None] * n
    first = threading.Semaphore(0)

    def one(i: int) -> None:
        kinds = ("openai", "openai_plain") if srv.only_openai else ("grpc", "sse")
        outs[i] = run_request(kinds[i % 2], srv, -1, LONG_PROMPT, "sigterm", t_run,
                              args.request_timeout, on_first=first.release, max_tokens=max_tokens, ignore_eos=True)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    # SIGTERM once a full batch is decoding (the rest wait for a slot: in flight too), or after 120 s.
    streaming, want = 0, min(n, max_batch)
    deadline = time.monotonic() + 120
    while streaming < want and time.monotonic() < deadline:
        streaming += first.acquire(timeout=0.5)
    tree = srv.tree()
    shm = shm_files(tree)
    in_flight = sum(o is None for o in outs)
    t_term = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    exit_at = None
    while time.monotonic() - t_term < max(60.0, args.sigterm_deadline + 30):
        if exit_at is None and srv.proc.poll() is not None:
            exit_at = time.monotonic()
        if exit_at is not None and not any(t.is_alive() for t in threads):
            break
        time.sleep(0.05)
    rc = srv.proc.poll()
    exit_s = None if exit_at is None else exit_at - t_term
    time.sleep(2.0)      # stubs reaped by tritonserver on its way out get a moment
    orphans = [f"{comm}[{pid}]" for pid, (comm, start) in tree.items() if alive(pid, start)]
    leftover = sorted(f for f in shm if os.path.exists(f))
    ends = []
    for o in outs:
        if o is None:
            ends.append({"status": "no_end", "seconds_after_sigterm": None})
            continue
        end_t = t_run + o.t0 + (o.latency_s or 0.0)
        ends.append({"kind": o.kind, "status": o.status, "finish_reason": o.finish_reason, "error": o.error[:200],
                     "streamed": o.ttft_s is not None, "seconds_after_sigterm": round(end_t - t_term, 3)})
    final_ok = [e["status"] in ("ok", "cancelled", "error") and e["seconds_after_sigterm"] is not None
                and e["seconds_after_sigterm"] <= args.sigterm_deadline for e in ends]
    if orphans or rc is None:
        srv.kill_tree()      # clean up after a failed check: only the processes this script started
    return {"streams": n, "streaming_at_sigterm": streaming, "in_flight_at_sigterm": in_flight,
            "clients": ends, "clients_with_final_in_time": sum(final_ok), "dflash_serve_exit_code": rc,
            "dflash_serve_exit_s": None if exit_s is None else round(exit_s, 2), "orphans": orphans, "shm_files": sorted(shm),
            "shm_left": leftover,
            "pass": all(final_ok) and rc == 0 and not orphans and not leftover}


# ---------------------------------------------------------------------------------------------------
# checks, report, plot


def safe_metrics(srv: Server) -> dict:
    try:
        return srv.metrics()
    except Exception:  # noqa: BLE001 - a dead server has no metrics; the checks say so
        return {}


def expected_finishes(outcomes: list[Outcome], faults: list[dict], kills: dict | None,
                      openai_only: bool = False) -> tuple[dict, int]:
    """What the clients saw finish in the server under test, by finish reason, and how many cancellations are
    uncertain (a client killed before it streamed may not have sent its request)."""
    seen: dict[str, int] = {}

    def add(reason: str, n: int = 1) -> None:
        seen[reason] = seen.get(reason, 0) + n

    for o in outcomes:
        if o.kind.startswith("openai") != openai_only:
            continue      # beside dflash-serve, dflash-openai has its own engine: not counted by Triton's metrics
        if o.phase != "solo" and o.finish_reason:
            add(o.finish_reason)
        elif o.phase != "solo" and o.status == "error":
            add("error")
    uncertain = 0
    for f in faults:
        for reason, n in f.get("finished", {}).items():
            add(reason, n)
        uncertain += f.get("uncertain_cancelled", 0)
    for k in (kills or {}).get("kills", []):
        if k["streamed_before_kill"]:
            add("cancelled")
        else:
            uncertain += 1
    # the idle non-streaming timeouts: cancelled, unless one finished before its client gave up
    uncertain += len((kills or {}).get("nonstream_timeouts", {}).get("clients", []))
    return seen, uncertain


def rss_growth(samples: list[dict], t_from: float, t_to: float, warmup: float) -> dict:
    """Total RSS after warm-up (median of the first 3 samples from ``t_from + warmup``) against the end
    (median of the last 3 samples before ``t_to``)."""
    window = [s["rss_mb"] for s in samples if t_from + warmup <= s["t"] <= t_to]
    if len(window) < 2:
        return {"baseline_mb": None, "end_mb": None, "growth": None, "samples": len(window)}
    med = (lambda v: sorted(v)[len(v) // 2])
    base, end = med(window[:3]), med(window[-3:])
    return {"baseline_mb": base, "end_mb": end, "growth": round(end / base - 1.0, 4), "samples": len(window),
            "max_mb": max(window)}


def evaluate(args, solo: list[str], outcomes: list[Outcome], faults: list[dict], kills: dict | None,
             idle: dict, finished_delta: dict, rss: dict, alive_before_sigterm: bool, sig: dict | None) -> dict:
    checks = {}
    answered = [o for o in outcomes if o.phase != "sigterm"]
    failed = [o for o in answered if o.status != "ok"]
    checks["every_request_answered"] = {
        "pass": not failed, "requests": len(answered), "failed": len(failed),
        "examples": [f"{o.phase}/{o.kind}: {o.status} {o.error[:160]}" for o in failed[:5]]}
    wrong = [o for o in answered if o.status == "ok" and o.prompt >= 0 and o.text != solo[o.prompt]]
    for o in wrong:
        o.status = "wrong"
    checks["greedy_equals_solo"] = {"pass": not wrong, "compared": sum(o.status in ("ok", "wrong") for o in answered),
                                    "wrong": len(wrong),
                                    "examples": [f"{o.kind} prompt {o.prompt}: {o.text[:60]!r} vs "
                                                 f"{solo[o.prompt][:60]!r}" for o in wrong[:3]]}
    bad_faults = [f for f in faults if not f["pass"]]
    checks["faults_handled"] = {"pass": not bad_faults, "faults": len(faults),
                                "failed": [{k: f[k] for k in f if k not in ("finished",)} for f in bad_faults[:5]]}
    checks["slots_free"] = {"pass": all(v is not None for v in idle.values()), "seconds_to_idle": idle}
    checks["rss_bounded"] = {"pass": rss["growth"] is not None and rss["growth"] < args.max_rss_growth,
                             "limit": args.max_rss_growth, **rss}
    seen, uncertain = expected_finishes(outcomes, faults, kills, getattr(args, "server", "triton") == "openai")
    got = {k: int(v) for k, v in finished_delta.items() if v}
    reasons = set(seen) | set(got)
    # A request whose client gave up (killed, timed out) ends cancelled, or, when its last token came before the
    # cancellation reached the engine (a GPU answers 32 tokens in tens of ms), as an ordinary finish the client never
    # saw: such finishes count against the cancellations expected.
    normal = ("length", "stop")
    late = {r: got.get(r, 0) - seen.get(r, 0) for r in normal}
    agree = all(got.get(r, 0) == seen.get(r, 0) for r in reasons if r != "cancelled" and r not in normal)
    agree &= all(v >= 0 for v in late.values())
    ended = got.get("cancelled", 0) + sum(late.values())
    agree &= seen.get("cancelled", 0) <= ended <= seen.get("cancelled", 0) + uncertain
    checks["metrics_agree"] = {"pass": bool(agree), "metrics": got, "clients": seen,
                               "uncertain_cancelled": uncertain,
                               "finished_after_give_up": {r: v for r, v in late.items() if v}}
    checks["server_alive"] = {"pass": alive_before_sigterm}
    if kills is not None:
        freed = [k["freed_s"] for k in kills["kills"]]
        checks["killed_clients_freed"] = {"pass": all(f is not None for f in freed) and kills["probe_answers_identical"]
                                          and kills["nonstream_timeouts"]["pass"],
                                          "probe_answers_identical": kills["probe_answers_identical"],
                                          "nonstream_timeouts_freed_s": kills["nonstream_timeouts"]["freed_s"],
                                          "kills": len(freed),
                                          "not_freed_in_10s": sum(f is None for f in freed)}
    if sig is not None:
        checks["sigterm"] = {"pass": sig["pass"], **{k: sig[k] for k in (
            "clients_with_final_in_time", "streams", "dflash_serve_exit_code", "orphans", "shm_left")}}
    return checks


def goals(args, checks: dict, kills: dict | None, sig: dict | None) -> dict:
    """The issue's goals, stated as measured (met or not), beside the pass/fail checks."""
    out = {"failed_or_wrong_requests": checks["every_request_answered"]["failed"],
           "leaked_slots": 0 if checks["slots_free"]["pass"] else "active requests did not return to 0",
           "rss_growth": checks["rss_bounded"]["growth"]}
    if kills is not None:
        steps = [k["steps_after_kill"] for k in kills["kills"] if k["steps_after_kill"] is not None]
        freed = [k["freed_s"] for k in kills["kills"] if k["freed_s"] is not None]
        out.update(kills=len(kills["kills"]), kill_steps_until_free_max=max(steps) if steps else None,
                   kill_seconds_until_free=distribution(freed) if freed else None,
                   next_request_latency_over_idle_baseline=kills["next_over_baseline_median"],
                   nonstream_timeouts_freed_s=kills["nonstream_timeouts"]["freed_s"])
    if sig is not None:
        after = [c["seconds_after_sigterm"] for c in sig["clients"] if c["seconds_after_sigterm"] is not None]
        out.update(sigterm_streams=sig["streams"], sigterm_clients_with_final_in_time=sig["clients_with_final_in_time"],
                   sigterm_last_client_end_s=max(after) if after else None, sigterm_orphans=len(sig["orphans"]),
                   sigterm_shm_left=len(sig["shm_left"]))
    return out


def latency_table(outcomes: list[Outcome]) -> dict:
    table = {}
    for kind in sorted({o.kind for o in outcomes}):
        ok = [o for o in outcomes if o.kind == kind and o.status == "ok"]
        table[kind] = {"n": len(ok), "latency_s": distribution([o.latency_s for o in ok]),
                       "ttft_s": distribution([o.ttft_s for o in ok])}
    return table


def plot(path: Path, outcomes: list[Outcome], faults: list[dict], samples: list[dict], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 9), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 2, 1.4]})
    for kind in sorted({o.kind for o in outcomes}):
        pts = [(o.t0, o.latency_s) for o in outcomes if o.kind == kind and o.latency_s is not None
               and o.status == "ok"]
        if pts:
            ax1.scatter(*zip(*pts), s=6, alpha=0.6, label=f"{kind} ({len(pts)})")
    bad = [(o.t0, o.latency_s or 0.0) for o in outcomes if o.status not in ("ok",)]
    if bad:
        ax1.scatter(*zip(*bad), s=30, marker="x", color="red", label=f"failed/wrong ({len(bad)})")
    colors = {"kill": "tab:red", "cancel": "tab:purple", "malformed": "tab:brown", "oversized": "tab:gray",
              "burst": "black"}
    for f in faults:
        for ax in (ax1, ax2):
            ax.axvline(f["t"], color=colors.get(f["fault"], "k"), lw=0.6, alpha=0.5)
    ax1.set_ylabel("request latency (s)")
    ax1.set_title(title, fontsize=10)
    ax1.legend(fontsize=8, loc="upper left", ncol=4)
    ax1.grid(alpha=0.3)
    t = [s["t"] for s in samples]
    ax2.plot(t, [s["rss_mb"] for s in samples], color="k", lw=1.5, label="all server processes")
    names = sorted({k for s in samples for k in s["by_process_mb"]})
    for name in names:
        ax2.plot(t, [s["by_process_mb"].get(name, float("nan")) for s in samples], lw=0.8, label=name)
    ax2.set_ylabel("RSS (MiB)")
    ax2.legend(fontsize=7, loc="center right")
    ax2.grid(alpha=0.3)
    ax3.plot(t, [s["active_requests"] if s["active_requests"] is not None else float("nan") for s in samples],
             color="tab:blue", lw=1, label="dflash_active_requests")
    ax3.set_ylabel("active requests")
    ax3b = ax3.twinx()
    ax3b.plot(t, [s["loadavg_1m"] for s in samples], color="tab:orange", lw=1, label="load average (1 min)")
    ax3b.set_ylabel("load avg", color="tab:orange")
    ax3.set_xlabel("seconds since start (vertical lines: faults; red kill, purple cancel, brown malformed, "
                   "gray oversized, black burst)", fontsize=8)
    ax3.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def keep_logs(work: Path, out: Path, max_bytes: int = 8 << 20) -> dict[str, str]:
    """The servers' logs (the last ``max_bytes`` of each) beside the report as ``<report stem>.<log name>``:
    the run's temporary folder is not where anyone looks once a run went wrong. {log name: kept path}."""
    kept = {}
    for log in sorted(work.glob("*.log")):
        dst = out.with_name(f"{out.stem}.{log.name}")
        with open(log, "rb") as src:
            src.seek(max(0, log.stat().st_size - max_bytes))
            dst.write_bytes(src.read())
        kept[log.name] = str(dst)
    return kept


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C or SIGTERM (also when started in the background, where SIGINT is ignored) unwinds through the
    # finally below, which stops the servers this script started.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    import tempfile

    deployment = args.__dict__.pop("deployment")
    max_batch = int(deployment.runtime["max_batch_size"])
    max_seq_len = int(deployment.runtime["max_seq_len"])
    long_tokens = min(1000, max_seq_len - 64)   # LONG_PROMPT is ~10 tokens     # the killed / cancelled / SIGTERMed streams run long
    prompts = PROMPTS[:args.prompts]
    args.warmup = args.duration * 0.1 if args.warmup is None else args.warmup
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    load_start = os.getloadavg()
    t_run = time.monotonic()
    if args.server == "openai":
        log_line(args, f"starting dflash-openai {args.engine} (log: {work / 'dflash-openai.log'})")
        srv = Server.start_openai(args.engine, work / "dflash-openai.log", args.ready_timeout)
        log_line(args, f"ready in {srv.ready_s:.1f} s: http://{srv.http}/v1")
    else:
        log_line(args, f"starting dflash-serve {args.engine} (log: {work / 'dflash-serve.log'})")
        srv = Server.start(args.engine, work / "dflash-serve.log", args.ready_timeout)
        log_line(args, f"ready in {srv.ready_s:.1f} s: HTTP {srv.http}, gRPC {srv.grpc}")
    if args.openai and args.server != "openai":
        try:
            srv.openai = OpenAIServer.start(args.engine, work / "dflash-openai.log", args.ready_timeout)
        except BaseException:
            srv.kill_tree()
            raise
        log_line(args, f"dflash-openai ready: http://{srv.openai.url}/v1 (model {srv.openai.model})")
    sampler = Sampler(srv, t_run, args.sample_every)
    faults, outcomes, kills, sig = [], [], None, None
    phases = {}
    try:
        sampler.samples.append(sampler.sample())
        sampler.start()
        solo, solo_outs = solo_phase(srv, prompts, args, t_run)
        outcomes += solo_outs
        time.sleep(1.0)    # the model publishes its counters every cancellation_check_period_ms
        m_before = safe_metrics(srv)
        phases["load"] = [round(time.monotonic() - t_run, 2)]
        log_line(args, f"load: {args.streams} streams x {args.duration:.0f} s, kinds {args.kinds}, "
                       f"faults {args.faults or 'none'}")
        load_outs, faults = load_phase(srv, prompts, args, t_run, max_batch, long_tokens)
        outcomes += load_outs
        phases["load"].append(round(time.monotonic() - t_run, 2))
        idle = {"after_load": wait_idle(srv)}
        if args.kills and srv.proc.poll() is None:
            log_line(args, f"kills: {args.kills} clients killed mid-stream, one at a time")
            phases["kills"] = [round(time.monotonic() - t_run, 2)]
            kills = kill_phase(srv, prompts, args, t_run, long_tokens)
            outcomes += kills.pop("probes")
            phases["kills"].append(round(time.monotonic() - t_run, 2))
            idle["after_kills"] = wait_idle(srv)
        time.sleep(1.0)    # the model publishes its counters every cancellation_check_period_ms
        m_after = safe_metrics(srv)
        before, after = finish_counts(m_before), finish_counts(m_after)
        finished_delta = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in set(before) | set(after)}
        alive_before_sigterm = srv.proc.poll() is None and srv.ready()
        sampler.stop_event.set()
        sampler.join(10)
        sampler.samples.append(sampler.sample())
        if args.sigterm and srv.proc.poll() is None:
            log_line(args, f"sigterm: {args.sigterm_streams} streams in flight, then SIGTERM")
            phases["sigterm"] = [round(time.monotonic() - t_run, 2)]
            sig = sigterm_phase(srv, args, t_run, long_tokens, max_batch)
            phases["sigterm"].append(round(time.monotonic() - t_run, 2))
    finally:
        sampler.stop_event.set()
        if srv.openai is not None:
            srv.openai.stop()
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGTERM)
            try:
                srv.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                srv.kill_tree()
        for pid, (_, start) in srv.tree().items():   # anything of ours still running after a failure
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        kept = keep_logs(work, args.out)   # also when a time limit or Ctrl-C ended the run: what the servers said

    rss = rss_growth(sampler.samples, phases["load"][0], phases.get("kills", phases["load"])[1], args.warmup)
    checks = evaluate(args, solo, outcomes, faults, kills, idle, finished_delta, rss, alive_before_sigterm, sig)
    passed = all(c["pass"] for c in checks.values())
    load_outs = [o for o in outcomes if o.phase in ("load", "burst")]
    load_s = phases["load"][1] - phases["load"][0]
    summary = {
        "pass": passed, "requests": len(load_outs), "requests_per_s": round(len(load_outs) / load_s, 3),
        "failed_checks": [k for k, c in checks.items() if not c["pass"]],
        "goals": goals(args, checks, kills, sig),
        "latency_s_p50_p99": {k: [v["latency_s"]["p50"], v["latency_s"]["p99"]]
                              for k, v in latency_table(load_outs).items()},
        "loadavg_1m_mean": round(sum(s["loadavg_1m"] for s in sampler.samples) / len(sampler.samples), 2),
    }
    report = {
        "benchmark": "soak",
        "provenance": provenance.record(checkpoints={"target": deployment.target_dir,
                                                     "drafter": deployment.drafter_dir}),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "deployment": {"backend": deployment.backend, "runtime": deployment.runtime,
                       "target": deployment.target.get("source"), "drafter": deployment.drafter.get("source")},
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "server": {"ready_s": round(srv.ready_s, 2), "log": kept.get(srv.log.name, str(srv.log)), "logs": kept},
        "phases_s": phases,
        "summary": summary,
        "checks": checks,
        "counts": {phase: {s: sum(o.phase == phase and o.status == s for o in outcomes)
                           for s in sorted({o.status for o in outcomes if o.phase == phase})}
                   for phase in ("solo", "load", "burst", "kills")},
        "latency": latency_table(load_outs),
        "faults": faults,
        "kills": kills,
        "sigterm": sig,
        "rss_samples": sampler.samples,
        "solo_answers": solo,
        "requests": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(o).items()
                      if k != "text" and (k != "error" or v)} for o in outcomes],
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    png = args.out.with_suffix(".png")
    plot(png, [o for o in outcomes if o.phase != "solo"], faults, sampler.samples,
         f"soak: {args.engine.name}, {args.streams} streams x {args.duration:.0f} s "
         f"({len(load_outs)} requests, {'PASS' if passed else 'FAIL: ' + ', '.join(summary['failed_checks'])})")
    for name, c in checks.items():
        detail = {k: v for k, v in c.items() if k != "pass"}
        print(f"{'PASS' if c['pass'] else 'FAIL'} {name}: {json.dumps(detail, default=str)[:300]}")
    print(f"soak: {'PASS' if passed else 'FAIL'} -> {args.out}, {png}")
    return 0 if passed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DFlashError as err:
        print(f"soak: {err}", file=sys.stderr)
        sys.exit(2)
