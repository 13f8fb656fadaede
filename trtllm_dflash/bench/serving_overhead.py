# SPDX-License-Identifier: Apache-2.0
"""Does serving starve the engine's loop, and what does the frontend cost per token? Engine steps/s with N
streaming HTTP clients vs with none (CPU), with the engine in the server's process or in its own.

    python -m trtllm_dflash.bench.serving_overhead --engine thread --streams 64 --seconds 8 \
        --out benchmarks/results/serving_overhead_cpu_thread.json      # before: scheduler thread in the server
    python -m trtllm_dflash.bench.serving_overhead --engine process --streams 64 --seconds 8 \
        --out benchmarks/results/serving_overhead_cpu_process.json     # after: engine_core.py's process

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
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


from trtllm_dflash.testing import FakeEngine
from trtllm_dflash.provenance import record as provenance
from trtllm_dflash.serving.record import ServedRequest
from trtllm_dflash.serving.runtimes import TorchRuntime

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


def _process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Runtime:
    """The runtime under test and how to read its engine: in this process (thread) or in its own (process)."""

    def __init__(self, args):
        from transformers import AutoTokenizer

        from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
        from trtllm_dflash.testing import CharTokenizer

        tokenizer = (AutoTokenizer.from_pretrained(str(smollm2_target_dir())) if args.tokenizer == "smollm2"
                     else CharTokenizer())
        self.tokenizer, self.mode = tokenizer, args.engine
        if args.engine == "thread":
            self.engine = GilEngine(args.busy_ms / 1e3, args.wait_ms / 1e3, max_batch_size=args.streams,
                                    max_seq_len=1 << 40)
            self.engine.tokenizer = tokenizer
            self.backend = TorchRuntime(self.engine)
            self.engine_pid = None
        else:
            from trtllm_dflash.serving.engine_client import EngineClient

            env = {**os.environ, "DFLASH_BENCH_BUSY_MS": str(args.busy_ms), "DFLASH_BENCH_WAIT_MS": str(args.wait_ms),
                   "DFLASH_BENCH_STREAMS": str(args.streams)}
            self.backend = EngineClient.spawn(Path.cwd(), engine_factory="trtllm_dflash.bench.serving_overhead:engine_from_env",
                                              tokenizer=tokenizer, env=env)
            self.engine_pid = self.backend.proc.pid

    def steps(self) -> int:
        return self.engine.counters["steps"] if self.engine_pid is None else self.backend.metrics()["steps"]

    def active(self) -> int:
        return len(self.engine.active) if self.engine_pid is None else self.backend.metrics()["running"]

    def engine_cpu_s(self) -> float:
        return 0.0 if self.engine_pid is None else _process_cpu_s(self.engine_pid)


def measure(rt: Runtime, seconds: float, sent=lambda: 0) -> dict:
    """Engine steps/s, tokens sent to the clients, and CPU time of this process and of the engine process. The
    CPU time depends little on what else runs on the machine, unlike the rates."""
    s0, n0, t0, c0, e0 = rt.steps(), sent(), time.perf_counter(), time.process_time(), rt.engine_cpu_s()
    time.sleep(seconds)
    c1, e1, steps, n1, t1 = time.process_time(), rt.engine_cpu_s(), rt.steps() - s0, sent(), time.perf_counter()
    return {"steps_per_s": steps / (t1 - t0), "cpu_ms_per_step": 1e3 * (c1 - c0) / max(steps, 1),
            "engine_cpu_ms_per_step": 1e3 * (e1 - e0) / max(steps, 1), "cpu_s": c1 - c0, "steps": steps,
            "tokens_sent": n1 - n0, "tokens_sent_per_s": (n1 - n0) / (t1 - t0)}


def wait_active(rt: Runtime, n: int, timeout: float = 60) -> None:
    end = time.time() + timeout
    while rt.active() < n:
        if time.time() > end:
            raise SystemExit(f"error: only {rt.active()} of {n} requests became active")
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("thread", "process"), default="process",
                   help="thread: the scheduler thread in the server's process (before); process: engine_core.py")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="measured window of each phase")
    p.add_argument("--busy_ms", type=float, default=1.5, help="GIL held per step (host work)")
    p.add_argument("--wait_ms", type=float, default=1.0, help="GIL released per step (device work)")
    p.add_argument("--tokenizer", default="smollm2", help="'smollm2' (the real one, from the package) or 'chars'")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import uvicorn

    from trtllm_dflash.serving.openai_server import OpenAIApp

    # alone: the runtime with N requests and no reader
    rt = Runtime(args)
    records = [ServedRequest(prompt=PROMPT, max_tokens=1 << 30, ignore_eos=True) for _ in range(args.streams)]
    for r in records:
        rt.backend.submit(r)
    wait_active(rt, args.streams)
    print(f"alone: {args.streams} requests running, measuring {args.seconds:g} s", file=sys.stderr, flush=True)
    alone = measure(rt, args.seconds)
    rt.backend.shutdown()

    # served: dflash-openai in this process, N streaming clients in another
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
        served = measure(rt, args.seconds, lambda: openai_app.metrics.counters["generation_tokens"])
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
    engine_tok_s = 2 * args.streams * alone["steps_per_s"]
    result = {"engine": args.engine, "streams": args.streams, "busy_ms": args.busy_ms, "wait_ms": args.wait_ms,
              "tokenizer": args.tokenizer, "seconds": args.seconds, "cpus": os.cpu_count(),
              "steps_per_s_alone": alone["steps_per_s"], "steps_per_s_served": served["steps_per_s"],
              "served_over_alone": served["steps_per_s"] / alone["steps_per_s"],
              "engine_tok_s_alone": engine_tok_s, "tok_s_sent_served": served["tokens_sent_per_s"],
              "sent_over_alone": served["tokens_sent_per_s"] / engine_tok_s,
              "cpu_ms_per_step_alone": alone["cpu_ms_per_step"], "cpu_ms_per_step_served": served["cpu_ms_per_step"],
              "engine_cpu_ms_per_step_alone": alone["engine_cpu_ms_per_step"],
              "engine_cpu_ms_per_step_served": served["engine_cpu_ms_per_step"],
              "frontend_cpu_us_per_token": 1e6 * frontend_s / max(served["tokens_sent"], 1),
              "generation_tokens_sent": generated,
              "provenance": provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
