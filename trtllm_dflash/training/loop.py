# SPDX-License-Identifier: Apache-2.0
"""Stage 2: train the draft module (AdamW, linear warmup then cosine to 0, gradient clipping).

On CUDA the frozen target runs in bfloat16 and the draft under bf16 autocast with float32 master weights (the
SpecForge reproduction's setup); on CPU everything is float32. The schedule runs on *progress* =
max(step / max_steps, elapsed / train_time_budget_s), so a wall-time budget still gets a full warmup and decay.
Every ``log_every`` steps a row goes to ``<out>/loss.csv``; every ``save_every`` steps and at the end a checkpoint
(``checkpoint.py``). A resumed run continues from the last checkpoint with the same batches and anchors.
"""
from __future__ import annotations

import contextlib
import csv
import math
import sys
import time
from pathlib import Path

import torch

from ..errors import DFlashError
from . import checkpoint
from .batches import BatchStream
from .modelopt_model import trainable
from .settings import TrainConfig

CSV_FILE = "loss.csv"
COLUMNS = ("step", "epoch", "loss", "acc", "lr", "grad_norm", "elapsed_s")


def lr_at(cfg: TrainConfig, progress: float) -> float:
    if progress < cfg.warmup_ratio:
        return cfg.lr * progress / cfg.warmup_ratio
    p = (progress - cfg.warmup_ratio) / (1 - cfg.warmup_ratio)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))


def progress_of(cfg: TrainConfig, step: int, max_steps: int, elapsed_s: float) -> float:
    by_time = elapsed_s / cfg.train_time_budget_s if cfg.train_time_budget_s > 0 else 0.0
    return max(step / max_steps, by_time)


def run(cfg: TrainConfig, model, stream: BatchStream, max_steps: int, log=print) -> dict:
    """Train until progress reaches 1; returns what happened (for report.json)."""
    from tqdm import tqdm

    out = cfg.out_dir
    device = next(model.dflash_module.parameters()).device
    params = trainable(model)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, spent = 0, 0.0
    if checkpoint.exists(out):
        step, spent = checkpoint.load(out, model.dflash_module, opt)
        log(f"train: resumed from {out / checkpoint.DIR} at step {step} ({spent:.0f} s spent)")
    _trim_csv(out / CSV_FILE, step)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())
    model.train()
    t0, window, last_saved = time.perf_counter(), [], step
    bar = tqdm(total=max_steps, initial=step, desc="train", unit="step", disable=not cfg.progress, file=sys.stderr)
    with open(out / CSV_FILE, "a", newline="") as f:
        writer = csv.writer(f)
        if f.tell() == 0:
            writer.writerow(COLUMNS)
        while (p := progress_of(cfg, step, max_steps, spent + time.perf_counter() - t0)) < 1.0:
            lr = lr_at(cfg, p)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = {k: v.to(device, non_blocking=True) for k, v in stream.batch(step).items()}
            with autocast:
                result = model(**batch)
            loss = result.loss
            if not torch.isfinite(loss):
                raise DFlashError("training loss", f"is {loss.item()} at step {step}", "lower --lr or check the data")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            window.append((loss.item(), float(result.train_acc[0][0]), float(grad_norm)))
            bar.update()
            if step % cfg.log_every == 0 or step == max_steps:
                row = _row(step, stream.epoch_of(step), window, lr, spent + time.perf_counter() - t0)
                writer.writerow(row)
                f.flush()
                bar.set_postfix(loss=f"{row[2]:.3f}", acc=f"{row[3]:.3f}", lr=f"{lr:.1e}", refresh=False)
                window = []
            if step % cfg.save_every == 0:
                checkpoint.save(out, model.dflash_module, opt, step, spent + time.perf_counter() - t0)
                last_saved = step
        if window:
            writer.writerow(_row(step, stream.epoch_of(step), window, lr_at(cfg, p), spent + time.perf_counter() - t0))
    bar.close()
    elapsed = spent + time.perf_counter() - t0
    if last_saved != step or not checkpoint.exists(out):
        checkpoint.save(out, model.dflash_module, opt, step, elapsed)
    model.eval()
    return {"steps": step, "max_steps": max_steps, "epochs": round(stream.epoch_of(step), 3),
            "elapsed_s": round(elapsed, 1), "stopped_by_time_budget": step < max_steps,
            "s_per_step": round(elapsed / max(step, 1), 4)}


def _row(step: int, epoch: float, window: list, lr: float, elapsed: float) -> list:
    n = max(len(window), 1)
    mean = [sum(w[i] for w in window) / n for i in range(3)]
    return [step, round(epoch, 4), round(mean[0], 5), round(mean[1], 5), lr, round(mean[2], 4), round(elapsed, 2)]


def _trim_csv(path: Path, step: int) -> None:
    """Keep the rows up to the checkpoint's step: a resumed run rewrites the ones after it."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    keep = [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= step]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([list(COLUMNS)] + keep)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
