# SPDX-License-Identifier: Apache-2.0
"""Does serving starve the engine's loop? Engine steps/s with N streaming HTTP clients vs with none (CPU).

    python benchmarks/serving_overhead.py --streams 64 --seconds 10 --out benchmarks/results/serving_overhead_cpu.json

The engine is a stand-in with the real engine's threading contract (tests/serving/fakes.py's FakeEngine) whose
step holds the GIL for ``--busy_ms`` (the host work of a GPU step: Python, kernel launches) and then waits
``--wait_ms`` with the GIL released (the device), so the loop competes for the interpreter exactly as the real
engine thread does. The runtime and the serving layer are the real ones: TorchBackend, dflash-openai's app under
uvicorn in this process, the records, incremental detokenization with SmolLM2's real tokenizer. The clients run
in another process (as real clients do) and read server-sent events as fast as they come.

  alone   N requests submitted to the runtime directly, nobody reading: the engine's own rate
  served  N streaming /v1/completions through dflash-openai: every step's tokens decoded and sent as SSE
The ratio served/alone is what serving costs the engine loop (1.0 = nothing); on a busy machine the rates
move with the neighbours, so the CPU time of this process per step is recorded too: served minus alone is
the serving work per step (all rows), which has to fit beside the step's own host work.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serving.fakes import FakeEngine  # noqa: E402
from trtllm_dflash.provenance import record as provenance  # noqa: E402
from trtllm_dflash.serving.record import ServedRequest  # noqa: E402
from trtllm_dflash.serving.runtimes import TorchBackend  # noqa: E402

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


def measure(engine, seconds: float) -> tuple[float, float]:
    """(engine steps/s, CPU ms of this process per step). The CPU time per step depends little on what else
    runs on the machine, unlike the rate: served minus alone = what serving costs per step."""
    s0, t0, c0 = engine.counters["steps"], time.perf_counter(), time.process_time()
    time.sleep(seconds)
    steps = engine.counters["steps"] - s0
    return steps / (time.perf_counter() - t0), 1e3 * (time.process_time() - c0) / max(steps, 1)


def wait_active(engine, n: int, timeout: float = 60) -> None:
    end = time.time() + timeout
    while len(engine.active) < n:
        if time.time() > end:
            raise SystemExit(f"error: only {len(engine.active)} of {n} requests became active")
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="measured window of each phase")
    p.add_argument("--busy_ms", type=float, default=1.5, help="GIL held per step (host work)")
    p.add_argument("--wait_ms", type=float, default=1.0, help="GIL released per step (device work)")
    p.add_argument("--tokenizer", default="smollm2", help="'smollm2' (the real one, from the package) or 'chars'")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import uvicorn

    from trtllm_dflash.serving.openai_server import OpenAIApp

    def make():
        engine = GilEngine(args.busy_ms / 1e3, args.wait_ms / 1e3, max_batch_size=args.streams, max_seq_len=1 << 40)
        if args.tokenizer == "smollm2":
            from transformers import AutoTokenizer

            from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
            engine.tokenizer = AutoTokenizer.from_pretrained(str(smollm2_target_dir()))
        return engine, TorchBackend(engine)

    # alone: the runtime with N requests and no reader
    engine, backend = make()
    records = [ServedRequest(prompt=PROMPT, max_tokens=1 << 30, ignore_eos=True) for _ in range(args.streams)]
    for r in records:
        backend.submit(r)
    wait_active(engine, args.streams)
    alone, cpu_alone = measure(engine, args.seconds)
    backend.shutdown()

    # served: dflash-openai in this process, N streaming clients in another
    engine, backend = make()
    app = OpenAIApp(backend, engine.tokenizer, "m").make()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = subprocess.Popen([sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}/v1/completions",
                               str(args.streams)])
    try:
        wait_active(engine, args.streams)
        time.sleep(1.0)        # the streams' first tokens are out
        served, cpu_served = measure(engine, args.seconds)
        scrape = __import__("urllib.request").request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        client.terminate()
        client.wait(timeout=30)
        server.should_exit = True
        backend.shutdown()
    generated = [line for line in scrape.splitlines() if line.startswith("dflash:generation_tokens_total")]
    result = {"streams": args.streams, "busy_ms": args.busy_ms, "wait_ms": args.wait_ms, "tokenizer": args.tokenizer,
              "seconds": args.seconds, "steps_per_s_alone": alone, "steps_per_s_served": served,
              "served_over_alone": served / alone, "cpu_ms_per_step_alone": cpu_alone,
              "cpu_ms_per_step_served": cpu_served, "serving_cpu_ms_per_step": cpu_served - cpu_alone,
              "serving_cpu_us_per_row": 1e3 * (cpu_served - cpu_alone) / args.streams,
              "generation_tokens_sent": generated,
              "provenance": provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
