# SPDX-License-Identifier: Apache-2.0
"""Stage 2: train the draft module (AdamW, linear warmup then cosine to 0, gradient clipping).

On CUDA the frozen target runs in bfloat16 and the draft under bf16 autocast with float32 master weights (the
SpecForge reproduction's setup); on CPU everything is float32. The schedule runs on *progress* =
max(step / max_steps, elapsed / train_time_budget_s), so a wall-time budget still gets a full warmup and decay.
Every ``log_every`` steps a row goes to ``<out>/loss.csv`` (with ``tokens``, the response tokens trained on so far:
the x axis of the scaling curve); every ``save_every`` steps and at the end a checkpoint (``checkpoint.py``). A
resumed run continues from the last checkpoint with the same batches, anchors, step count and LR schedule.
``stop_after_s`` ends a call early with a checkpoint, for runs spread over several time-limited calls.
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
from .batches import IGNORE, BatchStream
from .modelopt_model import trainable
from .settings import TrainConfig

CSV_FILE = "loss.csv"
COLUMNS = ("step", "epoch", "tokens", "loss", "acc", "lr", "grad_norm", "elapsed_s")


def lr_at(cfg: TrainConfig, progress: float, max_steps: int) -> float:
    """Linear warmup, then cosine or linear decay to 0, on progress in [0, 1]."""
    warm = min(cfg.warmup_steps / max_steps, 0.999) if cfg.warmup_steps is not None else cfg.warmup_ratio
    if progress < warm:
        return cfg.lr * progress / warm
    p = min((progress - warm) / (1 - warm), 1.0)
    return cfg.lr * (1 - p) if cfg.lr_schedule == "linear" else cfg.lr * 0.5 * (1 + math.cos(math.pi * p))


def progress_of(cfg: TrainConfig, step: int, max_steps: int, elapsed_s: float) -> float:
    by_time = elapsed_s / cfg.train_time_budget_s if cfg.train_time_budget_s > 0 else 0.0
    return max(step / max_steps, by_time)


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (the draft keeps float32 master weights); nothing on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def train_step(model, opt, params: list, batch: dict, grad_clip: float, autocast, step: int):
    """One optimizer step on a batch already on the device: forward, backward, clipping, AdamW. Returns the
    model's output and the gradient norm before clipping (the training loop and the batch probe both use it)."""
    with autocast:
        result = model(**batch)
    if not torch.isfinite(result.loss):
        raise DFlashError("training loss", f"is {result.loss.item()} at step {step}", "lower --lr or check the data")
    result.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return result, grad_norm


def run(cfg: TrainConfig, model, stream: BatchStream, max_steps: int, log=print) -> dict:
    """Train until progress reaches 1; returns what happened (for report.json)."""
    from tqdm import tqdm

    out = cfg.out_dir
    device = next(model.dflash_module.parameters()).device
    params = trainable(model)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, spent, tokens = 0, 0.0, 0
    if checkpoint.exists(out):
        step, spent, tokens = checkpoint.load(out, model.dflash_module, opt)
        log(f"train: resumed from {out / checkpoint.DIR} at step {step} ({spent:.0f} s spent, {tokens} tokens)")
    _trim_csv(out / CSV_FILE, step)
    autocast = autocast_for(device)
    model.train()
    t0, window, last_saved, paused, first = time.perf_counter(), [], step, False, step
    bar = tqdm(total=max_steps, initial=step, desc="train", unit="step", disable=not cfg.progress, file=sys.stderr)
    with open(out / CSV_FILE, "a", newline="") as f:
        writer = csv.writer(f)
        if f.tell() == 0:
            writer.writerow(COLUMNS)
        while (p := progress_of(cfg, step, max_steps, spent + time.perf_counter() - t0)) < 1.0:
            # Only on a log_every boundary: no half-filled loss.csv window is lost to the pause.
            # Each call makes progress: never pause before the first step.
            if (cfg.stop_after_s and step > first and step % cfg.log_every == 0
                    and time.perf_counter() - t0 > cfg.stop_after_s):
                paused = True
                log(f"train: --stop_after_s {cfg.stop_after_s:g} reached at step {step} of {max_steps}; "
                    "run again with --resume to continue")
                break
            lr = lr_at(cfg, p, max_steps)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = {k: v.to(device, non_blocking=True) for k, v in stream.batch(step).items()}
            tokens += int((batch["labels"] != IGNORE).sum())
            result, grad_norm = train_step(model, opt, params, batch, cfg.grad_clip, autocast, step)
            step += 1
            window.append((result.loss.item(), float(result.train_acc[0][0]), float(grad_norm)))
            bar.update()
            if step % cfg.log_every == 0 or step == max_steps:
                row = _row(step, stream.epoch_of(step), tokens, window, lr, spent + time.perf_counter() - t0)
                writer.writerow(row)
                f.flush()
                bar.set_postfix(loss=f"{row[3]:.3f}", acc=f"{row[4]:.3f}", lr=f"{lr:.1e}", refresh=False)
                window = []
            if step % cfg.save_every == 0:
                checkpoint.save(out, model.dflash_module, opt, step, spent + time.perf_counter() - t0, tokens)
                last_saved = step
        if window and not paused:
            writer.writerow(_row(step, stream.epoch_of(step), tokens, window, lr_at(cfg, p, max_steps),
                                 spent + time.perf_counter() - t0))
    bar.close()
    elapsed = spent + time.perf_counter() - t0
    if last_saved != step or not checkpoint.exists(out):
        checkpoint.save(out, model.dflash_module, opt, step, elapsed, tokens)
    model.eval()
    return {"steps": step, "max_steps": max_steps, "epochs": round(stream.epoch_of(step), 3), "tokens": tokens,
            "elapsed_s": round(elapsed, 1), "stopped_by_time_budget": step < max_steps and not paused,
            "paused": paused, "s_per_step": round(elapsed / max(step, 1), 4)}


def _row(step: int, epoch: float, tokens: int, window: list, lr: float, elapsed: float) -> list:
    """A loss.csv row; a resumed call logs the steps after its checkpoint, so a window never spans two calls
    except through a partial window that --stop_after_s drops (rows stay on log_every boundaries)."""
    n = max(len(window), 1)
    mean = [sum(w[i] for w in window) / n for i in range(3)]
    return [step, round(epoch, 4), tokens, round(mean[0], 5), round(mean[1], 5), lr, round(mean[2], 4),
            round(elapsed, 2)]


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
        return [{k: float(v) for k, v in r.items() if v not in (None, "")} for r in csv.DictReader(f)]
