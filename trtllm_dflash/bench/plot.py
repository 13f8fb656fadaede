# SPDX-License-Identifier: Apache-2.0
"""dflash-plot: the throughput-vs-interactivity Pareto plot of one or more sweeps, and the throughput
ratio at equal interactivity, the way NVIDIA states DFlash's claim ("N x the throughput at X tok/s/user").

In: dflash-sweep JSONL files (and trtllm-bench / benchmark_serving reports, see ``bench.results``).
Out: ``<out_dir>/pareto.png`` (tok/s/gpu vs tok/s/user, one line per run label, concurrency at each
point), ``iso_interactivity.png`` and ``iso_interactivity.md`` (the ratio table, also printed).

Iso-interactivity ratio of run R over baseline B: take each curve's Pareto front (points that no other
point of the same run beats on both axes), interpolate both linearly in log-log space at every measured
x of either front inside the x range they share, and divide. No extrapolation: outside the overlap
there is no ratio.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..errors import DFlashError, exit_code
from .helpformat import HelpFormatter
from .results import Point, load

EPILOG = """examples:
  dflash-plot sweep.jsonl --out_dir plots/                                  # AR and DFlash rows of one file
  dflash-plot ar.jsonl dflash.jsonl 'EAGLE-3=trtllm/eagle3_c*.json' --out_dir plots/ --baseline AR
  dflash-plot sweep.jsonl 'EAGLE-3=bs/eagle3_c*.json' --num_gpus 8 --x tok_s_user_e2e --log
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-plot", description=__doc__, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    p.add_argument("results", nargs="+", help="PATH or LABEL=PATH (glob allowed): sweep JSONL or report JSON")
    p.add_argument("--out_dir", type=Path, default=Path("."), help="where the PNGs and the table go")
    p.add_argument("--baseline", help="label the others are divided by [AR if present, else the first]")
    p.add_argument("--x", choices=("tok_s_user", "tok_s_user_e2e"), default="tok_s_user",
                   help="interactivity: 1/TPOT, or output tokens / end-to-end latency")
    p.add_argument("--num_gpus", type=int, help="GPU count of benchmark_serving results (they do not record it)")
    p.add_argument("--log", action="store_true", help="log-scale axes")
    p.add_argument("--title", default="Throughput vs interactivity", help="title of pareto.png")
    return p.parse_args(argv)


def curves(points: list[Point], x: str) -> dict[str, list[tuple[float, float, int]]]:
    """label -> [(x, tok/s/gpu, concurrency)] in concurrency order; points missing either value are dropped."""
    out: dict[str, list[tuple[float, float, int]]] = {}
    for pt in sorted(points, key=lambda p: p.concurrency):
        xv, yv = getattr(pt, x), pt.tok_s_gpu
        if xv and yv:
            out.setdefault(pt.label, []).append((float(xv), float(yv), pt.concurrency))
    return out


