# SPDX-License-Identifier: Apache-2.0
"""dflash-sweep rows (AR, DFlash fixed, DFlash adaptive; several datasets and concurrencies) -> one JSON with
the rows and a ``summary``: tokens/s per user of each mode and DFlash / AR at each (dataset, concurrency), and
``dflash_over_ar_tok_s_b1_humaneval`` (the issue #24 goal: >= 2.0 on an H100).

    python benchmarks/e2e_summary.py --sweep rows.jsonl --out benchmarks/results/e2e_smollm2_h100.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trtllm_dflash.provenance import record  # noqa: E402


def summarize(rows: list[dict]) -> dict:
    tok = {}
    for r in rows:
        s = r["settings"]
        tok.setdefault((s["dataset"], int(s["concurrency"])), {})[s["mode"]] = {
            "tok_s_user": r["metrics"]["tok_s_user"], "acceptance_length": r["metrics"].get("acceptance_length_mean")}
    levels = {}
    for (dataset, c), modes in sorted(tok.items()):
        ar = (modes.get("ar") or {}).get("tok_s_user")
        entry = {m: v for m, v in modes.items()}
        for m in ("dflash", "adaptive"):
            if ar and m in modes and modes[m]["tok_s_user"] is not None:
                entry[f"{m}_over_ar"] = round(modes[m]["tok_s_user"] / ar, 3)
        levels[f"{dataset}_c{c}"] = entry
    b1 = levels.get("humaneval_c1", {})
    return {"levels": levels, "dflash_over_ar_tok_s_b1_humaneval": b1.get("dflash_over_ar"),
            "adaptive_over_ar_tok_s_b1_humaneval": b1.get("adaptive_over_ar"),
            "dflash_over_ar_tok_s_b1_mtbench": levels.get("mtbench_c1", {}).get("dflash_over_ar")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", type=Path, required=True, help="JSONL written by dflash-sweep")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.sweep.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"error: --sweep: {args.sweep} holds no rows. Fix: run the sweep first", file=sys.stderr)
        return 2
    out = {"summary": summarize(rows), "rows": rows, "provenance": record()}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
