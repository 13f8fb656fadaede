# SPDX-License-Identifier: Apache-2.0
"""Stage 1: the target answers every training prompt with our runtime (continuous batching, block_size 1).

Consumes: prompt sources (``prompts.py``). Produces ``<out>/data/regenerated.jsonl``, one row per prompt::

    {"id": str, "prompt_len": P, "input_ids": [prompt + response], "loss_mask": [0]*P + [1]*R, "finish_reason": ...}

and ``<out>/data/regenerate.json`` (settings and counts) when the stage is complete. Rows are appended as requests
finish, so an interrupted run resumes where it stopped: ids already in the file are skipped (a torn last line is
cut off first). The response keeps the target's stop token, so the drafter learns to propose it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..config import RuntimeConfig, SamplingParams
from ..data import apply_chat_template
from ..errors import DFlashError
from . import prompts
from .settings import TrainConfig

DATA_FILE, DONE_FILE = "regenerated.jsonl", "regenerate.json"


def data_dir(cfg: TrainConfig) -> Path:
    return cfg.out_dir / "data"


def is_done(cfg: TrainConfig) -> bool:
    return (data_dir(cfg) / DONE_FILE).is_file()


def run(cfg: TrainConfig, target_dir: Path, log=print) -> dict:
    """Regenerate (or finish regenerating) the training data; returns the stage's counts."""
    from tqdm import tqdm

    from ..runtime.engine import Engine

    out = data_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DATA_FILE
    done_ids = _done_ids(path)
    engine = Engine.from_dirs(target_dir, None, RuntimeConfig(
        block_size=1, max_batch_size=cfg.regen_batch_size, max_seq_len=cfg.max_prompt_len + cfg.max_new_tokens + 2,
        device=cfg.device))
    todo, counts = _plan(cfg, engine, done_ids)
    log(f"regenerate: {len(todo)} prompts to answer ({counts['already_done']} already in {path.name}; "
        f"{counts['excluded_eval_overlap']} dropped as eval overlaps, {counts['too_long']} longer than "
        f"{cfg.max_prompt_len} tokens) on {engine.device}")
    t0, budget_hit = time.perf_counter(), False
    with open(path, "a", encoding="utf-8") as f, tqdm(total=len(todo), desc="regenerate", unit="prompt",
                                                      disable=not cfg.progress, file=sys.stderr) as bar:
        pending, active, new_tokens = list(reversed(todo)), {}, 0
        # Once the time budget stops admissions, `pending` never drains: the loop ends with the running prompts.
        while active or (pending and not budget_hit):
            # Keep about two batches queued, so the time budget can stop admissions without wasting work.
            while pending and len(active) < 2 * cfg.regen_batch_size and not budget_hit:
                pid, ids, seed = pending.pop()
                params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.regen_temperature, seed=seed)
                active[engine.add_request(ids, params).request_id] = pid
            for req in engine.step():
                pid = active.pop(req.request_id)
                f.write(json.dumps(_row(pid, req), separators=(",", ":")) + "\n")
                new_tokens += len(req.output_ids)
                bar.update()
            f.flush()
            bar.set_postfix(tok_s=f"{new_tokens / max(time.perf_counter() - t0, 1e-9):.0f}", refresh=False)
            if cfg.regen_time_budget_s and not budget_hit and time.perf_counter() - t0 > cfg.regen_time_budget_s:
                budget_hit = bool(pending)
                if budget_hit:
                    log(f"regenerate: --regen_time_budget_s {cfg.regen_time_budget_s:g} reached; finishing the "
                        f"{len(active)} running prompts, skipping {len(pending)}")
    counts.update(_summary(path), elapsed_s=round(time.perf_counter() - t0, 1), time_budget_hit=budget_hit,
                  skipped_by_time_budget=len(pending) if budget_hit else 0, device=str(engine.device),
                  new_tokens_per_s=round(new_tokens / max(time.perf_counter() - t0, 1e-9), 1))
    if counts["rows"] == 0:
        raise DFlashError("--data", "no prompt was regenerated", "check --num_prompts and --max_prompt_len")
    (out / DONE_FILE).write_text(json.dumps({"settings": _settings(cfg), "counts": counts}, indent=2) + "\n")
    return counts


def _plan(cfg: TrainConfig, engine, done_ids: set[str]) -> tuple[list[tuple[str, list[int], int]], dict]:
    """The prompts still to answer as (id, token ids, sampling seed), in the seeded order, and the counts."""
    sources = prompts.load_sources(cfg.data, progress=cfg.progress)
    evals = prompts.eval_texts(progress=cfg.progress) if cfg.exclude_eval else None
    candidates, counts = prompts.select(sources, cfg.seed, evals)
    todo, counts["too_long"], counts["already_done"] = [], 0, 0
    for i, src in enumerate(candidates):
        if len(todo) + counts["already_done"] >= cfg.num_prompts:
            break
        ids = _prompt_ids(src, engine)
        if len(ids) > cfg.max_prompt_len:
            counts["too_long"] += 1
        elif src.id in done_ids:
            counts["already_done"] += 1
        else:
            todo.append((src.id, ids, i))
    return todo, counts


def _prompt_ids(src: prompts.Source, engine) -> list[int]:
    if src.prompt_ids is not None:
        vocab = engine.target.config.vocab_size
        if max(src.prompt_ids) >= vocab or min(src.prompt_ids) < 0:
            raise DFlashError(f"--data row {src.id}", f"has prompt_ids outside [0, {vocab})",
                              "tokenize with the target's tokenizer")
        return list(src.prompt_ids)
    if engine.tokenizer is None:
        raise DFlashError("--target", "has no tokenizer, so text prompts cannot be encoded",
                          "add the tokenizer files, or give prompt_ids in the --data JSONL")
    return apply_chat_template(engine.tokenizer, src.messages)


def _row(pid: str, req) -> dict:
    p, r = len(req.prompt_ids), len(req.output_ids)
    return {"id": pid, "prompt_len": p, "input_ids": req.prompt_ids + req.output_ids, "loss_mask": [0] * p + [1] * r,
            "finish_reason": req.finish_reason}


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a regenerated.jsonl; a last line without its newline (torn by a kill) is ignored."""
    data = path.read_bytes()
    rows = []
    for n, line in enumerate(data[: data.rfind(b"\n") + 1].splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise DFlashError(f"{path}:{n}", "is not a JSON row", "delete the file to regenerate it") from None
    return rows


def _done_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    size, cut = path.stat().st_size, path.read_bytes().rfind(b"\n") + 1
    if cut != size:  # drop a torn tail so appends start on a fresh line
        with open(path, "r+b") as f:
            f.truncate(cut)
    return {r["id"] for r in read_rows(path)}


def _summary(path: Path) -> dict:
    rows = read_rows(path)
    resp = [sum(r["loss_mask"]) for r in rows]
    reasons: dict[str, int] = {}
    for r in rows:
        reasons[r["finish_reason"]] = reasons.get(r["finish_reason"], 0) + 1
    return {"rows": len(rows), "prompt_tokens": sum(r["prompt_len"] for r in rows), "response_tokens": sum(resp),
            "mean_response_tokens": round(sum(resp) / max(len(rows), 1), 1), "finish_reasons": reasons}


def _settings(cfg: TrainConfig) -> dict:
    keys = ("target", "data", "num_prompts", "max_prompt_len", "max_new_tokens", "regen_temperature", "seed",
            "exclude_eval", "regen_time_budget_s")
    return {k: getattr(cfg, k) for k in keys}
