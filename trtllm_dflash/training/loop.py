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
from . import anchors, checkpoint
from .batches import IGNORE, BatchStream
from .modelopt_model import trainable
from .parallel import SINGLE, DataParallel
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


def train_step(model, opt, params: list, batch: dict, grad_clip: float, autocast, step: int,
               dp: DataParallel = SINGLE) -> dict:
    """One optimizer step on a batch already on the device (this rank's slice of the global batch): forward,
    backward, gradients summed over the ranks, clipping, AdamW. Returns the global batch's loss, accuracy,
    gradient norm before clipping and supervised tokens (the training loop and the batch probe both use it)."""
    anchors.set_samples(model, batch.pop("sample_ids", None))
    tokens = int((batch["labels"] != IGNORE).sum())
    if dp.active:
        return _step_ranks(model, opt, params, batch, grad_clip, autocast, step, dp, tokens)
    with autocast:
        result = model(**batch)
    if not torch.isfinite(result.loss):
        raise DFlashError("training loss", f"is {result.loss.item()} at step {step}", "lower --lr or check the data")
    result.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"loss": result.loss.item(), "acc": float(result.train_acc[0][0]), "grad_norm": float(grad_norm),
            "tokens": tokens}


def _step_ranks(model, opt, params: list, batch: dict, grad_clip: float, autocast, step: int, dp: DataParallel,
                tokens: int) -> dict:
    """The step under N ranks. Each rank back-propagates its loss times its weight sum (ModelOpt's denominator),
    one all-reduce sums the gradients (a second, small one the step's numbers), and the sum is divided by the global
    weight sum: the gradient of the global batch's weighted mean, as one process computes it. An out-of-memory
    error or a non-finite loss on any rank travels in the small one, so every rank raises it together."""
    device = params[0].device
    oom, weight, scored, loss_w, acc_n, finite = 0.0, 0.0, 0.0, 0.0, 0.0, 1.0
    try:
        with autocast:
            result = model(**batch)
        weight, scored = anchors.last_weights(model)
        finite = float(bool(torch.isfinite(result.loss)))
        if finite:
            (result.loss * weight).backward()
            loss_w, acc_n = result.loss.item() * weight, float(result.train_acc[0][0]) * scored
        del result
    except torch.cuda.OutOfMemoryError:
        oom = 1.0
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    stats = torch.tensor([oom, 1.0 - finite, weight, scored, loss_w, acc_n, float(tokens)], dtype=torch.float64)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = dp.all_reduce_(torch.cat([g.reshape(-1).float() for g in grads]))
    total = dp.all_reduce_(stats.to(device))   # float64: token and weight sums stay exact
    oom, bad, weight, scored, loss_w, acc_n, tokens = total.tolist()
    if oom or bad:
        opt.zero_grad(set_to_none=True)
        if oom:
            raise torch.cuda.OutOfMemoryError(f"out of memory on {int(oom)} of {dp.size} ranks at step {step}")
        raise DFlashError("training loss", f"is not finite on {int(bad)} of {dp.size} ranks at step {step}",
                          "lower --lr or check the data")
    scale = 1.0 / weight if weight > 0 else 0.0
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = (flat[offset:offset + n].view_as(p) * scale).to(p.dtype)
        offset += n
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"loss": loss_w * scale, "acc": acc_n / scored if scored else 0.0, "grad_norm": float(grad_norm),
            "tokens": int(tokens)}


def run(cfg: TrainConfig, model, stream: BatchStream, max_steps: int, log=print, dp: DataParallel = SINGLE) -> dict:
    """Train until progress reaches 1; returns what happened (for report.json). Under N ranks every rank runs
    this loop on its slice of each batch; rank 0 alone writes loss.csv and the checkpoints, and its clock decides
    the time limits for all."""
    from tqdm import tqdm

    out = cfg.out_dir
    device = next(model.dflash_module.parameters()).device
    params = trainable(model)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, spent, tokens = 0, 0.0, 0
    if checkpoint.exists(out):   # every rank reads it; none is written before all ranks have stepped together
        step, spent, tokens = checkpoint.load(out, model.dflash_module, opt)
        log(f"train: resumed from {out / checkpoint.DIR} at step {step} ({spent:.0f} s spent, {tokens} tokens)")
    if dp.is_main:
        _trim_csv(out / CSV_FILE, step)
    autocast = autocast_for(device)
    timed = cfg.train_time_budget_s > 0 or cfg.stop_after_s > 0

    def clock() -> float:   # seconds of this call; under N ranks rank 0's, where a time limit depends on it
        now = time.perf_counter() - t0
        return dp.agree(now) if timed else now

    model.train()
    t0, window, last_saved, paused, first = time.perf_counter(), [], step, False, step
    bar = tqdm(total=max_steps, initial=step, desc="train", unit="step", disable=not (cfg.progress and dp.is_main),
               file=sys.stderr)
    with (open(out / CSV_FILE, "a", newline="") if dp.is_main else contextlib.nullcontext()) as f:
        writer = csv.writer(f) if dp.is_main else None
        if writer is not None and f.tell() == 0:
            writer.writerow(COLUMNS)
        while (p := progress_of(cfg, step, max_steps, spent + (now := clock()))) < 1.0:
            # Only on a log_every boundary: no half-filled loss.csv window is lost to the pause.
            # Each call makes progress: never pause before the first step.
            if cfg.stop_after_s and step > first and step % cfg.log_every == 0 and now > cfg.stop_after_s:
                paused = True
                log(f"train: --stop_after_s {cfg.stop_after_s:g} reached at step {step} of {max_steps}; "
                    "run again with --resume to continue")
                break
            lr = lr_at(cfg, p, max_steps)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = {k: v if k == "sample_ids" else v.to(device, non_blocking=True)
                     for k, v in stream.batch(step).items()}
            done = train_step(model, opt, params, batch, cfg.grad_clip, autocast, step, dp)
            tokens += done["tokens"]
            step += 1
            window.append((done["loss"], done["acc"], done["grad_norm"]))
            bar.update()
            if step % cfg.log_every == 0 or step == max_steps:
                row = _row(step, stream.epoch_of(step), tokens, window, lr, spent + time.perf_counter() - t0)
                if writer is not None:
                    writer.writerow(row)
                    f.flush()
                bar.set_postfix(loss=f"{row[3]:.3f}", acc=f"{row[4]:.3f}", lr=f"{lr:.1e}", refresh=False)
                window = []
            if step % cfg.save_every == 0:
                if dp.is_main:
                    checkpoint.save(out, model.dflash_module, opt, step, spent + time.perf_counter() - t0, tokens)
                last_saved = step
        if window and not paused and writer is not None:
            writer.writerow(_row(step, stream.epoch_of(step), tokens, window, lr_at(cfg, p, max_steps),
                                 spent + time.perf_counter() - t0))
    bar.close()
    elapsed = spent + time.perf_counter() - t0
    if dp.is_main and (last_saved != step or not checkpoint.exists(out)):
        checkpoint.save(out, model.dflash_module, opt, step, elapsed, tokens)
    model.eval()
    return {"steps": step, "max_steps": max_steps, "epochs": round(stream.epoch_of(step), 3), "tokens": tokens,
            "elapsed_s": round(elapsed, 1), "stopped_by_time_budget": step < max_steps and not paused,
            "paused": paused, "s_per_step": round(elapsed / max(step, 1), 4), "ranks": dp.size,
            "per_rank_batch": stream.batch_size // dp.size}


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
