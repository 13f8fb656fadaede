# SPDX-License-Identifier: Apache-2.0
"""Before training starts: a few timed optimizer steps at each batch size of ``--probe_batch_sizes``, then the
run trains at the one with the most supervised tokens per second (issue #24: a 135M target and a 3-layer draft
leave an H100 idle at batch 16).

The probe steps run the real training step (batch building on the CPU, forward, backward, clipping, AdamW) on
the run's own batches, but with a throwaway AdamW at learning rate 0, so the draft weights do not move; the RNG
state (ModelOpt samples the anchors with torch's RNG) is put back afterwards. The token budget of the command
line is kept: ``--batch_size`` x ``--max_steps`` sequences become ``max_steps`` at the chosen size, and a
``--train_time_budget_s`` becomes ``max_steps`` = budget / measured s per step, a fixed step count that resumes
exactly over several ``--stop_after_s`` calls. ``batch_probe.json`` in the run says what was measured and
chosen; a resumed run reads it instead of probing again.

Under N data-parallel ranks the probed sizes are per rank (what one GPU holds) and every rank takes part in each
timed step; tokens/s counts all ranks' tokens, and the chosen global batch is the per-rank size x N (the
schedule and the step count follow the global batch).
"""
from __future__ import annotations

import heapq
import json
import math
import time
from dataclasses import replace

import torch

from .batches import BatchStream
from .loop import autocast_for, train_step
from .modelopt_model import trainable
from .parallel import SINGLE, DataParallel
from .settings import TrainConfig

PROBE_FILE = "batch_probe.json"


def applied(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the settings an earlier probe of this run chose (unchanged when it has not probed)."""
    path = cfg.out_dir / PROBE_FILE
    if not cfg.probe_batch_sizes or not path.is_file():
        return cfg
    return replace(cfg, **json.loads(path.read_text())["settings"])


def settings_for(cfg: TrainConfig, batch: int, s_per_step: float) -> dict:
    """The TrainConfig fields a probe that chose ``batch`` (at ``s_per_step``) changes."""
    out = {"batch_size": batch}
    if cfg.train_time_budget_s > 0:
        out.update(max_steps=max(1, int(cfg.train_time_budget_s / s_per_step)), train_time_budget_s=0.0)
    elif cfg.max_steps:
        out["max_steps"] = max(1, math.ceil(cfg.max_steps * cfg.batch_size / batch))
    return out


def run(cfg: TrainConfig, model, data: list, log=print, dp: DataParallel = SINGLE) -> tuple[TrainConfig, dict]:
    """Time each per-rank batch size, pick the most tokens/s; returns the new config and what was measured."""
    device = next(model.dflash_module.parameters()).device
    params = trainable(model)
    opt = torch.optim.AdamW(params, lr=0.0, weight_decay=0.0)   # lr 0: the weights stay as they are
    autocast = autocast_for(device)
    rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if device.type == "cuda" else None)
    sizes = sorted(set(cfg.probe_batch_sizes))
    each = cfg.probe_s / len(sizes)
    measured: dict[str, dict] = {}
    model.train()
    heavy = heaviest(data, max(sizes) * dp.size)   # ranked once: every size's worst batch is a prefix of it
    for batch in sizes:
        stream = BatchStream(data, batch * dp.size, cfg.block_size, cfg.seed, rank=dp.rank, ranks=dp.size)
        worst = BatchStream(heavy[:batch * dp.size], batch * dp.size, cfg.block_size, cfg.seed,
                            rank=dp.rank, ranks=dp.size)
        try:
            measured[str(batch)] = _time(model, opt, params, stream, cfg.grad_clip, autocast, device, each, dp,
                                         warmup=worst)
        except torch.cuda.OutOfMemoryError:
            measured[str(batch)] = {"error": "out of memory"}
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        log(f"train: batch probe {batch}: {measured[str(batch)]}")
    model.eval()
    opt.state.clear()
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state_all(rng[1])
    ok = {int(b): m for b, m in measured.items() if "tokens_per_s" in m}
    if not ok:
        raise RuntimeError(f"batch probe: no batch size of {sizes} trained ({measured})")
    best = max(ok, key=lambda b: ok[b]["tokens_per_s"])
    settings = settings_for(cfg, best * dp.size, ok[best]["s_per_step"])
    record = {"batch_sizes": sizes, "probe_s": cfg.probe_s, "measured": measured, "chosen": best,
              "ranks": dp.size, "global_batch": best * dp.size, "settings": settings, "device": str(device)}
    if dp.is_main:
        (cfg.out_dir / PROBE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log(f"train: batch {best} per rank x {dp.size} rank(s) trains the most tokens/s "
        f"({ok[best]['tokens_per_s']:.0f}); settings {settings}")
    return replace(cfg, **settings), record


def heaviest(data: list, n: int) -> list:
    """The ``n`` examples with the most supervised tokens (then the longest): a batch of them is the most memory a
    training step of this data can need (the loss covers anchors x block positions x the vocabulary, and a row
    gets fewer anchors only when it has fewer supervised positions)."""
    return heapq.nlargest(n, data, key=lambda e: (sum(e.loss_mask), len(e.input_ids)))


def _time(model, opt, params, stream: BatchStream, grad_clip: float, autocast, device, seconds: float,
          dp: DataParallel = SINGLE, warmup: BatchStream | None = None) -> dict:
    """One untimed warm-up step on ``warmup``'s first batch (the heaviest the data holds: a size that fits only
    the average batch would run out of memory later, mid-run), then steps until ``seconds`` have passed (at
    least 2; rank 0's clock)."""
    def step(i: int, source: BatchStream = stream) -> int:
        batch = {k: v if k == "sample_ids" else v.to(device, non_blocking=True) for k, v in source.batch(i).items()}
        # the step reads the loss back: this is where it waits for the GPU, as the loop does every step
        return train_step(model, opt, params, batch, grad_clip, autocast, i, dp)["tokens"]

    step(0, warmup or stream)
    t0, steps, tokens = time.perf_counter(), 0, 0
    while steps < 2 or dp.agree(time.perf_counter() - t0) < seconds:
        tokens += step(1 + steps)
        steps += 1
    elapsed = dp.agree(time.perf_counter() - t0)
    return {"steps": steps, "s_per_step": round(elapsed / steps, 4), "tokens_per_s": round(tokens / elapsed, 1)}
