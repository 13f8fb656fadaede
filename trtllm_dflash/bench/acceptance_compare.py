# SPDX-License-Identifier: Apache-2.0
"""Two drafters' acceptance runs compared prompt by prompt: is B's greedy tau above A's beyond the spread of prompts?

    python -m trtllm_dflash.bench.acceptance_compare A.json B.json [--block_size 16] [--out cmp.json]

A and B are ``trtllm_dflash.bench.acceptance`` outputs for the same target and prompts. Greedy decoding gives the
target's own tokens whatever the drafter, so each prompt's text is the same in both runs and the per-prompt
difference of tau (accepted tokens per verify step) is the drafter's alone: the mean of those differences with a
bootstrap 95% interval over prompts (seeded), and how many prompts went up, down or stayed. A prompt whose output
length differs between the runs (bf16 rounding can change a greedy token on the GPU) is counted and still paired.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
from pathlib import Path

from .. import provenance
from ..errors import DFlashError, exit_code
from .acceptance import request_tau


def _per_prompt(res: dict, path: str, dataset: str, block: str) -> list[tuple[int, int]]:
    entry = res[dataset].get("block_sizes", {}).get(block)
    if entry is None:
        raise DFlashError(path, f"{dataset} has no block size {block} (it has {sorted(res[dataset].get('block_sizes', {}))})",
                          "pass a --block_size both runs measured")
    if "greedy_per_prompt" not in entry:
        raise DFlashError(path, f"{dataset} block {block} records no per-prompt counts",
                          "re-run trtllm_dflash.bench.acceptance (it records them since this tool exists)")
    return [tuple(p) for p in entry["greedy_per_prompt"]]


def bootstrap_ci(diffs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of ``diffs`` by resampling prompts with replacement."""
    rng, n = random.Random(seed), len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def compare(a: dict, b: dict, a_name: str, b_name: str, block_size: int) -> dict:
    datasets = [d for d in a if isinstance(a[d], dict) and "block_sizes" in a[d]]
    if not datasets:
        raise DFlashError(a_name, "holds no dataset results with block sizes", "pass an acceptance JSON, not its .meta.json")
    missing = [d for d in datasets if d not in b]
    if missing:
        raise DFlashError(b_name, f"has no {missing[0]} results", "compare runs over the same datasets")
    out = {}
    for d in datasets:
        pa, pb = _per_prompt(a, a_name, d, str(block_size)), _per_prompt(b, b_name, d, str(block_size))
        if len(pa) != len(pb):
            raise DFlashError(b_name, f"{d} has {len(pb)} prompts, {a_name} has {len(pa)}",
                              "compare runs over the same prompts (the same --n)")
        pairs = [(request_tau(*x), request_tau(*y), x[0] == y[0]) for x, y in zip(pa, pb)]
        pairs = [(ta, tb, same) for ta, tb, same in pairs if ta is not None and tb is not None]
        diffs = [tb - ta for ta, tb, _ in pairs]
        lo, hi = bootstrap_ci(diffs)
        out[d] = {"prompts": len(pairs), "tau_a": round(statistics.fmean(t for t, _, _ in pairs), 4),
                  "tau_b": round(statistics.fmean(t for _, t, _ in pairs), 4),
                  "mean_diff": round(statistics.fmean(diffs), 4), "ci95": [round(lo, 4), round(hi, 4)],
                  "b_higher": sum(x > 0 for x in diffs), "b_lower": sum(x < 0 for x in diffs),
                  "equal": sum(x == 0 for x in diffs), "output_length_differs": sum(not s for _, _, s in pairs)}
        out[d]["verdict"] = ("B higher" if lo > 0 else "B lower" if hi < 0 else "no difference beyond the prompts' spread")
    return out


def markdown(result: dict) -> str:
    lines = ["| dataset | prompts | tau A | tau B | B - A (95% CI) | B higher / lower / equal | verdict |",
             "|---|---|---|---|---|---|---|"]
    for d, r in result.items():
        lines.append(f"| {d} | {r['prompts']} | {r['tau_a']:.3f} | {r['tau_b']:.3f} | {r['mean_diff']:+.3f} "
                     f"({r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}) | {r['b_higher']} / {r['b_lower']} / {r['equal']} | "
                     f"{r['verdict']} |")
    return "\n".join(lines)


def _read(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise DFlashError(path, "does not exist", "pass an acceptance JSON (python -m trtllm_dflash.bench.acceptance --out)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise DFlashError(path, f"is not JSON ({err})", "pass an acceptance JSON") from None


def main(argv: list[str] | None = None) -> int:
    from .helpformat import HelpFormatter
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.acceptance_compare",
                                description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter,
                                epilog="examples:\n  python -m trtllm_dflash.bench.acceptance_compare "
                                "v6.json soup.json\n  python -m trtllm_dflash.bench.acceptance_compare "
                                "v6.json soup.json --block_size 8 --out cmp.json")
    p.add_argument("a", help="the first run's acceptance JSON (the baseline)")
    p.add_argument("b", help="the second run's")
    p.add_argument("--block_size", type=int, default=16, help="which block size's per-prompt counts to pair")
    p.add_argument("--out", help="also write the comparison as JSON (and the table as .md beside it)")
    a = p.parse_args(argv)
    result = compare(_read(a.a), _read(a.b), a.a, a.b, a.block_size)
    table = markdown(result)
    print(table)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        # the inputs' digests tie the comparison to the two runs it read; the record, to the code that paired them
        inputs = {"a": a.a, "b": a.b}
        record = provenance.record()
        record["inputs_sha256"] = {k: hashlib.sha256(Path(v).read_bytes()).hexdigest() for k, v in inputs.items()}
        out.write_text(json.dumps({**inputs, "block_size": a.block_size, "greedy": result, "provenance": record},
                                  indent=2) + "\n")
        out.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
