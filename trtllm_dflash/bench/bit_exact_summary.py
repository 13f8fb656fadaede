# SPDX-License-Identifier: Apache-2.0
"""The batch-invariant mode's results in one file (RuntimeConfig.batch_invariant; `kernels_gpu.sh bitexact` makes
the inputs): bf16 DFlash == AR on the real SmolLM2 pair and the tiny pairs (cuda_check), greedy answers under load
== alone (soak), and the mode's cost per decode step (step_bench with --batch_invariant on and off, same GPU).

    python -m trtllm_dflash.bench.bit_exact_summary --cuda_check cc.json --step_on on.json --step_off off.json \\
        [--soak soak.json] --out benchmarks/results/bit_exact_h100.json

summary: bf16_identical_prompts / bf16_prompts (SmolLM2, the worst of blocks 16, 8, 4), tiny_bf16_identical /
tiny_bf16_runs, load_equals_alone_fraction (None without --soak), ar_step_cost_ratio and dflash_step_cost_ratio
(the largest on/off step-time ratio over the models and batches measured; per row under cost).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from trtllm_dflash.errors import DFlashError
from trtllm_dflash.provenance import record


def _load(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DFlashError(what, f"cannot read {path}: {err}", f"pass the JSON file {what} wrote") from None


def cost_rows(on: dict, off: dict) -> list[dict]:
    """step_bench rows matched by (model, mode, batch): step_ms with the mode on over off."""
    if on["meta"].get("gpu") != off["meta"].get("gpu"):
        raise DFlashError("--step_off", f"ran on {off['meta'].get('gpu')}, --step_on on {on['meta'].get('gpu')}",
                          "time both on the same GPU")
    base = {(r["model"], r["mode"], r["batch"]): r["step_ms"] for r in off["rows"]}
    return [{"model": r["model"], "mode": r["mode"], "batch": r["batch"], "on_ms": r["step_ms"],
             "off_ms": base[key], "ratio": r["step_ms"] / base[key]}
            for r in on["rows"] if (key := (r["model"], r["mode"], r["batch"])) in base]


def summarize(cc: dict, on: dict, off: dict, soak: dict | None) -> dict:
    bf16 = [r for r in cc.get("smollm2", []) if r["dtype"] == "bfloat16"]
    if not bf16 or not bf16[0].get("batch_invariant"):
        raise DFlashError("--cuda_check", "has no bf16 SmolLM2 row run batch-invariant",
                          "run dflash-bench cuda_check --smollm2 (--batch_invariant on, the default)")
    row = bf16[0]
    same = min(v for k, v in row.items() if k.startswith("dflash_eq_ar_greedy"))
    tiny = [r for r in cc.get("tiny", []) if r["dtype"] == "bfloat16"]
    costs = cost_rows(on, off)
    if not costs:
        raise DFlashError("--step_on", "shares no (model, mode, batch) row with --step_off", "run the same arguments")
    load = None
    if soak is not None:
        g = soak["checks"]["greedy_equals_solo"]
        load = (g["compared"] - g["wrong"]) / g["compared"] if g["compared"] else None
    return {"bf16_identical_prompts": same, "bf16_prompts": row["n_prompts"],
            "smollm2_bf16": {k: v for k, v in row.items() if k.startswith(("dflash_eq", "ar_alone", "dflash_alone"))},
            "tiny_bf16_identical": sum(r["dflash_eq_ar_greedy"] for r in tiny) + sum(r["dflash_eq_ar_sampled"] for r in tiny),
            "tiny_bf16_runs": 2 * sum(r["n"] for r in tiny),
            "load_equals_alone_fraction": load,
            "ar_step_cost_ratio": max(c["ratio"] for c in costs if c["mode"] == "ar"),
            "dflash_step_cost_ratio": max(c["ratio"] for c in costs if c["mode"] == "dflash"),
            "gpu": on["meta"].get("gpu")}, costs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cuda_check", type=Path, required=True)
    p.add_argument("--step_on", type=Path, required=True, help="step_bench.py --batch_invariant on")
    p.add_argument("--step_off", type=Path, required=True, help="step_bench.py --batch_invariant off")
    p.add_argument("--soak", type=Path, help="soak.py's report (greedy answers under load vs alone)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        summary, costs = summarize(_load(args.cuda_check, "--cuda_check"), _load(args.step_on, "--step_on"),
                                   _load(args.step_off, "--step_off"),
                                   _load(args.soak, "--soak") if args.soak else None)
    except DFlashError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = {"summary": summary, "cost": costs,
           "provenance": record(["python", "-m", "trtllm_dflash.bench.bit_exact_summary", *(argv if argv is not None else sys.argv[1:])])}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
