# SPDX-License-Identifier: Apache-2.0
"""Does serving starve the engine's loop, and what does the frontend cost per token? Engine steps/s with N
streaming HTTP clients vs with none (CPU), with the engine in the server's process or in its own.

    python -m trtllm_dflash.bench.serving_overhead --engine thread --streams 64 --seconds 8 \
        --out benchmarks/results/serving_overhead_cpu_thread.json      # before: scheduler thread in the server
    python -m trtllm_dflash.bench.serving_overhead --engine process --streams 64 --seconds 8 \
        --out benchmarks/results/serving_overhead_cpu_process.json     # after: engine_core.py's process
    python -m trtllm_dflash.bench.serving_overhead --server triton --streams 64 --seconds 8 --busy_ms 1 \
        --wait_ms 1 --out benchmarks/results/serving_overhead_cpu_triton_after_64.json   # dflash-serve, gRPC

The engine is a stand-in with the real engine's threading contract (tests/serving/fakes.py's FakeEngine) whose
step holds the GIL for ``--busy_ms`` (the host work of a GPU step: Python, kernel launches) and then waits
``--wait_ms`` with the GIL released (the device), so the loop competes for the interpreter exactly as the real
engine thread does. The runtime and the serving layer are the real ones: TorchRuntime (``--engine thread``) or
the engine process behind EngineClient (``--engine process``), dflash-openai's app under uvicorn in this
process, the records, incremental detokenization with SmolLM2's real tokenizer. The clients run in another
process (as real clients do) and read server-sent events as fast as they come.

  alone   N requests submitted to the runtime directly, nobody reading: the engine's own rate
  served  N streaming /v1/completions through dflash-openai: every step's tokens decoded and sent as SSE
The ratio served/alone is what serving costs the engine loop (1.0 = nothing); ``sent_over_alone`` is what the
clients got over what the engine makes alone (a frontend that cannot keep up lags behind an engine that runs
free). On a busy machine the rates move with the neighbours, so CPU time is recorded too:
``frontend_cpu_us_per_token`` is the serving work per token sent (thread: this process's CPU served minus alone; process: this process's CPU served, all of it
frontend work, the receiving of the engine's messages included), and ``engine_cpu_ms_per_step_*`` the engine
process's own (process only). The stand-in commits 2 tokens per request and step.

``--server triton``: the served phase goes through the real Triton server instead: dflash-serve (its HTTP and
gRPC guards included) on a repository filled by repo.fill_triton, whose model.py is the real one but for its
runtime: the same stand-in in its own engine process (EngineClient.spawn with --engine_factory), as the real
runtime runs the engine. The clients are N streaming gRPC requests (tritonclient, one bidirectional stream
each, as independent users have) spread over ``--client_procs`` processes, which count the responses and the
text they get. Tokens received are counted from that text (the stand-in repeats the prompt's tokens, so
tokens = characters x tokens/characters of the prompt). CPU: ``triton_cpu_us_per_token`` is tritonserver and
its python-backend stub (the model's sender and the engine's frontend side run there), ``guard_cpu_us_per_token``
dflash-serve's own process (the gRPC relay every response crosses), ``frontend_cpu_us_per_token`` both, all
per token received; the engine process and the clients are counted apart. ``other_cpu_util_*``: cores kept busy
by processes not the bench's during a phase (0 on a quiet machine; the rates of a run with much of it are not
comparable with another's).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


from trtllm_dflash.testing import FakeEngine
from trtllm_dflash.provenance import record as provenance
from trtllm_dflash.serving import engine_core, procfs
from trtllm_dflash.serving.record import ServedRequest
from trtllm_dflash.serving.runtimes import TorchRuntime

ENGINE_FACTORY = "trtllm_dflash.bench.serving_overhead:engine_from_env"
SOURCE_ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
CLIENT = r"""
import asyncio, json, sys
import httpx
url, n = sys.argv[1], int(sys.argv[2])
async def one(client, i):
    body = {"model": "m", "prompt": %r, "max_tokens": 1 << 30, "stream": True, "ignore_eos": True}
    async with client.stream("POST", url, json=body) as r:
        async for _ in r.aiter_lines():
            pass
