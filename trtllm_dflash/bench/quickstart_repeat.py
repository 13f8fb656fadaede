# SPDX-License-Identifier: Apache-2.0
"""The quick start, several times in a row: does the DFlash/AR speed-up it prints hold from one run to the next?

    python -m trtllm_dflash.bench.quickstart_repeat --runs 5 --out benchmarks/results/quickstart_repeat_cpu_v6.json

Each run is a fresh `dflash-generate` process with the arguments of `scripts/quickstart.sh` (the README's main
job: SmolLM2-135M and the shipped drafter on the CPU, both modes warmed up, then 5 alternated rounds), one after
another on an otherwise idle machine. Per run the file keeps what the quick start printed and wrote (each round's
wall times and ratio, the median it prints, the blocks the adaptive policy ran, its last choice, the step periods
it left out as stalls, whether DFlash's tokens equal AR's); the summary gives the spread over the runs and the
worst spread of any three in a row (the quick start's stability goal: within 10%).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trtllm_dflash.provenance import record

# scripts/quickstart.sh's dflash-generate arguments before its --dtype (a test keeps the two the same)
QUICKSTART_ARGS = ["--target", "smollm2-135m", "--drafter", "smollm2-135m-dflash", "--mode", "both",
                   "--max_new_tokens", "64", "--prompt", "What is the capital of France?",
                   "--prompt", "Write a Python function that returns the sum of a list."]


def quickstart_dtype(cpuinfo: str | None = None) -> str:
    """The dtype the quick start runs both modes in on this CPU: bfloat16 where the CPU multiplies bf16 in hardware
    (the amx_bf16 flag: Xeon Sapphire Rapids and later), float32 elsewhere. On a 2-core Xeon with AMX the adaptive
    policy's start-up cost table priced a block-16 step at 3.4x an AR step in float32 (16 rows of float32 GEMM are
    compute-bound there, one row is memory-bound), so it rightly ran AR and the quick start printed 0.95x; in bf16
    it priced the step at 1.4x and the quick start printed 2.2x with AR's tokens
    (benchmarks/results/quickstart_repeat_cpu_bf16.json and _fp32.json). bf16 AR was slower there than float32 AR
    (4.45 vs 3.45 s a round), so bf16 DFlash is ~1.7x the faster AR: the fastest way to these tokens on that CPU.
    Elsewhere bf16 matmuls are emulated and float32 stays. ``cpuinfo``: /proc/cpuinfo's text (read here when
    None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:   # not Linux: no flags to read
            cpuinfo = ""
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    return "bfloat16" if "amx_bf16" in flags else "float32"


GENERATE = "import sys; from trtllm_dflash.cli import generate_main; sys.exit(generate_main())"   # dflash-generate
# generate's stderr line on what the adaptive policy ran, and the stalls its note adds
RAN = re.compile(r"^\[dflash\] ran (.*) over \d+ round\(s\) \((.*)\)$", re.M)
STALLS = re.compile(r"; (\d+) stalled step period\(s\) left out")


def parse_run(results: dict, stderr: str) -> dict:
    """One run's figures from its --json file and its stderr."""
    rounds = results["rounds"]
    ran = RAN.search(stderr)
    note = ran.group(2) if ran else ""
    stalls = STALLS.search(note)
    return {"ar_wall_s": rounds["ar_wall_s"], "dflash_wall_s": rounds["dflash_wall_s"],
            "round_speedups": rounds["speedup"], "printed_median_speedup": rounds["median_speedup"],
            "ratio_of_sums": sum(rounds["ar_wall_s"]) / sum(rounds["dflash_wall_s"]),
            "dflash_equals_ar": all(a["output_ids"] == d["output_ids"]
                                    for a, d in zip(results["ar"], results["dflash"])),
            "blocks_ran": ran.group(1) if ran else None,
            "last_choice": STALLS.sub("", note.removeprefix("adaptive; last choice: ")) or None,
            "stalled_periods_left_out": int(stalls.group(1)) if stalls else 0}


def summarize(runs: list[dict]) -> dict:
    """Spread of the printed speed-ups over the runs, and the worst of any three runs in a row (max / min)."""
    printed = [r["printed_median_speedup"] for r in runs]
    threes = [max(printed[i:i + 3]) / min(printed[i:i + 3]) for i in range(len(printed) - 2)]
    return {"printed_median_speedups": [round(p, 3) for p in printed], "min": min(printed), "max": max(printed),
            "median": statistics.median(printed), "worst_three_in_a_row_spread": max(threes) if threes else None,
            "runs_with_dflash_equal_ar": sum(r["dflash_equals_ar"] for r in runs)}


def dtype_args(extra: list[str]) -> list[str]:
    """The quick start's --dtype, unless the extra arguments name one."""
    return [] if any(a == "--dtype" or a.startswith("--dtype=") for a in extra) else ["--dtype", quickstart_dtype()]


def run_once(generate_args: list[str], timeout_s: float) -> tuple[dict, str, float]:
    with tempfile.TemporaryDirectory(prefix="quickstart-repeat-") as tmp:
        out = Path(tmp) / "run.json"
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", GENERATE, *generate_args, "--json", str(out)],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            sys.exit(f"quickstart_repeat: a run outlasted --timeout_s {timeout_s:g}: raise it, or look at what else "
                     "is running on this machine")
        took = time.perf_counter() - t0
        if proc.returncode != 0 or not out.is_file():
            sys.exit(f"quickstart_repeat: dflash-generate exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text()), proc.stderr, took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.quickstart_repeat", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="quick starts in a row (default 3: the stability goal's)")
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--machine", default="", help="what the machine is, for the file (e.g. '2 shared CPU cores')")
    p.add_argument("--timeout_s", type=float, default=900, help="one run's time limit (default 900)")
    p.add_argument("extra", nargs="*", help="more dflash-generate arguments after --, e.g. -- --rounds 3")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs: must be >= 1")
    from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
    generate_args = QUICKSTART_ARGS + dtype_args(args.extra) + args.extra   # the same for every run
    runs = []
    for i in range(args.runs):
        results, stderr, took = run_once(generate_args, args.timeout_s)
        runs.append({**parse_run(results, stderr), "run_s": round(took, 1)})
        print(f"quickstart_repeat: run {i + 1}/{args.runs}: printed {runs[-1]['printed_median_speedup']:.2f}x, "
              f"DFlash == AR: {runs[-1]['dflash_equals_ar']}, {took:.0f} s", flush=True)
    summary = summarize(runs)
    drafter = shipped_drafter_dir("smollm2-135m-dflash")
    doc = {"what": "the quick start (scripts/quickstart.sh's dflash-generate) run several times in a row",
           "quickstart_args": generate_args, "machine": args.machine,
           "runs": runs, "summary": summary, "provenance": record(checkpoints={"drafter": drafter})}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"quickstart_repeat: {summary['printed_median_speedups']}; worst three in a row "
          f"{summary['worst_three_in_a_row_spread']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
