# SPDX-License-Identifier: Apache-2.0
"""How much of a fast streaming server can dflash-sweep's client see? A stand-in OpenAI server sends every open
stream one chunk per step (an engine step: ``--step_ms``) from one asyncio loop in its own process; dflash-sweep's
OpenAI client reads them at each concurrency with 1, 2, 4 ... client processes (``--client_processes``).

    python -m trtllm_dflash.bench.client_capacity --out benchmarks/results/client_capacity_cpu.json

The stand-in's pace is known, so the gaps are the client's (and the machine's): tokens/s read against the
tokens/s the pace allows (concurrency x 1000 / step_ms), TTFT against the step (a request's first chunk leaves
at the next step), TPOT against the step. Why: the served sweeps (dflash-openai, Triton) are measured by this
client; where one client process cannot read what the server sends, the server's figures come out low.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path

from trtllm_dflash.bench import drivers
from trtllm_dflash.bench.endpoints import OpenAIClient
from trtllm_dflash.bench.metrics import summarize
from trtllm_dflash.bench.workload import WorkItem
from trtllm_dflash.errors import DFlashError, exit_code
from trtllm_dflash.provenance import record
from trtllm_dflash.serving.launch import free_loopback_port


def _chunk(k: int, n: int) -> bytes:
    obj = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "pace",
           "choices": [{"index": 0, "text": " tok", "logprobs": None,
                        "finish_reason": None if k < n - 1 else "length"}],
           "usage": {"prompt_tokens": 8, "completion_tokens": k + 1, "total_tokens": k + 9}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def serve_paced(port: int, step_s: float, tokens: int) -> None:
    """The stand-in: /v1/models, and /v1/completions streams of ``tokens`` chunks, one per stream per step."""
    chunks = [_chunk(k, tokens) for k in range(tokens)]
    models = b'{"object": "list", "data": [{"id": "pace", "object": "model"}]}'
    live: dict = {}

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(models), models))
            writer.close()
            return
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        live[writer] = 0

    async def steps():
        due = time.perf_counter()
        while True:
            due += step_s
            for writer, k in list(live.items()):
                writer.write(chunks[k])
                if k + 1 < tokens:
                    live[writer] = k + 1
                else:
                    writer.write(b"data: [DONE]\n\n")
                    writer.close()
                    del live[writer]
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        asyncio.get_running_loop().create_task(steps())
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class _PacedClient:
    """A picklable factory of the sweep's OpenAI client for the stand-in (no tokenizer: its usage counts)."""

    def __init__(self, url: str, tokens: int):
        self.url, self.tokens = url, tokens

    def __call__(self) -> OpenAIClient:
        return OpenAIClient(self.url, None, max_tokens=self.tokens, temperature=0.0, seed=0, ignore_eos=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.client_capacity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="16,64,256", help="streams in flight, one level each")
    p.add_argument("--client_processes", default="1,2,4", help="client process counts to compare at every level")
    p.add_argument("--step_ms", type=float, default=2.0, help="the stand-in's step: one chunk per stream per step")
    p.add_argument("--tokens", type=int, default=128, help="chunks (tokens) per request")
    p.add_argument("--requests", type=int, default=3, help="requests per stream at each level (x concurrency)")
    p.add_argument("--out", type=Path, required=True, help="results (JSON)")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    counts = [int(x) for x in args.client_processes.split(",")]
    port = free_loopback_port()
    server = multiprocessing.get_context("spawn").Process(target=serve_paced, args=(port, args.step_ms / 1e3,
                                                                                    args.tokens), daemon=True)
    server.start()
    make = _PacedClient(f"127.0.0.1:{port}", args.tokens)
    for _ in range(300):   # up when it lists its model
        try:
            make()
            break
        except DFlashError:   # not listening yet
            time.sleep(0.1)
    else:
        server.kill()
        raise DFlashError("stand-in server", f"not listening on 127.0.0.1:{port} after 30 s",
                          "check that this machine allows loopback sockets, then run it again")
    rows = []
    try:
        for c in levels:
            for procs in counts:
                items = [WorkItem((1, 2), "x")] * (args.requests * c)
                if procs == 1:
                    records, wall = drivers.run_threaded_level(make().send, items, c)
                else:
                    records, wall = drivers.run_process_level(make, items, c, procs)
                m = summarize(records, wall, 1)
                paced = c * 1e3 / args.step_ms
                rows.append({"concurrency": c, "client_processes": procs, "tok_s_read": round(m["total_tok_s"]),
                             "tok_s_paced": round(paced), "read_over_paced": round(m["total_tok_s"] / paced, 3),
                             "ttft_ms_p50": round(m["ttft_ms"]["p50"], 2), "ttft_ms_p90": round(m["ttft_ms"]["p90"], 2),
                             "tpot_ms_p50": round(m["tpot_ms"]["p50"], 3), "errors": m["num_errors"]})
                r = rows[-1]
                print(f"c={c:4d} processes={procs}: read {r['tok_s_read']:>8,} of {r['tok_s_paced']:>8,} tok/s "
                      f"({r['read_over_paced']:.2f}), TTFT p50 {r['ttft_ms_p50']:.1f} ms p90 {r['ttft_ms_p90']:.1f}, "
                      f"TPOT p50 {r['tpot_ms_p50']:.2f} ms (step {args.step_ms} ms)", flush=True)
    finally:
        server.kill()
    out = {"step_ms": args.step_ms, "tokens": args.tokens, "machine": f"{multiprocessing.cpu_count()} cores, "
           f"{platform.processor() or platform.machine()}", "rows": rows,
           "provenance": record(["python", "-m", "trtllm_dflash.bench.client_capacity",
                                 *(sys.argv[1:] if argv is None else argv)])}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
