# SPDX-License-Identifier: Apache-2.0
"""Does a sweep's JSONL already hold a run at every level? For recipes that go on where a time limit stopped them
(benchmarks/e2e_smollm2.sh and gpu_smollm2.sh sweep3/sweep4 under RESUME=1): exit 0 when the label has a row at each
concurrency level (the recipe skips that sweep), else drop the label's rows (a sweep cut short is run again whole,
so its levels come from one run) and exit 1.

    python -m trtllm_dflash.bench.resume rows.jsonl "DFlash via dflash-openai" 1,4,16,64
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def complete(path: Path, label: str, levels: set[int]) -> bool:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if levels <= {int(r["settings"]["concurrency"]) for r in rows if r["label"] == label}:
        return True
    if path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["label"] != label))
    return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", type=Path, help="the sweep's rows (dflash-sweep --out)")
    p.add_argument("label", help="the run's --label")
    p.add_argument("levels", help="comma list of concurrency levels the run covers")
    args = p.parse_args(argv)
    if complete(args.jsonl, args.label, {int(c) for c in args.levels.split(",")}):
        print(f"RESUME: {args.label}: every level is in {args.jsonl.name}, skipped", file=sys.stderr)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