async def main():
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=n + 4)) as c:
        await asyncio.gather(*(one(c, i) for i in range(n)))
asyncio.run(main())
""" % PROMPT

# One process of the --server triton clients: n streaming requests, each on its own gRPC stream (its own
# tritonclient client). On stdin "snap" it prints what it has received so far (one JSON line), on "quit" the
# same, then it closes its streams and exits. Each stream's callback runs on that stream's thread and counts
# into its own slot, so the counting takes no lock. The text is read off the raw output (BYTES: a 4-byte length,
# then the bytes) rather than through numpy, to keep the client cheap.
GRPC_CLIENT = r"""
import json, sys, time
import tritonclient.grpc as grpcclient
from trtllm_dflash.serving import client as dflash_client
url, n, prompt, ignore_eos = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
slots = [[0, 0, 0] for _ in range(n)]       # responses, characters, errors
errors = []
def callback(slot, result, error):
    if error is not None:
        slot[2] += 1
        if len(errors) < 5:
            errors.append(str(error)[:300])
        return
    slot[0] += 1
    response = result.get_response()
    for out, raw in zip(response.outputs, response.raw_output_contents):
        if out.name == "text_output":
            slot[1] += len(raw[4:].decode("utf-8", "replace"))
sampling = {"max_tokens": 1 << 30}
if ignore_eos:
    sampling["ignore_eos"] = True
clients = []
for i in range(n):
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error, slot=slots[i]: callback(slot, result, error))
    inputs = dflash_client.build_inputs(prompt, streaming=True, **sampling)
    c.async_stream_infer("tensorrt_llm", [dflash_client._grpc_input(grpcclient, k, v) for k, v in inputs.items()],
                         request_id=str(i))
    clients.append(c)
def snap():
    totals = [sum(s[j] for s in slots) for j in range(3)]
    print(json.dumps({"t": time.monotonic(), "cpu_s": time.process_time(), "responses": totals[0],
                      "chars": totals[1], "errors": totals[2], "started": sum(1 for s in slots if s[0]),
                      "error_messages": errors}), flush=True)
for line in sys.stdin:
    snap()
    if line.strip() == "quit":
        break
for c in clients:
    c.stop_stream(cancel_requests=True)
    c.close()
"""


class GilEngine(FakeEngine):
    """FakeEngine whose step holds the GIL for busy_s, then releases it for wait_s."""

    def __init__(self, busy_s: float, wait_s: float, **kw):
        super().__init__(step_s=wait_s, **kw)
        self.busy_s = busy_s

    def step(self):
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return super().step()


def engine_from_env() -> GilEngine:
    """The stand-in for ``--engine process``: engine_core.py builds it in the engine process (--engine_factory)."""
    env = os.environ
    return GilEngine(float(env["DFLASH_BENCH_BUSY_MS"]) / 1e3, float(env["DFLASH_BENCH_WAIT_MS"]) / 1e3,
                     max_batch_size=int(env["DFLASH_BENCH_STREAMS"]), max_seq_len=1 << 40)


def load_tokenizer(name: str):
    """'smollm2': SmolLM2's real tokenizer (from the package); 'chars': one token per character."""
    if name == "smollm2":
        from transformers import AutoTokenizer

        from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
        return AutoTokenizer.from_pretrained(str(smollm2_target_dir()))
    from trtllm_dflash.testing import CharTokenizer
    return CharTokenizer()


def engine_env(args) -> dict[str, str]:
    """What engine_from_env reads, for the engine process's environment."""
    return {"DFLASH_BENCH_BUSY_MS": str(args.busy_ms), "DFLASH_BENCH_WAIT_MS": str(args.wait_ms),
            "DFLASH_BENCH_STREAMS": str(args.streams)}


