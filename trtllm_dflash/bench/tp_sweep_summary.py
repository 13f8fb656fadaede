# SPDX-License-Identifier: Apache-2.0
"""dflash-sweep rows of one deployment at several TP sizes (``benchmarks/tp_sweep.sh``: the label names the mode
and the TP size, e.g. "AR TP 2") -> one JSON with the rows and a ``summary``: per mode, TP size and concurrency
the tokens/s per user and per GPU, and what each TP size buys over TP 1 of the same mode.

    python -m trtllm_dflash.bench.tp_sweep_summary tp_sweep_h200.jsonl --out benchmarks/results/tp_sweep_h200.json

``tp{N}_over_tp1_{mode}_user_c1``: tokens/s per user at concurrency 1 over TP 1's (latency: what a user of a
TP N deployment sees; > 1 is faster); ``tp{N}_over_tp1_{mode}_gpu_c{top}``: tokens/s per GPU at the highest
concurrency over TP 1's (cost: < 1 means each GPU does less work than alone).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtllm_dflash.errors import DFlashError, exit_code
from trtllm_dflash.provenance import record


def summarize(rows: list[dict]) -> dict:
    at = {}
    for r in rows:
        s, m = r["settings"], r["metrics"]
        at[s["mode"], int(s["tp_size"]), int(s["concurrency"])] = {"tok_s_user": m["tok_s_user"],
                                                                   "tok_s_gpu": m["tok_s_gpu"]}
    modes = sorted({k[0] for k in at})
    tps, levels = sorted({k[1] for k in at}), sorted({k[2] for k in at})
    table = {mode: {f"tp{tp}": {f"c{c}": at[mode, tp, c] for c in levels if (mode, tp, c) in at} for tp in tps}
             for mode in modes}
    ratios = {}
    for mode in modes:
        for tp in tps:
            if tp == 1 or (mode, 1, levels[0]) not in at:
                continue
            for metric, c, tag in (("tok_s_user", levels[0], "user"), ("tok_s_gpu", levels[-1], "gpu")):
                base, got = at.get((mode, 1, c)), at.get((mode, tp, c))
                if base and got and base[metric] and got[metric] is not None:
                    ratios[f"tp{tp}_over_tp1_{mode}_{tag}_c{c}"] = round(got[metric] / base[metric], 3)
    gpus = sorted({r["settings"].get("gpu_name") or "cpu" for r in rows})
    return {"gpu": gpus[0] if len(gpus) == 1 else gpus, "tp_sizes": tps, "concurrency": levels, "by_mode": table,
            "ratios": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.tp_sweep_summary",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="the JSONL dflash-sweep wrote, all TP sizes")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.sweep.read_text().splitlines() if line.strip()]
    if 1 not in {int(r["settings"]["tp_size"]) for r in rows}:
        raise DFlashError("sweep", f"{args.sweep} has no TP 1 rows", "run the TP 1 sweep of the same deployment too")
    out = {"summary": summarize(rows), "rows": rows, "provenance": record()}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"]["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
