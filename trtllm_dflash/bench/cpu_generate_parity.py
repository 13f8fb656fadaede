# SPDX-License-Identifier: Apache-2.0
"""dflash-generate on CPU: DFlash (adaptive, its own choice) against AR, wall time of the generation, repeated.

    python -m trtllm_dflash.bench.cpu_generate_parity --repeats 5 --out benchmarks/results/cpu_generate_parity.json \\
        [--tree before=/path/to/other/checkout]

First the step itself: the median time of one batch-1 decode step of the AR engine against the DFlash
engine at block 1 (what the adaptive policy runs when drafting does not pay), the two stepping in turn in one
process, ``--step_reps`` steps each. Then the quick start's command (``dflash-generate --target smollm2-135m --mode both --max_new_tokens 64`` on
its two prompts) ``--repeats`` times per code tree, the trees interleaved so load on the machine hits them
alike; each run is a fresh process with the quick start's thread count (``--threads`` to pin one). Reports per
run the generation wall time of each mode (from ``--json``; the one-off step-cost measurement is reported apart),
DFlash/AR, the blocks the policy ran and the one DFlash/AR speed-up the quick start prints (the median of its
alternated rounds); per tree the medians and their spread (min, max, and the largest spread of three runs in a row,
the quick start's stability figure).
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

ROOT = Path(__file__).resolve().parents[2]   # the checkout measured as "this" tree

PROMPTS = ("What is the capital of France?", "Write a Python function that returns the sum of a list.")
RUN = "import sys; from trtllm_dflash.cli import generate_main; sys.exit(generate_main())"


def _env(tree: Path, threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def one_run(tree: Path, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gen.json"
        cmd = [sys.executable, "-c", RUN, "--target", args.target, "--mode", "both",
               "--max_new_tokens", str(args.max_new_tokens), "--json", str(out)]
        for p in PROMPTS:
            cmd += ["--prompt", p]
        env = _env(tree, args.threads)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
        total = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"dflash-generate failed in {tree}:\n{proc.stderr[-2000:]}")
        res = json.loads(out.read_text())
    ar, df = res["ar"], res["dflash"]
    ran = re.search(r"\[dflash\] ran (.*?) \(", proc.stderr)
    costs = re.search(r"measured step costs in ([0-9.]+)s", proc.stderr)
    return {"ar_wall_s": ar[0]["wall_s"], "dflash_wall_s": df[0]["wall_s"],
            "quickstart_speedup": res["rounds"]["median_speedup"], "rounds": len(res["rounds"]["speedup"]),
            "dflash_over_ar_wall": df[0]["wall_s"] / ar[0]["wall_s"],
            "same_tokens": all(a["output_ids"] == d["output_ids"] for a, d in zip(ar, df)),
            "blocks_ran": ran.group(1) if ran else None,
            "cost_measurement_s": float(costs.group(1)) if costs else None,
            "process_s": total, "output_tokens": sum(r["num_output_tokens"] for r in df)}


STEP_WORKER = r"""
import json, statistics, sys, time, torch
from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine
reps = int(sys.argv[1])
t, d = smollm2_target_dir(), shipped_drafter_dir("smollm2-135m-dflash")
cfg = dict(max_seq_len=reps + 256, max_batch_size=1)
ar = Engine.from_dirs(t, None, RuntimeConfig(block_size=1, **cfg))
df = Engine.from_dirs(t, d, RuntimeConfig(**cfg))
for e in (ar, df):
    e.add_request(list(range(100, 164)), SamplingParams(max_new_tokens=reps + 8, ignore_eos=True))
    e.step()
times = {"ar": [], "dflash_block1": []}
for _ in range(reps):   # interleaved, so load on the machine hits both alike
    for name, e in (("ar", ar), ("dflash_block1", df)):
        t0 = time.perf_counter()
        e.runner.decode(1, 1)
        times[name].append(time.perf_counter() - t0)
