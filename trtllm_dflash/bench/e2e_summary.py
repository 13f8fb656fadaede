# SPDX-License-Identifier: Apache-2.0
"""dflash-sweep rows (AR, DFlash fixed, DFlash adaptive; several datasets and concurrencies) -> one JSON with
the rows and a ``summary``: tokens/s per user of each mode and DFlash / AR at each (dataset, concurrency), and
``dflash_over_ar_tok_s_b1_humaneval`` (goal: >= 2.0 on an H100) and its twin through dflash-openai.

    python -m trtllm_dflash.bench.e2e_summary --sweep rows.jsonl --out benchmarks/results/e2e_smollm2_h100.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_dflash.provenance import record


MODES = ("ar", "dflash", "adaptive")
PATHS = ("inprocess", "openai")


def summarize(rows: list[dict], api_server_count: int = 1, notes: tuple[str, ...] | list[str] = ()) -> dict:
    """Per (dataset, concurrency): each mode's tokens/s per user and tokens/s, in-process and through dflash-openai,
    and DFlash / AR in each path; plus the headline ratios at concurrency 1 and the worst adaptive / AR.
    ``missing`` names every (dataset, concurrency, path, mode) of the grid the rows span that has no row, so a run
    cut short says what it lacks instead of reading as complete."""
    tok = {}
    for r in rows:
        s = r["settings"]
        # rows written before dflash-sweep --backend became --server record it as "backend"
        path = "openai" if s.get("server", s.get("backend")) == "openai" else "inprocess"
        tok.setdefault((s["dataset"], int(s["concurrency"])), {}).setdefault(path, {})[s["mode"]] = {
            "tok_s_user": r["metrics"]["tok_s_user"], "tok_s_gpu": r["metrics"].get("tok_s_gpu"),
            "acceptance_length": r["metrics"].get("acceptance_length_mean")}
    levels, worst_adaptive = {}, {}
    for (dataset, c), paths in sorted(tok.items()):
        entry = {}
        for path, modes in paths.items():
            e = dict(modes)
            ar = (modes.get("ar") or {}).get("tok_s_user")
            for m in ("dflash", "adaptive"):
                if ar and m in modes and modes[m]["tok_s_user"] is not None:
                    e[f"{m}_over_ar"] = round(modes[m]["tok_s_user"] / ar, 3)
            if "adaptive_over_ar" in e:
                worst_adaptive[path] = min(worst_adaptive.get(path, float("inf")), e["adaptive_over_ar"])
            entry[path] = e
        if {"openai", "inprocess"} <= entry.keys():   # what the served path keeps of the engine's tokens/s
            entry["openai_over_inprocess"] = {
                m: round(paths["openai"][m]["tok_s_gpu"] / paths["inprocess"][m]["tok_s_gpu"], 3)
                for m in paths["openai"] if m in paths["inprocess"] and paths["inprocess"][m]["tok_s_gpu"]
                and paths["openai"][m]["tok_s_gpu"] is not None}
        levels[f"{dataset}_c{c}"] = entry

    def ratio(key, path, mode="dflash"):
        return levels.get(key, {}).get(path, {}).get(f"{mode}_over_ar")

    def served(key, mode="ar"):
        return levels.get(key, {}).get("openai_over_inprocess", {}).get(mode)

    return {"levels": levels,
            "dflash_over_ar_tok_s_b1_humaneval": ratio("humaneval_c1", "inprocess"),
            "adaptive_over_ar_tok_s_b1_humaneval": ratio("humaneval_c1", "inprocess", "adaptive"),
            "dflash_over_ar_tok_s_b1_mtbench": ratio("mtbench_c1", "inprocess"),
            "dflash_over_ar_tok_s_b1_humaneval_openai": ratio("humaneval_c1", "openai"),
            "adaptive_over_ar_tok_s_b1_humaneval_openai": ratio("humaneval_c1", "openai", "adaptive"),
            "dflash_over_ar_tok_s_b1_mtbench_openai": ratio("mtbench_c1", "openai"),
            "min_adaptive_over_ar_inprocess": worst_adaptive.get("inprocess"),
            "min_adaptive_over_ar_openai": worst_adaptive.get("openai"),
            # AR sends one token per update: the most frontend work per token
            "openai_over_inprocess_ar_c64_humaneval": served("humaneval_c64"),
            "openai_over_inprocess_ar_c64_mtbench": served("mtbench_c64"),
            "api_server_count": api_server_count,
            "missing": [f"{key} {path} {m}" for key in levels for path in PATHS for m in MODES
                        if m not in levels[key].get(path, {})],
            "notes": list(notes)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", type=Path, nargs="+", required=True,
                   help="JSONL written by dflash-sweep; several (e.g. one per dataset, run on GPUs of their own) are "
                        "joined")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--api_server_count", type=int, default=1,
                   help="dflash-openai's --api_server_count in the served rows (recorded in the summary)")
    p.add_argument("--deployment_dir", type=Path, default=None,
                   help="the deployment directory the sweep served: the sha256 of its target/ and drafter/ go in the "
                        "provenance, so the file names the checkpoints it measured")
    p.add_argument("--note", action="append", default=[], help="a line for the summary's notes (repeatable)")
    args = p.parse_args(argv)
    rows = []
    for sweep in args.sweep:
        got = [json.loads(line) for line in sweep.read_text().splitlines() if line.strip()]
        if not got:
            print(f"error: --sweep: {sweep} holds no rows. Fix: run the sweep first", file=sys.stderr)
            return 2
        rows += got
    checkpoints = {}
    if args.deployment_dir is not None:
        checkpoints = {role: args.deployment_dir / role for role in ("target", "drafter")}
        missing = [str(d) for d in checkpoints.values() if not d.is_dir()]
        if missing:
            print(f"error: --deployment_dir: {missing[0]} is not a folder. Fix: pass the dflash-build output the "
                  "sweep served", file=sys.stderr)
            return 2
    out = {"summary": summarize(rows, args.api_server_count, args.note), "rows": rows, "provenance": record(checkpoints=checkpoints)}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
