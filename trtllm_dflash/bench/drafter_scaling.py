# SPDX-License-Identifier: Apache-2.0
"""Drafter acceptance against the tokens it was trained on: the fit, what a goal needs, and the plot.

In: a training run's ``summary.json`` whose ``scaling`` section lists, per drafter version of one lineage, the
response tokens trained on by that version and all before it (``tokens_trained_in_all``) and its greedy acceptance
per dataset (``tau_greedy_b16``). Versions that add no tokens (a weighted mean of two others) are left out there:
they are a start, not a point.

Out: the tau gained per doubling of tokens from each version to the next, the least-squares slope of tau on
log2(tokens), and for each goal the multiple of the last version's tokens that slope needs (printed, and written as
``<out>.json``); ``<out>.png`` draws the points, the fitted lines and the goals, so whether tokens are still the
limit (points on the line) or something else is (points bending below it) is seen at a glance.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

from .. import provenance
from ..errors import DFlashError, exit_code
from .helpformat import HelpFormatter

EPILOG = """examples:
  python -m trtllm_dflash.bench.drafter_scaling benchmarks/results/train_smollm2_v9_h200x4/summary.json \\
      --goal humaneval=3.5 --goal mtbench=2.5 --out benchmarks/results/train_smollm2_v9_h200x4/scaling
"""
LABELS = {"humaneval": "HumanEval", "mtbench": "MT-Bench"}


def fit(tokens: dict[str, float], tau: dict[str, float]) -> tuple[float, float]:
    """Least squares tau = a + b * log2(tokens) over the versions both name: (a, b)."""
    versions = [v for v in tokens if v in tau]
    if len(versions) < 2:
        raise DFlashError("scaling", f"names {len(versions)} version(s) with both tokens and tau",
                          "a fit needs two or more trained versions")
    xs, ys = [math.log2(tokens[v]) for v in versions], [tau[v] for v in versions]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise DFlashError("scaling.tokens_trained_in_all", "gives every version the same token count",
                          "list the tokens each version had seen in all")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def scaling(section: dict, goals: dict[str, float]) -> dict:
    """The per-step gains, the fit per dataset and what each goal needs, from a summary's ``scaling`` section."""
    tokens = section["tokens_trained_in_all"]
    versions = list(tokens)                     # in the order trained
    out = {"versions": versions, "tokens_trained_in_all": tokens, "datasets": {}}
    for ds, tau in section["tau_greedy_b16"].items():
        a, b = fit(tokens, tau)
        steps = {f"{p}_to_{n}": round((tau[n] - tau[p]) / math.log2(tokens[n] / tokens[p]), 3)
                 for p, n in zip(versions, versions[1:]) if p in tau and n in tau}
        last = [v for v in versions if v in tau][-1]
        row = {"tau": tau, "tau_per_doubling_steps": steps, "fit": {"intercept": round(a, 4), "slope": round(b, 4)},
               "last_version": last}
        if ds in goals and b > 0:
            need = 2 ** ((goals[ds] - tau[last]) / b)
            row["goal"] = {"tau": goals[ds], "tokens_multiple_of_last": round(need, 2),
                           "tokens_needed": round(need * tokens[last]), "met": tau[last] >= goals[ds]}
        out["datasets"][ds] = row
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = result["tokens_trained_in_all"]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    hi = max(tokens.values())
    for (ds, row), color in zip(result["datasets"].items(), ("tab:blue", "tab:orange", "tab:green")):
        vs = [v for v in result["versions"] if v in row["tau"]]
        xs, ys = [tokens[v] / 1e6 for v in vs], [row["tau"][v] for v in vs]
        label = LABELS.get(ds, ds)
        ax.plot(xs, ys, "o", color=color, label=f"{label} (slope {row['fit']['slope']:.2f} per doubling)")
        for v, x, y in zip(vs, xs, ys):
            ax.annotate(v, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7, color=color)
        goal = row["goal"] if "goal" in row and not row["goal"]["met"] else None   # a goal still to reach
        end = max(hi, goal["tokens_needed"]) if goal else hi
        grid = [min(tokens.values()) * (end / min(tokens.values())) ** (i / 50) for i in range(51)]
        a, b = row["fit"]["intercept"], row["fit"]["slope"]
        ax.plot([g / 1e6 for g in grid], [a + b * math.log2(g) for g in grid], "--", color=color, lw=1)
        if goal:
            ax.axhline(goal["tau"], color=color, lw=0.8, ls=":")
            ax.annotate(f"{label} goal {goal['tau']}: ~{goal['tokens_needed'] / 1e6:,.0f} M tokens "
                        f"({goal['tokens_multiple_of_last']:.1f}x {row['last_version']})",
                        (goal["tokens_needed"] / 1e6, goal["tau"]), textcoords="offset points", xytext=(-250, 5),
                        fontsize=7, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("response tokens trained on, all versions together (M, log scale)")
    ax.set_ylabel("greedy acceptance tau, block 16")
    ax.set_title("Drafter acceptance vs training tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.bench.drafter_scaling", description=__doc__,
                                epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("summary", type=Path, help="a training run's summary.json with a 'scaling' section")
    p.add_argument("--goal", action="append", default=[], metavar="DATASET=TAU",
                   help="a dataset's tau goal, e.g. humaneval=3.5 (repeatable)")
    p.add_argument("--out", type=Path, help="write <out>.json and <out>.png (default: print only)")
    return p.parse_args(argv)


def _goals(items: list[str]) -> dict[str, float]:
    goals = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            goals[name] = float(value)
        except ValueError:
            raise DFlashError("--goal", f"is {item!r}", "write DATASET=TAU, e.g. --goal humaneval=3.5") from None
    return goals


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.summary.is_file():
        raise DFlashError("summary", f"{args.summary} does not exist", "pass a training run's summary.json")
    raw = args.summary.read_bytes()   # parsed and digested from the same bytes
    section = json.loads(raw).get("scaling")
    if not section:
        raise DFlashError("summary", f"{args.summary} has no 'scaling' section",
                          "pass the summary of a run that lists its lineage's tokens and tau")
    result = scaling(section, _goals(args.goal))
    for ds, row in result["datasets"].items():
        steps = ", ".join(f"{k} {v:+.2f}" for k, v in row["tau_per_doubling_steps"].items())
        line = f"{LABELS.get(ds, ds)}: slope {row['fit']['slope']:.3f} tau per doubling ({steps})"
        if "goal" in row:
            g = row["goal"]
            line += (f"; goal {g['tau']}: met by {row['last_version']}" if g["met"] else
                     f"; goal {g['tau']}: needs ~{g['tokens_multiple_of_last']:.1f}x {row['last_version']}'s tokens "
                     f"({g['tokens_needed'] / 1e6:,.0f} M)")
        print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result["source"] = str(args.summary)
        result["provenance"] = provenance.record()
        result["provenance"]["inputs_sha256"] = {"summary": hashlib.sha256(raw).hexdigest()}
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result, args.out.with_suffix(".png"))
        print(f"wrote {args.out.with_suffix('.json')}, {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
