# SPDX-License-Identifier: Apache-2.0
"""What dflash-serve's HTTP guard costs: the same requests through the guard (--http_port) and straight to
Triton's internal HTTP socket (a Unix socket in dflash-serve's private directory), interleaved in one run on one server.

Measures (CPU unless the deployment says otherwise; the machine is named in the results' provenance):
  * health_ms: GET /v2/health/ready round trips (no model work: the guard's relay cost alone), one
    keep-alive connection per path, ``--health_requests`` each;
  * generate_ms: POST /generate with ``sampling_param_max_tokens`` 1 (tokenize + one step), a new
    connection per request as urllib makes them;
  * stream_tokens_per_s: POST /generate_stream with ``--stream_tokens`` tokens (SSE events read as they
    arrive), and the time to the first event.
Medians over ``--reps`` interleaved repetitions (guard, direct, guard, ...); ratios guard / direct.

  dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml --out engines/smollm2
  python -m trtllm_dflash.bench.guard_overhead --deployment_dir engines/smollm2 \\
      --out benchmarks/results/guard_overhead_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from trtllm_dflash.deployment import Deployment
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.provenance import record
from trtllm_dflash.serving.launch import free_loopback_port, http_connection

GEN = "/v2/models/tensorrt_llm/generate"


def start(engine: Path, log: Path, timeout: float = 900.0) -> tuple[subprocess.Popen, str, str]:
    """dflash-serve on free ports; (process, guard address, Triton's internal socket) once it is ready."""
    http = free_loopback_port()
    cmd = [sys.executable, "-m", "trtllm_dflash.serving.server", str(engine), "--http_port", str(http),
           "--grpc_port", str(free_loopback_port()), "--metrics_port", str(free_loopback_port())]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while "dflash-serve: ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            proc.kill()
            sys.exit(f"dflash-serve did not start; its log:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    internal = re.search(r"HTTP guard on \S+ -> Triton on (\S+)", log.read_text()).group(1)
    return proc, f"127.0.0.1:{http}", internal


def health_ms(target: str, n: int) -> float:
    conn = http_connection(target, timeout=60)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/v2/health/ready")
        r = conn.getresponse()
        r.read()
        times.append(time.perf_counter() - t0)
        assert r.status == 200, r.status
    conn.close()
    return statistics.median(times) * 1e3


def generate_ms(target: str, prompt: str) -> float:
    body = json.dumps({"text_input": prompt, "sampling_param_max_tokens": 1}).encode()
    t0 = time.perf_counter()
    conn = http_connection(target, timeout=600)
    conn.request("POST", GEN, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = json.loads(r.read())
    conn.close()
    assert r.status == 200 and "text_output" in out, out
    return (time.perf_counter() - t0) * 1e3


def stream(target: str, prompt: str, tokens: int) -> tuple[float, float, str]:
    """(tokens/s after the first event, seconds to the first event, text)."""
    body = json.dumps({"text_input": prompt, "sampling_param_max_tokens": tokens, "streaming": True,
                       "sampling_param_ignore_eos": True}).encode()
    conn = http_connection(target, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", GEN + "_stream", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    first, text, final = None, "", None
    for line in r:
        if line.startswith(b"data:"):
            event = json.loads(line[5:])
            assert "error" not in event, event
            first = first or time.perf_counter()
            text += event.get("text_output", "")
            final = event if "finish_reason" in event else final
    end = time.perf_counter()
    conn.close()
    assert final is not None and final["finish_reason"] == "length", final
    return (tokens - 1) / (end - first), first - t0, text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="engine", type=Path, required=True,
                   help="deployment directory (dflash-build output)")
    p.add_argument("--out", type=Path, required=True, help="results JSON (a PNG beside it)")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions of each measurement")
    p.add_argument("--health_requests", type=int, default=200, help="health round trips per repetition")
    p.add_argument("--stream_tokens", type=int, default=64, help="tokens per streamed request")
    p.add_argument("--prompt", default="The capital of France is")
    args = p.parse_args(argv)
    try:
        deployment = Deployment.open(args.engine)
    except DFlashError as err:
        p.error(str(err))

    with tempfile.TemporaryDirectory(prefix="guard-bench-") as work:
        proc, guard, direct = start(args.engine, Path(work) / "dflash-serve.log")
        try:
            paths = {"guard": guard, "direct": direct}
            stream(guard, args.prompt, 8)                       # warm up both paths and the engine
            stream(direct, args.prompt, 8)
            runs = {name: {"health_ms": [], "generate_ms": [], "stream_tokens_per_s": [], "stream_first_s": [],
                           "texts": set()} for name in paths}
            for rep in range(args.reps):
                order = list(paths.items()) if rep % 2 == 0 else list(paths.items())[::-1]
                for name, port in order:
                    r = runs[name]
                    r["health_ms"].append(health_ms(port, args.health_requests))
                    r["generate_ms"].append(generate_ms(port, args.prompt))
                    tps, first, text = stream(port, args.prompt, args.stream_tokens)
                    r["stream_tokens_per_s"].append(tps)
                    r["stream_first_s"].append(first)
                    r["texts"].add(text)
                print(f"rep {rep + 1}/{args.reps}: " + ", ".join(
                    f"{n} health {runs[n]['health_ms'][-1]:.2f} ms, generate {runs[n]['generate_ms'][-1]:.0f} ms, "
                    f"{runs[n]['stream_tokens_per_s'][-1]:.1f} tok/s" for n in paths), flush=True)
        finally:
            proc.terminate()
            rc = proc.wait(timeout=120)
    same_text = len(runs["guard"]["texts"] | runs["direct"]["texts"]) == 1
    for r in runs.values():
        r.pop("texts")
    medians = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in runs.items()}
    ratios = {k: medians["guard"][k] / medians["direct"][k] for k in medians["guard"]}
    result = {
        "what": "dflash-serve HTTP guard overhead: the same requests through the guard and straight to Triton, "
                "interleaved on one server",
        "git_sha": None,
        "machine": f"{os.cpu_count()}-core CPU, no GPU used (the torch runtime on CPU)",
        "settings": {**vars(args), "engine": str(args.engine), "out": str(args.out)},
        "medians": medians, "ratios_guard_over_direct": ratios,
        "guard_adds_ms": {k: medians["guard"][k] - medians["direct"][k] for k in ("health_ms", "generate_ms")},
        "same_greedy_text_both_paths": same_text, "dflash_serve_exit_code": rc, "runs": runs,
        "provenance": record(checkpoints={"target": deployment.target_dir, "drafter": deployment.drafter_dir}),
    }
    result["git_sha"] = result["provenance"]["git_sha"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(runs, args.out.with_suffix(".png"))
    print(json.dumps({"ratios_guard_over_direct": ratios, "guard_adds_ms": result["guard_adds_ms"],
                      "same_greedy_text_both_paths": same_text}, indent=1))
    return 0 if same_text and rc == 0 else 1


def plot(runs: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = ("health_ms", "generate_ms", "stream_tokens_per_s")
    fig, axes = plt.subplots(1, len(keys), figsize=(11, 3.2))
    for ax, key in zip(axes, keys):
        ax.boxplot([runs["direct"][key], runs["guard"][key]], tick_labels=["straight to Triton", "through the guard"])
        ax.set_title(key.replace("_", " "))
    fig.suptitle("dflash-serve HTTP guard: same requests, same server, interleaved")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
