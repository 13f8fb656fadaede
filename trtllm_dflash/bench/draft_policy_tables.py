# SPDX-License-Identifier: Apache-2.0
"""Cost tables of the adaptive draft policy (runtime/draft_policy.py) and the TensorRT-LLM draft_len_schedule
they give at a few per-position acceptance rates.

    python -m trtllm_dflash.bench.draft_policy_tables --target smollm2-135m --drafter smollm2-135m-dflash \\
        --max_batch 8 --gpu_results benchmarks/results/step_bench_h100_v4.json --out tables.json

Measures this device's table for the pair (``Engine.use_adaptive_policy``) and reads the GPU tables that
``step.py --cost_table`` stored; for each, the block the policy picks per batch size and the
schedule, assuming every draft position is accepted with probability r given the previous one was. Schedules are
written as TensorRT-LLM reads them (trtllm.py: each key = the draft length up to that batch size).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from trtllm_dflash.draft_schedule import draft_len_schedule
from trtllm_dflash.runtime.draft_policy import AcceptanceStats, AdaptivePolicy, CostTable, best_block

RATES = (0.5, 0.7, 0.8, 0.9)


def schedules(table: CostTable, block_size: int, max_batch: int) -> dict:
    out = {}
    for r in RATES:
        stats = AcceptanceStats(block_size, prior_rate=r, prior_weight=1e9)   # the prior alone: rate r everywhere
        pol = AdaptivePolicy(block_size, table, stats=stats)
        out[str(r)] = {"expected_tokens_full_block": stats.expected_tokens(block_size),
                       "block_by_batch": {n: best_block(pol, n) for n in sorted(table.seconds)},
                       "draft_len_schedule": draft_len_schedule(pol, max_batch)[0]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--drafter", default="smollm2-135m-dflash")
    p.add_argument("--max_batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--gpu_results", type=Path, help="a step_bench --cost_table results file")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from trtllm_dflash.checkpoints.resolve import shipped_drafter_dir
    from trtllm_dflash.config import RuntimeConfig
    from trtllm_dflash.generate import _resolve_target
    from trtllm_dflash.provenance import record
    from trtllm_dflash.runtime.engine import Engine
    target, drafter = _resolve_target(args.target), shipped_drafter_dir(args.drafter)
    eng = Engine.from_dirs(target, drafter, RuntimeConfig(max_batch_size=args.max_batch, max_seq_len=512))
    pol = eng.use_adaptive_policy(context=args.context)
    here = {"pair": f"{args.target} + {args.drafter}", "cost_table": pol.measured.to_json(),
            "schedules": schedules(pol.measured, eng.block_size, args.max_batch)}
    out = {"this_device": here, "gpu": {},
           "provenance": record(["python", "-m", "trtllm_dflash.bench.draft_policy_tables", *(argv if argv is not None else sys.argv[1:])],
                                checkpoints={"target": target, "drafter": drafter})}
    if args.gpu_results:
        res = json.loads(args.gpu_results.read_text())
        for model, s in res["summary"].items():
            if "cost_table" in s:
                t = CostTable.from_json(s["cost_table"])
                out["gpu"][model] = {"source": str(args.gpu_results), "gpu": res["meta"]["gpu"], "cost_table": s["cost_table"],
                                     "schedules": schedules(t, int(s["block_size"]), max(t.seconds))}
    out["git_sha"] = out["provenance"]["git_sha"]
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, d in [("this device", here)] + list(out["gpu"].items()):
        print(name, {r: (v["block_by_batch"], v["draft_len_schedule"]) for r, v in d["schedules"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