print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
"""


def step_run(tree: Path, reps: int, threads: int | None) -> dict:
    """Median seconds of one decode step at batch 1: AR engine vs the DFlash engine at block 1 (the policy's
    AR choice), the two engines stepping in turn in one process."""
    env = _env(tree, threads)
    proc = subprocess.run([sys.executable, "-c", STEP_WORKER, str(reps)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"step worker failed in {tree}:\n{proc.stderr[-2000:]}")
    med = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"ar_step_s": med["ar"], "dflash_block1_step_s": med["dflash_block1"],
            "block1_over_ar_step": med["dflash_block1"] / med["ar"], "reps": reps}


def spread(xs: list[float]) -> float:
    """max / min - 1: how far apart the figures printed by runs of one command are."""
    return max(xs) / min(xs) - 1


def summary(runs: list[dict]) -> dict:
    ratios = [r["dflash_over_ar_wall"] for r in runs]
    quick = [r["quickstart_speedup"] for r in runs]
    return {"runs": len(runs), "median_dflash_over_ar_wall": statistics.median(ratios),
            "min": min(ratios), "max": max(ratios),
            "ar_speed_over_dflash": statistics.median(1 / x for x in ratios),
            "all_tokens_identical": all(r["same_tokens"] for r in runs),
            "quickstart_speedup": {"median": statistics.median(quick), "min": min(quick), "max": max(quick),
                                   "spread": spread(quick),
                                   "max_spread_3_in_a_row": max(spread(quick[i:i + 3]) for i in range(max(len(quick) - 2, 1)))}}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, (label, t) in enumerate(result["trees"].items()):
        ys = [r["dflash_over_ar_wall"] for r in t["runs"]]
        ax.scatter([i] * len(ys), ys, alpha=0.7)
        ax.hlines(t["summary"]["median_dflash_over_ar_wall"], i - 0.2, i + 0.2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(result["trees"])), list(result["trees"]))
    ax.set_ylabel("DFlash / AR generation wall time")
    ax.set_title("dflash-generate on CPU (smollm2-135m, adaptive), one dot per run", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--step_reps", type=int, default=200, help="steps per engine in the block-1 step comparison")
    p.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                   help="also run another checkout (e.g. before=/work/main), interleaved with this one")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of every run (default: unset, torch's own choice, as the quick start runs)")
    p.add_argument("--note", default="", help="what else ran on the machine (it is shared)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
    from trtllm_dflash.generate import _resolve_target
    from trtllm_dflash.provenance import git_state, record

    trees = {"this": ROOT, **{t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}}
    runs: dict[str, list] = {k: [] for k in trees}
    steps: dict[str, list] = {k: [] for k in trees}
    for i in range(args.repeats):
        for label, tree in trees.items():
            st = step_run(tree, args.step_reps, args.threads)
            steps[label].append(st)
            print(f"[{i + 1}/{args.repeats}] {label}: step at batch 1, AR {1e3 * st['ar_step_s']:.1f} ms, DFlash at "
                  f"block 1 {1e3 * st['dflash_block1_step_s']:.1f} ms = {st['block1_over_ar_step']:.3f}x",
                  file=sys.stderr, flush=True)
    for i in range(args.repeats):
        for label, tree in trees.items():
            r = one_run(tree, args)
            runs[label].append(r)
            print(f"[{i + 1}/{args.repeats}] {label}: AR {r['ar_wall_s']:.2f}s DFlash {r['dflash_wall_s']:.2f}s "
                  f"= {r['dflash_over_ar_wall']:.3f}x, printed speed-up {r['quickstart_speedup']:.2f}x "
                  f"({r['blocks_ran']})", file=sys.stderr, flush=True)
    result = {
        "what": "dflash-generate --mode both on CPU: generation wall time DFlash (adaptive) / AR, same prompts",
        "machine": f"{os.cpu_count()} CPU cores, shared with other jobs (a loaded machine). {args.note}".strip(),
        "threads": args.threads or "default",
        "trees": {k: {"path": str(t), "git": git_state(t), "runs": runs[k], "summary": summary(runs[k]),
                      "block1_steps": steps[k], "block1_summary": {
                          "median_block1_over_ar_step": statistics.median(x["block1_over_ar_step"] for x in steps[k]),
                          "min": min(x["block1_over_ar_step"] for x in steps[k]),
                          "max": max(x["block1_over_ar_step"] for x in steps[k])}}
                  for k, t in trees.items()},
        "provenance": record(checkpoints={"target": _resolve_target(args.target),
                                          "drafter": shipped_drafter_dir("smollm2-135m-dflash")}),
    }
    result["git_sha"] = result["provenance"]["git_sha"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: {**v["summary"], **v["block1_summary"]} for k, v in result["trees"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