def _process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat): with our processes' own, what else ran."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Runtime:
    """The runtime under test and how to read its engine: in this process (thread) or in its own (process)."""

    def __init__(self, args):
        tokenizer = load_tokenizer(args.tokenizer)
        self.tokenizer, self.mode = tokenizer, args.engine
        if args.engine == "thread":
            self.engine = GilEngine(args.busy_ms / 1e3, args.wait_ms / 1e3, max_batch_size=args.streams,
                                    max_seq_len=1 << 40)
            self.engine.tokenizer = tokenizer
            self.backend = TorchRuntime(self.engine)
            self.engine_pid = None
        else:
            from trtllm_dflash.serving.engine_client import EngineClient

            env = {**os.environ, **engine_env(args)}
            self.backend = EngineClient.spawn(Path.cwd(), engine_factory=ENGINE_FACTORY, tokenizer=tokenizer, env=env)
            self.engine_pid = self.backend.proc.pid

    def steps(self) -> int:
        return self.engine.counters["steps"] if self.engine_pid is None else self.backend.metrics()["steps"]

    def active(self) -> int:
        return len(self.engine.active) if self.engine_pid is None else self.backend.metrics()["running"]

    def engine_cpu_s(self) -> float:
        return 0.0 if self.engine_pid is None else _process_cpu_s(self.engine_pid)


def measure(rt: Runtime, seconds: float, sent=lambda: 0, other_pids=()) -> dict:
    """Engine steps/s, tokens sent to the clients, and CPU time of this process and of the engine process. The
    CPU time depends little on what else runs on the machine, unlike the rates; ``other_cpu_util`` says how
    much else ran (cores busy with processes not ours; ``other_pids``: ours besides this one and the engine)."""
    s0, n0, t0, c0, e0 = rt.steps(), sent(), time.perf_counter(), time.process_time(), rt.engine_cpu_s()
    m0, o0 = _machine_busy_s(), _cpu_s(list(other_pids))
    time.sleep(seconds)
    c1, e1, steps, n1, t1 = time.process_time(), rt.engine_cpu_s(), rt.steps() - s0, sent(), time.perf_counter()
    m1, o1 = _machine_busy_s(), _cpu_s(list(other_pids))
    own = (c1 - c0) + (e1 - e0) + (o1 - o0)
    return {"steps_per_s": steps / (t1 - t0), "cpu_ms_per_step": 1e3 * (c1 - c0) / max(steps, 1),
            "engine_cpu_ms_per_step": 1e3 * (e1 - e0) / max(steps, 1), "cpu_s": c1 - c0, "steps": steps,
            "tokens_sent": n1 - n0, "tokens_sent_per_s": (n1 - n0) / (t1 - t0),
            "other_cpu_util": max(0.0, (m1 - m0) - own) / (t1 - t0)}


def wait_active(rt: Runtime, n: int, timeout: float = 60) -> None:
    end = time.time() + timeout
    while rt.active() < n:
        if time.time() > end:
            raise SystemExit(f"error: only {rt.active()} of {n} requests became active")
        time.sleep(0.05)


# ---- --server triton ------------------------------------------------------------------------------

MODEL_CALL = 'triton_model.DFlashModel(pb_utils, HERE, json.loads(args["model_config"]))'
MODEL_IMPORT = "from trtllm_dflash.serving import triton_model\n"


