# SPDX-License-Identifier: Apache-2.0
"""The run's record: ``<out>/report.json`` (settings, data counts, training, export checks, versions) and
``<out>/loss.png`` (loss and accuracy against step, from loss.csv)."""
from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from .. import __version__
from .loop import CSV_FILE, read_csv
from .modelopt_model import versions

REPORT_FILE, PLOT_FILE = "report.json", "loss.png"


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

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(steps, [r["loss"] for r in rows], color="tab:blue", label="loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (decay-weighted)", color="tab:blue")
    acc = ax.twinx()
    acc.plot(steps, [r["acc"] for r in rows], color="tab:orange", label="draft accuracy")
    acc.set_ylabel("draft top-1 accuracy", color="tab:orange")
    acc.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / PLOT_FILE)
    plt.close(fig)
    return PLOT_FILE


def title(settings: dict) -> str:
    return (f"dflash-train {settings['target']} on {settings['data']}, B={settings['block_size']}, "
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
    """Redraw loss.png from loss.csv (e.g. on a machine with matplotlib, after a GPU run on one without)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.report", description=main.__doc__)
    p.add_argument("run_dir", help="a dflash-train --out folder")
    out = Path(p.parse_args(argv).run_dir)
    cfg = json.loads((out / "train_config.json").read_text())
    png = plot(out, title(cfg))
    if png is None:
        return 1
    print(out / png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