def pareto_front(curve: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Points no other point beats on both axes (higher is better on both), sorted by x ascending."""
    front, best_y = [], -np.inf
    for pt in sorted(curve, key=lambda p: (-p[0], -p[1])):
        if pt[1] > best_y:
            front.append(pt)
            best_y = pt[1]
    return front[::-1]


def interp_loglog(front: list[tuple[float, float, int]], xq: np.ndarray) -> np.ndarray:
    xs = np.log([p[0] for p in front])
    ys = np.log([p[1] for p in front])
    return np.exp(np.interp(np.log(xq), xs, ys))


def iso_ratio(base: list[tuple[float, float, int]], run: list[tuple[float, float, int]]) -> list[dict]:
    """At each measured x of either front inside their shared x range: both throughputs and run / base."""
    fb, fr = pareto_front(base), pareto_front(run)
    if not fb or not fr:
        return []
    lo, hi = max(fb[0][0], fr[0][0]), min(fb[-1][0], fr[-1][0])
    xq = np.array(sorted({p[0] for p in fb + fr if lo <= p[0] <= hi}))
    if xq.size == 0:
        return []
    yb, yr = interp_loglog(fb, xq), interp_loglog(fr, xq)
    return [{"tok_s_user": float(x), "base_tok_s_gpu": float(b), "run_tok_s_gpu": float(r), "ratio": float(r / b)}
            for x, b, r in zip(xq, yb, yr)]


def ratio_table(base_label: str, ratios: dict[str, list[dict]], x: str) -> str:
    lines = []
    for label, rows in ratios.items():
        lines += [f"### {label} vs {base_label}: throughput at equal interactivity", ""]
        if not rows:
            lines += [f"(no overlap in {x}: the two curves share no interactivity range)", ""]
            continue
        lines += [f"| {x} | {base_label} tok/s/gpu | {label} tok/s/gpu | ratio |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['tok_s_user']:.1f} | {r['base_tok_s_gpu']:.1f} | {r['run_tok_s_gpu']:.1f} | "
                  f"{r['ratio']:.2f}x |" for r in rows]
        best = max(rows, key=lambda r: r["ratio"])
        lines += ["", f"max {best['ratio']:.2f}x at {best['tok_s_user']:.1f} {x}", ""]
    return "\n".join(lines)


def points_table(data: dict[str, list[tuple[float, float, int]]], points: list[Point], x: str) -> str:
    al = {(p.label, p.concurrency): p.acceptance_length for p in points}
    lines = [f"| run | concurrency | {x} | tok/s/gpu | acceptance length |", "|---|---:|---:|---:|---:|"]
    for label, curve in data.items():
        for xv, yv, c in curve:
            a = al.get((label, c))
            lines.append(f"| {label} | {c} | {xv:.1f} | {yv:.1f} | {'-' if a is None else f'{a:.2f}'} |")
    return "\n".join(lines)


def _axes(plt, title: str, xlabel: str, ylabel: str, log: bool):
    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3, which="both")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    return fig, ax


def iso_figure(plt, ratios: dict[str, list[dict]], base_label: str, xlabel: str):
    """The ratio curves; a run whose curve shares no interactivity range with the base's gets a line in the picture
    saying so (without it, empty axes read as a broken plot)."""
    fig, ax = _axes(plt, f"Throughput ratio at equal interactivity (vs {base_label})", xlabel,
                    f"tok/s/gpu ratio over {base_label}", False)
    ax.axhline(1.0, color="gray", linewidth=1)
    for label, rows in ratios.items():
        if rows:
            ax.plot([r["tok_s_user"] for r in rows], [r["ratio"] for r in rows], marker="o", label=label)
    if any(ratios.values()):
        ax.legend()
    apart = [label for label, rows in ratios.items() if not rows]
    if apart:
        ax.text(0.5, 0.5, "\n".join(f"{label}: no overlap with {base_label} in tok/s/user" for label in apart)
                + "\n(no ratio without extrapolating; pareto.png shows both curves)",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="dimgray")
    return fig


def draw(data, ratios, base_label: str, args) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")   # files only; no display needed on a GPU host
    import matplotlib.pyplot as plt

    xlabel = "tok/s/user (1/TPOT)" if args.x == "tok_s_user" else "tok/s/user (output tokens / e2e latency)"
    fig, ax = _axes(plt, args.title, xlabel, "tok/s/gpu", args.log)
    for label, curve in data.items():
        xs, ys, cs = zip(*curve)
        ax.plot(xs, ys, marker="o", label=label)
        for xv, yv, c in curve:
            ax.annotate(str(c), (xv, yv), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.legend(title="run (numbers: concurrency)")
    paths = [args.out_dir / "pareto.png"]
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)
    fig = iso_figure(plt, ratios, base_label, xlabel)
    paths.append(args.out_dir / "iso_interactivity.png")
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points = [pt for spec in args.results for pt in load(spec, args.num_gpus)]
    seen: dict[tuple[str, int], int] = {}
    for pt in points:
        seen[pt.label, pt.concurrency] = seen.get((pt.label, pt.concurrency), 0) + 1
    for (label, c), count in seen.items():
        if count > 1:   # e.g. a sweep appended twice to one file: both points are drawn
            print(f"note: run {label!r} has {count} points at concurrency {c}; give reruns their own --label or file",
                  file=sys.stderr)
    data = curves(points, args.x)
    if not data:
        raise DFlashError("results", f"no point has both {args.x} and tok/s/gpu", "pass completed sweep results")
    base_label = args.baseline or ("AR" if "AR" in data else next(iter(data)))
    if base_label not in data:
        raise DFlashError("--baseline", f"{base_label!r} is not a run label", f"use one of {', '.join(data)}")
    ratios = {label: iso_ratio(data[base_label], curve) for label, curve in data.items() if label != base_label}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = points_table(data, points, args.x) + "\n\n" + ratio_table(base_label, ratios, args.x)
    (args.out_dir / "iso_interactivity.md").write_text(table + "\n")
    print(table)
    for path in draw(data, ratios, base_label, args):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
