# SPDX-License-Identifier: Apache-2.0
"""NVIDIA's aiperf against dflash-openai: a short profile (concurrency 2, fixed input and output lengths) of a
deployment directory, written to a results file with provenance.

aiperf (PyPI ``aiperf``) pulls in pandas, plotly, kubernetes_asyncio and more, so it lives in its own virtual
environment and is passed by path:

  python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
  dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml --out out/smollm2
  python -m trtllm_dflash.bench.aiperf_openai --deployment_dir out/smollm2 --aiperf /tmp/aiperf-venv/bin/aiperf \\
      --out benchmarks/results/aiperf_openai_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trtllm_dflash import provenance
from trtllm_dflash.serving.launch import free_loopback_port


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="engine", type=Path, required=True, help="a dflash-build deployment directory")
    p.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--request_count", type=int, default=8)
    p.add_argument("--isl", type=int, default=64, help="input tokens per request (synthetic, fixed)")
    p.add_argument("--osl", type=int, default=32, help="output tokens per request (fixed: ignore_eos)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    engine = args.engine.resolve()
    port, name = free_loopback_port(), engine.name
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "server.log"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        server = subprocess.Popen([sys.executable, "-m", "trtllm_dflash.serving.openai_server", str(engine),
                                   "--port", str(port)], stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
        try:
            t0 = time.monotonic()
            while "dflash-openai: ready" not in log.read_text(errors="replace"):
                if server.poll() is not None or time.monotonic() - t0 > 300:
                    raise SystemExit(f"dflash-openai did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
            cmd = [args.aiperf, "profile", "--model", name, "--url", f"http://127.0.0.1:{port}",
                   "--endpoint-type", "chat", "--streaming", "--tokenizer", str(engine / "target"),
                   "--concurrency", str(args.concurrency), "--request-count", str(args.request_count),
                   "--synthetic-input-tokens-mean", str(args.isl), "--synthetic-input-tokens-stddev", "0",
                   "--output-tokens-mean", str(args.osl), "--output-tokens-stddev", "0",
                   "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
                   "--artifact-dir", str(Path(work) / "artifacts"), "--ui-type", "none"]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        finally:
            server.terminate()
            server.wait(60)
        exports = sorted((Path(work) / "artifacts").rglob("profile_export_aiperf.json"))
        if run.returncode != 0 or not exports:
            raise SystemExit(f"aiperf failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        report = json.loads(exports[0].read_text())
    metrics = {k: v for k, v in report.items() if isinstance(v, dict) and "avg" in v}
    summary = {k: {s: metrics[k].get(s) for s in ("avg", "p50", "p99", "unit")} for k in sorted(metrics)}
    result = {"provenance": provenance.record([sys.executable, *sys.argv],
                                              checkpoints={"target": engine / "target", "drafter": engine / "drafter"}),
              "aiperf_command": " ".join(cmd).replace(str(Path(work)), "<tmp>"),
              "settings": {"concurrency": args.concurrency, "request_count": args.request_count, "isl": args.isl,
                           "osl": args.osl, "endpoint": "chat, streaming"},
              "summary": summary, "aiperf_report": report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for key in ("request_count", "output_sequence_length", "time_to_first_token", "inter_token_latency",
                "output_token_throughput", "request_latency"):
        if key in summary:
            print(f"{key:>26}: {summary[key]}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