def bench_model_py(real: str, deployment: Path, args) -> str:
    """The real model.py over the stand-in: its runtime is GilEngine in an engine process of its own, started as
    runtimes.load_runtime starts the deployment's (supervisor included). It imports this tree's code: the
    python-backend stub runs isolated (PYTHONPATH does not reach it), and an editable install may name another
    checkout, which would serve other code than the one measured."""
    if real.count(MODEL_CALL) != 1 or real.count(MODEL_IMPORT) != 1:
        raise SystemExit("error: triton_model_repo/tensorrt_llm/1/model.py no longer has exactly one "
                         f"{MODEL_CALL!r} and one {MODEL_IMPORT.strip()!r}: update bench_model_py to match it")
    env = {**engine_env(args), "PYTHONPATH": str(SOURCE_ROOT)}
    imports = (f"import os\nimport sys\nsys.path.insert(0, {str(SOURCE_ROOT)!r})\n" + MODEL_IMPORT
               + f"assert triton_model.__file__.startswith({str(SOURCE_ROOT) + os.sep!r}), triton_model.__file__\n"
               "from trtllm_dflash.bench.serving_overhead import load_tokenizer\n"
               "from trtllm_dflash.serving.engine_client import EngineClient\n")
    runtime = (f"EngineClient.spawn({str(deployment)!r}, engine_factory={ENGINE_FACTORY!r}, "
               f"tokenizer=load_tokenizer({args.tokenizer!r}), env={{**os.environ, **{env!r}}}, "
               "supervisor=int(os.environ['DFLASH_SERVE_PID']))")
    return real.replace(MODEL_IMPORT, imports).replace(MODEL_CALL, f"{MODEL_CALL[:-1]}, runtime={runtime})")


def bench_repo(work: Path, args) -> Path:
    """A deployment that is a manifest only (the model reads it; the stand-in needs no weights) and its filled
    repository, with bench_model_py's model.py."""
    from trtllm_dflash.deployment import FORMAT_VERSION
    from trtllm_dflash.serving.repo import MODEL_NAME, fill_triton

    deployment = work / "deployment"
    deployment.mkdir()
    manifest = {"format_version": FORMAT_VERSION, "backend": "torch", "tp_size": 1,
                "runtime": {"max_batch_size": args.streams, "max_seq_len": 1 << 40}}
    (deployment / "manifest.json").write_text(json.dumps(manifest, indent=1))
    repo = fill_triton(deployment, manifest, repo_dir=work / "triton")
    model_py = repo / MODEL_NAME / "1" / "model.py"
    model_py.write_text(bench_model_py(model_py.read_text(), deployment, args))
    return repo


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += _process_cpu_s(pid)
        except OSError:        # gone: a restarted stub, say (then the tree changed and the numbers say so)
            pass
    return total


