# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel scaling from ``bench/tp.py`` runs of one machine: each run is one TP size (``mpirun -n N``), this
joins them and divides every step by the TP 1 step of the same model, mode and batch.

    python -m trtllm_dflash.bench.tp_scaling tp1.json tp2.json [tp4.json] --out benchmarks/results/tp_scaling.json

The summary holds the ratios the TP goals are stated in (``qwen3_tp2_over_tp1_ar_b1``: <= 0.6 is the goal, 0.5
would be perfect scaling of the weight reads), the one-shot all-reduce's median us per call at decode sizes
(<= 64 KB; NCCL's where the group had no one-shot), and the GPU. A ratio whose runs are missing is None.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ..provenance import record

DECODE_BYTES = 64 * 1024


def summarize(runs: list[dict]) -> dict:
    steps = {(r["model"], r["tp_size"], r["mode"], r["batch"]): r["step_ms"] for run in runs for r in run["rows"]}
    ratios = {}
    for (model, tp, mode, batch), ms in sorted(steps.items()):
        base = steps.get((model, 1, mode, batch))
        if tp > 1 and base:
            ratios[f"{model}_tp{tp}_over_tp1_{mode}_b{batch}"] = round(ms / base, 3)

    def key(model: str, tp: int, mode: str = "ar", batch: int = 1):
        return ratios.get(f"{model}_tp{tp}_over_tp1_{mode}_b{batch}")

    small = [r for run in runs for r in run.get("allreduce_rows", []) if r["bytes"] <= DECODE_BYTES]
    per_call = [r.get("oneshot_us", r["nccl_us"]) for r in small]
    gpus = sorted({run["gpu"] for run in runs})
    return {"gpu": gpus[0] if len(gpus) == 1 else gpus, "tp_sizes": sorted({run["tp_size"] for run in runs}),
            "qwen3_tp2_over_tp1_ar_b1": key("qwen3-8b", 2), "qwen3_tp4_over_tp1_ar_b1": key("qwen3-8b", 4),
            "qwen3_tp2_over_tp1_dflash_b1": key("qwen3-8b", 2, "dflash"),
            "qwen3_tp4_over_tp1_dflash_b1": key("qwen3-8b", 4, "dflash"),
            "gptoss120b_tp2_over_tp1_ar_b1": key("gpt-oss-120b", 2),
            "allreduce_us_p50": round(statistics.median(per_call), 2) if per_call else None,
            "allreduce_strategy": sorted({run["allreduce"]["strategy"] for run in runs if run["tp_size"] > 1}),
            "tokens_equal_tp1": all(run["tiny_tp_equals_tp1"] for run in runs), "ratios": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.tp_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench/tp.py result files, one per TP size, TP 1 among them")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    if 1 not in {run["tp_size"] for run in runs}:
        print("error: runs: none of them is TP 1. Fix: add the mpirun -n 1 run of the same machine", file=sys.stderr)
        return 2
    # the runs keep their own record (command, GPU, commit): this file names them
    out = {"summary": summarize(runs), "run_files": [str(path) for path in args.runs], "provenance": record()}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out["summary"].items() if k != "ratios"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
