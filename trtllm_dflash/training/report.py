# SPDX-License-Identifier: Apache-2.0
"""The run's record: ``<out>/report.json`` (settings, data counts, training, export checks, versions) and
``<out>/loss.png``: the scaling curve, loss and draft accuracy (from loss.csv) and acceptance length tau (from
tau.csv) against the response tokens trained on.

tau.csv gets one row per evaluated checkpoint: ``python -m trtllm_dflash.training.report RUN --add_tau
ACCEPTANCE.json`` reads ``humaneval`` / ``mtbench`` -> ``tau_greedy`` / ``tau_t1`` from a trtllm_dflash/bench/acceptance.py
result and files them under the run's current step and token count (from its checkpoint)."""
from __future__ import annotations

import csv
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__
from .loop import CSV_FILE, read_csv
from .modelopt_model import versions
from .settings import CONFIG_FILE

REPORT_FILE, PLOT_FILE, TAU_FILE = "report.json", "loss.png", "tau.csv"
TAU_COLUMNS = ("step", "tokens", "humaneval_tau_greedy", "humaneval_tau_t1", "mtbench_tau_greedy", "mtbench_tau_t1")


def plot(out: Path, title: str) -> str | None:
    """Write loss.png; returns None (and says why on stderr) when there is nothing to plot or no matplotlib."""
    rows = read_csv(out / CSV_FILE) if (out / CSV_FILE).is_file() else []
    if not rows:
        return None
    try:
        import matplotlib
    except ImportError:
        print("[trtllm_dflash] note: matplotlib is not installed, so no loss.png "
              "(pip install 'trtllm-dflash[plot]')", file=sys.stderr)
        return None
    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    by_tokens = all("tokens" in r for r in rows)
    x_of = (lambda r: r["tokens"] / 1e6) if by_tokens else (lambda r: r["step"])
    taus = read_tau(out)
    fig, axes = plt.subplots(1, 3 if taus else 2, figsize=(12 if taus else 9, 3.8), dpi=120)
    xs = [x_of(r) for r in rows]
    axes[0].plot(xs, [r["loss"] for r in rows], color="tab:blue")
    axes[0].set_ylabel("loss (decay-weighted)")
    axes[0].set_yscale("log")
    axes[1].plot(xs, [r["acc"] for r in rows], color="tab:orange")
    axes[1].set_ylabel("draft top-1 accuracy (training)")
    axes[1].set_ylim(0, 1)
    if taus:
        tx = [x_of(t) for t in taus]
        for key, style in (("humaneval_tau_greedy", "o-"), ("mtbench_tau_greedy", "s-"),
                           ("humaneval_tau_t1", "o--"), ("mtbench_tau_t1", "s--")):
            pts = [(x, t[key]) for x, t in zip(tx, taus) if key in t]
            if pts:
                axes[2].plot(*zip(*pts), style, label=key.replace("_tau_", " ").replace("t1", "T=1"))
        axes[2].set_ylabel("acceptance length tau")
        axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("response tokens trained on (M)" if by_tokens else "optimizer step")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / PLOT_FILE)
    plt.close(fig)
    return PLOT_FILE


def read_tau(out: Path) -> list[dict]:
    path = out / TAU_FILE
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in r.items() if v not in (None, "")} for r in csv.DictReader(f)]


def add_tau(out: Path, acceptance: dict) -> dict:
    """Append the tau figures of an acceptance result under the run's checkpoint step and token count (the
    checkpoint's state, or where the run was copied without its checkpoint, as for an evaluation on another
    host, the finished training section of its report.json)."""
    state, report = out / "checkpoint" / "state.json", out / REPORT_FILE
    if state.is_file():
        meta = json.loads(state.read_text())
        row = {"step": meta["step"], "tokens": meta.get("tokens", 0)}
    else:
        train = (json.loads(report.read_text()).get("train") or {}) if report.is_file() else {}
        if not train.get("steps"):
            from ..errors import DFlashError
            raise DFlashError("run_dir", f"{out} has neither checkpoint/state.json nor a trained report.json",
                              "pass a dflash-train --out folder")
        row = {"step": train["steps"], "tokens": train.get("tokens", 0)}
    for ds in ("humaneval", "mtbench"):
        for key in ("tau_greedy", "tau_t1"):
            if ds in acceptance and key in acceptance[ds]:
                row[f"{ds}_{key}"] = acceptance[ds][key]
    rows = [r for r in read_tau(out) if r["step"] != row["step"]] + [row]
    with open(out / TAU_FILE, "w", newline="") as f:
        w = csv.DictWriter(f, TAU_COLUMNS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["step"]):
            w.writerow({k: (int(r[k]) if k in ("step", "tokens") else r[k]) for k in TAU_COLUMNS if k in r})
    return row


def title(settings: dict) -> str:
    data = Path(settings["data"]).name if "/" in settings["data"] else settings["data"]   # not the host's path
    return (f"dflash-train {settings['target']} on {data}, B={settings['block_size']}, "
            f"{settings['num_layers']} layers, loss={settings['loss']}")


def loss_summary(out: Path) -> dict:
    rows = read_csv(out / CSV_FILE) if (out / CSV_FILE).is_file() else []
    if not rows:
        return {}
    return {"first": {"step": int(rows[0]["step"]), "loss": rows[0]["loss"], "acc": rows[0]["acc"]},
            "last": {"step": int(rows[-1]["step"]), "loss": rows[-1]["loss"], "acc": rows[-1]["acc"]},
            "min_loss": min(r["loss"] for r in rows)}


def write(out: Path, sections: dict) -> Path:
    """Write report.json; sections of earlier invocations (e.g. a --stages train run before --stages export)
    are kept unless this one wrote them anew."""
    path = out / REPORT_FILE
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    record = {**earlier, "tool": f"trtllm-dflash {__version__} dflash-train",
              "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "python": platform.python_version(), "versions": versions(),
              **sections, "loss": loss_summary(out)}
    from ..provenance import record as provenance   # the target it trained against, the drafter it exported
    target = record.get("target_dir")
    record["provenance"] = provenance(sys.argv, checkpoints={
        "target": target if target and Path(target).is_dir() else None,
        "drafter": out / "drafter" if (out / "drafter" / "config.json").is_file() else None})
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """Redraw loss.png (the scaling curve) from loss.csv and tau.csv, e.g. on a machine with matplotlib after a
    GPU run on one without; --add_tau first files an acceptance result under the run's current checkpoint."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.report", description=main.__doc__)
    p.add_argument("run_dir", help="a dflash-train --out folder")
    p.add_argument("--add_tau", metavar="ACCEPTANCE_JSON", help="a trtllm_dflash/bench/acceptance.py result of this run's "
                   "drafter at its current checkpoint")
    args = p.parse_args(argv)
    out = Path(args.run_dir)
    if args.add_tau:
        print(json.dumps(add_tau(out, json.loads(Path(args.add_tau).read_text()))))
    cfg = json.loads((out / CONFIG_FILE).read_text())
    png = plot(out, title(cfg))
    if png is None:
        return 1
    print(out / png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