def _git_blob(path: Path) -> str:
    """git's object id of the file's content (``git hash-object``): comparable with ``git rev-parse C:path``."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class TritonServed:
    """dflash-serve on bench_repo's repository, and the client processes."""

    def __init__(self, args, work: Path):
        from trtllm_dflash.serving.launch import free_loopback_port

        self.args = args
        self.repo = bench_repo(work, args)
        self.grpc, self.metrics_url = free_loopback_port(), None
        http, metrics = free_loopback_port(), free_loopback_port()
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        self.log = work / "dflash-serve.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trtllm_dflash.serving.server", str(self.repo), "--http_port", str(http),
                 "--grpc_port", str(self.grpc), "--metrics_port", str(metrics), "--exit_timeout_secs", "5",
                 "--grpc_guard", args.grpc_guard], stdout=fh, stderr=subprocess.STDOUT)
        self.clients: list[subprocess.Popen] = []
        self.seen: dict[int, tuple[str, int]] = {}   # pid -> (command line, start): every process of the server's
        #                                                 tree, to check none outlives it

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def wait_ready(self, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while "dflash-serve: ready" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"error: dflash-serve did not get ready:\n{self.log_tail()}")
            time.sleep(0.1)

    def metric(self, name: str) -> float:
        """One metric of dflash-serve's /metrics, summed over its labels."""
        from trtllm_dflash.serving.metrics import parse

        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return sum(v for (n, _), v in parse(text).items() if n == name)

    def pids(self) -> dict[str, list[int]]:
        """guard: dflash-serve itself; triton: tritonserver and its stubs; engine: the engine process."""
        tree = procfs.descendants(self.proc.pid)
        for pid, (_, start) in tree.items():
            self.seen.setdefault(pid, (_cmdline(pid), start))
        tree.pop(self.proc.pid, None)
        engine = [pid for pid in tree if "trtllm_dflash.serving.engine_core" in self.seen[pid][0]]
        return {"guard": [self.proc.pid], "triton": [pid for pid in tree if pid not in engine], "engine": engine}

    def start_clients(self, ignore_eos: bool) -> None:
        n, procs = self.args.streams, self.args.client_procs
        shares = [n // procs + (i < n % procs) for i in range(procs)]
        self.clients = [subprocess.Popen([sys.executable, "-c", GRPC_CLIENT, f"127.0.0.1:{self.grpc}", str(k),
                                          PROMPT, "1" if ignore_eos else "0"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                        for k in shares if k]

    def snap(self, command: str = "snap") -> list[dict]:
        for c in self.clients:
            c.stdin.write(command + "\n")
            c.stdin.flush()
        out = []
        for c in self.clients:
            line = c.stdout.readline()
            if not line:
                raise SystemExit(f"error: a client process exited (code {c.wait()})")
            out.append(json.loads(line))
        return out

    def wait_active(self, n: int, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while self.metric("dflash_active_requests") < n:
            if time.monotonic() > end or self.proc.poll() is not None:
                snaps = self.snap()
                raise SystemExit(f"error: only {self.metric('dflash_active_requests'):g} of {n} requests became "
                                 f"active; clients: {snaps}\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> list[str]:
        """Clients first (their streams close: the model cancels their requests), then dflash-serve with SIGTERM
        as an operator stops it. What of the server's tree still runs 15 s later is listed (and killed)."""
        if self.clients:
            try:
                self.snap("quit")
            except (SystemExit, OSError, ValueError):
                pass
        for c in self.clients:
            try:
                c.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        if self.proc.poll() is None:
            self.pids()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        end = time.monotonic() + 15
        while any(procfs.alive(pid, start) for pid, (_, start) in self.seen.items()) and time.monotonic() < end:
            time.sleep(0.2)
        left = [(pid, cmd) for pid, (cmd, start) in self.seen.items() if procfs.alive(pid, start)]
        for pid, _ in left:
            os.kill(pid, signal.SIGKILL)
        return [f"{pid} {cmd[:120]}" for pid, cmd in left]


def measure_triton(srv: TritonServed, seconds: float) -> dict:
    """Over ``seconds``: what the clients received, the engine's steps, the CPU time of each part."""
    def sample():
        pids = srv.pids()
        return {"t": time.perf_counter(), "clients": srv.snap(), "steps": srv.metric("dflash_steps_total"),
                **{k: _cpu_s(v) for k, v in pids.items()}, "pids": pids, "machine": _machine_busy_s(),
                "self": time.process_time()}
    a = sample()
    time.sleep(seconds)
    b = sample()
    wall = b["t"] - a["t"]
    clients = [{"responses": y["responses"] - x["responses"], "chars": y["chars"] - x["chars"],
                "errors": y["errors"], "started": y["started"], "cpu_s": y["cpu_s"] - x["cpu_s"],
                "cpu_util": (y["cpu_s"] - x["cpu_s"]) / max(y["t"] - x["t"], 1e-9),
                "error_messages": y["error_messages"]}
               for x, y in zip(a["clients"], b["clients"])]
    own = sum(b[k] - a[k] for k in ("guard", "triton", "engine", "self")) + sum(c["cpu_s"] for c in clients)
    return {"wall_s": wall, "steps": b["steps"] - a["steps"], "clients": clients,
            "other_cpu_util": max(0.0, b["machine"] - a["machine"] - own) / wall,
            **{f"{k}_cpu_s": b[k] - a[k] for k in ("guard", "triton", "engine")},
            "tree_changed": a["pids"] != b["pids"]}


def serve_triton(args, tokenizer, alone: dict) -> dict:
    from trtllm_dflash.serving.repo import MODEL_NAME

    with tempfile.TemporaryDirectory(prefix="serving-overhead-") as work:
        srv = TritonServed(args, Path(work))
        left: list[str] = []
        try:
            srv.wait_ready()
            ignore_eos = '"sampling_param_ignore_eos"' in (srv.repo / MODEL_NAME / "config.pbtxt").read_text()
            srv.start_clients(ignore_eos)
            srv.wait_active(args.streams)
            time.sleep(1.0)        # the streams' first tokens are out
            print(f"served (triton): {args.streams} streams over {len(srv.clients)} client processes, measuring "
                  f"{args.seconds:g} s", file=sys.stderr, flush=True)
            m = measure_triton(srv, args.seconds)
        finally:
            left = srv.stop()
        if left:
            raise SystemExit("error: still running after dflash-serve stopped:\n  " + "\n  ".join(left))
        rc = srv.proc.returncode
        log_tail = srv.log_tail(1500)
    ids = tokenizer.encode(PROMPT)
    # the stand-in's output is the prompt's tokens over and over: so many tokens per character of it
    tokens_per_char = len(ids) / len(tokenizer.decode(ids))
    responses = sum(c["responses"] for c in m["clients"])
    tokens = tokens_per_char * sum(c["chars"] for c in m["clients"])
    wall, steps = m["wall_s"], m["steps"]
    frontend_s = m["guard_cpu_s"] + m["triton_cpu_s"]
    per_token = 1e6 / max(tokens, 1)
    return {"steps_per_s_served": steps / wall, "served_over_alone": steps / wall / alone["steps_per_s"],
            "responses_per_s": responses / wall, "tok_s_received": tokens / wall,
            "sent_over_alone": tokens / wall / alone["engine_tok_s"], "tokens_per_response": tokens / max(responses, 1),
            "responses_per_request_and_step": responses / max(steps * args.streams, 1),
            "engine_cpu_ms_per_step_served": 1e3 * m["engine_cpu_s"] / max(steps, 1),
            "frontend_cpu_us_per_token": frontend_s * per_token,
            "triton_cpu_us_per_token": m["triton_cpu_s"] * per_token,
            "guard_cpu_us_per_token": m["guard_cpu_s"] * per_token,
            "cpu_s_served": {"tritonserver_and_stub": m["triton_cpu_s"], "dflash_serve": m["guard_cpu_s"],
                             "engine": m["engine_cpu_s"], "clients": sum(c["cpu_s"] for c in m["clients"])},
            "client_procs": len(m["clients"]), "client_cpu_util": [c["cpu_util"] for c in m["clients"]],
            "other_cpu_util_served": m["other_cpu_util"],
            "clients": m["clients"], "tokens_per_char": tokens_per_char, "process_tree_changed": m["tree_changed"],
            "dflash_serve_exit_code": rc, "dflash_serve_log_tail": log_tail if rc else ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("thread", "process"), default="process",
                   help="thread: the scheduler thread in the server's process (before); process: engine_core.py")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="measured window of each phase")
    p.add_argument("--busy_ms", type=float, default=1.5, help="GIL held per step (host work)")
    p.add_argument("--wait_ms", type=float, default=1.0, help="GIL released per step (device work)")
    p.add_argument("--tokenizer", default="smollm2", help="'smollm2' (the real one, from the package) or 'chars'")
    p.add_argument("--server", choices=("openai", "triton"), default="openai",
                   help="openai: dflash-openai in this process; triton: dflash-serve (real tritonserver), gRPC clients")
    p.add_argument("--client_procs", type=int, default=2, help="triton: processes the streams are spread over")
    p.add_argument("--grpc_guard", choices=("true", "false"), default="true", help="triton: dflash-serve's flag")
    p.add_argument("--triton_model", default="",
                   help="triton: which triton_model.py is served, in words, for the results file (its git blob id "
                        "is recorded in any case)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.server == "triton" and args.engine != "process":
        p.error("--server triton runs the engine in its own process, as the Triton model does: --engine process")

    # alone: the runtime with N requests and no reader
    rt = Runtime(args)
    records = [ServedRequest(prompt=PROMPT, max_tokens=1 << 30, ignore_eos=True) for _ in range(args.streams)]
    for r in records:
        rt.backend.submit(r)
    wait_active(rt, args.streams)
    print(f"alone: {args.streams} requests running, measuring {args.seconds:g} s", file=sys.stderr, flush=True)
    alone = measure(rt, args.seconds)
    if not alone["steps"]:
        raise SystemExit(f"error: the engine reported no step in {args.seconds:g} s alone (its counters came late: a "
                         "machine this busy cannot time serving). Fix: run again on a quieter machine")
    alone["engine_tok_s"] = 2 * args.streams * alone["steps_per_s"]     # the stand-in commits 2 tokens per row
    rt.backend.shutdown()
    common = {"server": args.server, "engine": args.engine, "streams": args.streams, "busy_ms": args.busy_ms,
              "wait_ms": args.wait_ms, "tokenizer": args.tokenizer, "seconds": args.seconds, "cpus": os.cpu_count(),
              "steps_per_s_alone": alone["steps_per_s"], "engine_tok_s_alone": alone["engine_tok_s"],
              "cpu_ms_per_step_alone": alone["cpu_ms_per_step"],
              "engine_cpu_ms_per_step_alone": alone["engine_cpu_ms_per_step"],
              "other_cpu_util_alone": alone["other_cpu_util"],
              # how far the engine process may run ahead of a frontend (engine_core.py); the thread engine has none
              "max_unacked": engine_core.MAX_UNACKED if args.engine == "process" else None}
    if args.server == "triton":
        served_file = SOURCE_ROOT / "trtllm_dflash" / "serving" / "triton_model.py"
        result = {**common, **serve_triton(args, rt.tokenizer, alone), "grpc_guard": args.grpc_guard,
                  "triton_model": args.triton_model or "this tree's (see provenance)",
                  "triton_model_git_blob": _git_blob(served_file), "provenance": provenance()}
    else:
        result = {**common, **serve_openai(args, alone), "provenance": provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("provenance", "clients")}, indent=1))
    return 0


def serve_openai(args, alone: dict) -> dict:
    """served: dflash-openai in this process, N streaming HTTP clients in another."""
    import uvicorn

    from trtllm_dflash.serving.openai_server import OpenAIApp

    rt = Runtime(args)
    openai_app = OpenAIApp(rt.backend, rt.tokenizer, "m")
    app = openai_app.make()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = subprocess.Popen([sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}/v1/completions",
                               str(args.streams)])
    try:
        wait_active(rt, args.streams)
        time.sleep(1.0)        # the streams' first tokens are out
        print(f"served: {args.streams} streams running, measuring {args.seconds:g} s", file=sys.stderr, flush=True)
        served = measure(rt, args.seconds, lambda: openai_app.metrics.counters["generation_tokens"], [client.pid])
    finally:
        client.terminate()
        client.wait(timeout=30)
        server.should_exit = True
        rt.backend.shutdown()
    # read off the app, not scraped: behind an engine that runs ahead of it (thread, no flow control) the event
    # loop answered /metrics only after minutes
    generated = openai_app.metrics.counters["generation_tokens"]
    # The frontend's CPU: thread: this process's minus what the engine alone took for the same steps; process:
    # all of this process's. Per token the clients got (a frontend that lags sends fewer than the engine made).
    frontend_s = served["cpu_s"] - (alone["cpu_ms_per_step"] * served["steps"] / 1e3 if args.engine == "thread" else 0.0)
    return {"steps_per_s_served": served["steps_per_s"],
            "served_over_alone": served["steps_per_s"] / alone["steps_per_s"],
            "tok_s_sent_served": served["tokens_sent_per_s"],
            "sent_over_alone": served["tokens_sent_per_s"] / alone["engine_tok_s"],
            "cpu_ms_per_step_served": served["cpu_ms_per_step"],
            "engine_cpu_ms_per_step_served": served["engine_cpu_ms_per_step"],
            "frontend_cpu_us_per_token": 1e6 * frontend_s / max(served["tokens_sent"], 1),
            "generation_tokens_sent": generated, "other_cpu_util_served": served["other_cpu_util"]}


if __name__ == "__main__":
    sys.exit(main())
