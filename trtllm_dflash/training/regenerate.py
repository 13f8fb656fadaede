# SPDX-License-Identifier: Apache-2.0
"""Stage 1: the target answers every training prompt with our runtime (continuous batching, block_size 1).

Consumes: prompt sources (``prompts.py``). Produces ``<out>/data/regenerated.jsonl``, one row per prompt::

    {"id": str, "prompt_len": P, "input_ids": [prompt + response], "loss_mask": [0]*P + [1]*R, "finish_reason": ...}

and ``<out>/data/regenerate.json`` (settings and counts) when the stage is complete. Rows are appended as requests
finish, so an interrupted run resumes where it stopped: ids already in the file are skipped (a torn last line is
cut off first). The response keeps the target's stop token, so the drafter learns to propose it.

With ``--data CORPUS_DIR`` (``corpus.py``) the work goes shard by shard instead: prompt shard ``prompts-K`` becomes
``<out>/data/shards/regen-K.jsonl.gz`` (written whole, then renamed into place), recorded in
``<out>/data/manifest.json`` with its sha256 and token counts. Each shard runs on an idle engine and its rows are
written in prompt order, so a shard's bytes do not depend on which call produced it: a run cut off by
``--regen_time_budget_s`` (no new shard starts once the budget would be passed) and resumed later gives the same
data as an uncut run. ``--num_prompts`` takes whole shards, in order, until it is reached. ``--regen_total_s``
closes the stage early: once the answered shards took that long (their times summed over every call), the
data set is those shards (``regenerate.json`` lists them), so a time-boxed run trains on what it could answer.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from pathlib import Path

from ..checkpoints.manifest import sha256_file
from ..config import RuntimeConfig, SamplingParams
from ..data import apply_chat_template
from ..errors import DFlashError
from .. import provenance
from . import corpus, parallel, prompts
from .parallel import SINGLE, DataParallel
from .settings import TrainConfig

DATA_FILE, DONE_FILE = "regenerated.jsonl", "regenerate.json"
MANIFEST, SHARD_DIR = "manifest.json", "shards"


def data_dir(cfg: TrainConfig) -> Path:
    return cfg.out_dir / "data"


def is_done(cfg: TrainConfig) -> bool:
    return (data_dir(cfg) / DONE_FILE).is_file()


def run(cfg: TrainConfig, target_dir: Path, log=print, dp: DataParallel = SINGLE) -> dict:
    """Regenerate (or finish regenerating) the training data; returns the stage's counts."""
    if corpus.is_corpus(cfg.data):
        return run_shards(cfg, target_dir, log, dp)
    if dp.active:
        raise DFlashError("--data", f"{cfg.data} is answered by one process ({dp.size} ranks need a corpus folder "
                          "to share the work)", "run --stages regenerate without torchrun/mpirun first, or pass "
                          "a corpus folder (python -m trtllm_dflash.training.corpus)")
    from tqdm import tqdm

    from ..runtime.engine import Engine

    out = data_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DATA_FILE
    done_ids = _done_ids(path)
    engine = Engine.from_dirs(target_dir, None, RuntimeConfig(
        block_size=1, max_batch_size=cfg.regen_batch_size, max_seq_len=cfg.max_prompt_len + cfg.max_new_tokens + 2,
        device=cfg.device))
    prompts_todo, counts = _plan(cfg, engine, done_ids)
    # (row id, token ids, seed, temperature) per answer; the first answer keeps the seed runs always gave it
    todo = [(aid, ids, seed, temp) for pid, ids, first_seed in prompts_todo
            for aid, temp, seed in _samples(cfg, pid, cfg.regen_temperature, first_seed)]
    log(f"regenerate: {len(prompts_todo)} prompts to answer" + (f" ({cfg.regen_samples} answers each)" if
        cfg.regen_samples > 1 else "") + f" ({counts['already_done']} already in {path.name}; "
        f"{counts['excluded_eval_overlap']} dropped as eval overlaps, {counts['too_long']} longer than "
        f"{cfg.max_prompt_len} tokens) on {engine.device}")
    t0, budget_hit = time.perf_counter(), False
    with open(path, "a", encoding="utf-8") as f, tqdm(total=len(todo), desc="regenerate", unit="answer",
                                                      disable=not cfg.progress, file=sys.stderr) as bar:
        pending, active, new_tokens = list(reversed(todo)), {}, 0
        # Once the time budget stops admissions, `pending` never drains: the loop ends with the running prompts.
        while active or (pending and not budget_hit):
            # Keep about two batches queued, so the time budget can stop admissions without wasting work.
            while pending and len(active) < 2 * cfg.regen_batch_size and not budget_hit:
                pid, ids, seed, temp = pending.pop()
                params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temp, seed=seed)
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
    keys = ("target", "data", "num_prompts", "max_prompt_len", "max_new_tokens", "regen_temperature",
            "regen_samples", "seed", "exclude_eval", "regen_time_budget_s")
    return {k: getattr(cfg, k) for k in keys}


# --------------------------------------------------------------------------- shard mode (--data CORPUS_DIR)
def planned_shards(cfg: TrainConfig, manifest: dict) -> list[dict]:
    """The corpus shards this run answers: in order, until ``num_prompts`` prompts are covered."""
    out, n = [], 0
    for shard in manifest["shards"]:
        if n >= cfg.num_prompts:
            break
        out.append(shard)
        n += shard["prompts"]
    return out


def read_manifest(cfg: TrainConfig) -> dict:
    path = data_dir(cfg) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {"shards": {}}


def _gpu_s(entry: dict) -> float:
    """A shard's answering time as wall seconds of the run: its own time over the ranks that answered beside it."""
    return entry["elapsed_s"] / entry.get("ranks", 1)


def run_shards(cfg: TrainConfig, target_dir: Path, log=print, dp: DataParallel = SINGLE) -> dict:
    """Answer the pending prompt shards of the corpus in ``cfg.data`` until done or out of time budget.

    Under N ranks the pending shards go in rounds of N: shard ``i`` of the round to rank ``i``, each rank with its
    own engine on its own device (so pending shard ``k`` lands on rank ``k % N``). Rank 0 plans each round (the
    budgets, the shards present), broadcasts it, and after it gathers the ranks' manifest entries and writes the
    manifest alone: no two processes ever write one file. A shard's rows depend only on the shard (each runs on
    an idle engine), so N ranks write the same bytes as one."""
    from ..runtime.engine import Engine

    out = data_dir(cfg)
    source = corpus.load_manifest(cfg.data)
    plan = planned_shards(cfg, source)
    done = read_manifest(cfg)
    done["corpus"] = {"path": str(Path(cfg.data).absolute()), "settings": source["settings"],
                      "manifest_counts": source["counts"]}
    done["settings"] = _settings(cfg)
    # this call's code, versions and target: the manifest and regenerate.json are results files too
    done["provenance"] = provenance.record(checkpoints={"target": target_dir}) if dp.is_main else None
    for name, entry in done["shards"].items():
        want = next((s["sha256"] for s in source["shards"] if s["name"] == name), None)
        if entry["prompt_sha256"] != want:
            raise DFlashError("--data", f"prompt shard {name} differs from the one {out / MANIFEST} was made from",
                              "resume with the same corpus, or start a new --out")
    if dp.is_main:
        (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    dp.barrier()
    todo = [s for s in plan if s["name"] not in done["shards"]]
    log(f"regenerate: {len(todo)} of {len(plan)} shards to answer ({len(plan) - len(todo)} done earlier) from "
        f"{cfg.data}" + (f" on {dp.size} ranks" if dp.active else ""))
    t0, rounds, budget_hit, closed, answered = time.perf_counter(), [], False, False, []
    engine, device = None, parallel.device_for(cfg.device, dp.local_rank)
    while todo:
        batch, stop = dp.on_main(_next_round, cfg, done, todo, dp.size, time.perf_counter() - t0, rounds)
        if stop == "closed":
            closed = True
            total = sum(_gpu_s(e) for e in done["shards"].values())
            log(f"regenerate: --regen_total_s {cfg.regen_total_s:g} reached ({total:.0f} s in "
                f"{len(done['shards'])} shards); training uses those")
        elif stop == "budget":
            budget_hit = True
        elif stop:
            log(f"regenerate: {stop} is not in {cfg.data}; stopping here (bring the next shards)")
        if not batch:
            break
        todo = [] if stop else todo[len(batch):]   # a round cut short by an absent shard is the call's last
        mine, entry = batch[dp.rank] if dp.rank < len(batch) else None, None
        tr = time.perf_counter()
        if mine is not None:
            if engine is None:
                engine = Engine.from_dirs(target_dir, None, RuntimeConfig(
                    block_size=1, max_batch_size=cfg.regen_batch_size,
                    max_seq_len=cfg.max_prompt_len + cfg.max_new_tokens + 2, device=str(device)))
            ts = time.perf_counter()
            entry = _answer_shard(cfg, engine, mine, out)
            entry["elapsed_s"] = round(time.perf_counter() - ts, 2)
            entry["tokens_per_s"] = round(entry["response_tokens"] / max(entry["elapsed_s"], 1e-9), 1)
            entry["rank"], entry["ranks"] = dp.rank, len(batch)
        entries = [e for e in dp.all_gather_object(entry) if e is not None]
        rounds.append(time.perf_counter() - tr)
        for e in entries:
            done["shards"][e["prompt_shard"]] = e
            answered.append(e)
            log(f"regenerate: {e['prompt_shard']} -> {e['file']} ({e['rows']} rows, {e['response_tokens']} "
                f"response tokens, {e['tokens_per_s']:.0f} tok/s" + (f", rank {e['rank']})" if dp.active else ")"))
        dp.on_main(corpus.write_json, out / MANIFEST, done)
    left = [s["name"] for s in plan if s["name"] not in done["shards"]]
    if closed:
        plan, left = [s for s in plan if s["name"] in done["shards"]], []
    entries = [done["shards"][s["name"]] for s in plan if s["name"] in done["shards"]]
    counts = {"shards_done": len(entries), "shards_planned": len(plan), "shards_left": len(left),
              "time_budget_hit": budget_hit, "closed_by_regen_total_s": closed, "elapsed_s": round(time.perf_counter() - t0, 1),
              "device": str(engine.device) if engine is not None else None, "ranks": dp.size,
              **{k: sum(e[k] for e in entries) for k in ("rows", "too_long", "prompt_tokens", "response_tokens")}}
    new = sum(e["response_tokens"] for e in answered)
    # all ranks together over the rounds' wall time, and one engine alone (its own shards' seconds)
    counts["new_tokens_per_s"] = round(new / max(sum(rounds), 1e-9), 1)
    counts["new_tokens_per_s_per_rank"] = round(new / max(sum(e["elapsed_s"] for e in answered), 1e-9), 1)
    log(f"regenerate: {counts['shards_done']}/{counts['shards_planned']} shards, {counts['rows']} rows, "
        f"{counts['response_tokens']} response tokens" + (f"; {len(left)} shards left for a later call" if left
                                                          else "") + (f"; this call {counts['new_tokens_per_s']:.0f} "
                                                                      "tok/s" if answered else ""))
    if not left:
        if counts["rows"] == 0:
            raise DFlashError("--data", "no prompt was regenerated", "check --num_prompts and --max_prompt_len")
        dp.on_main((out / DONE_FILE).write_text, json.dumps({"settings": _settings(cfg), "counts": counts,
                                                             "shards": [s["name"] for s in plan],
                                                             "provenance": done["provenance"]}, indent=2) + "\n")
    return counts


def _next_round(cfg: TrainConfig, done: dict, todo: list[dict], ranks: int, elapsed: float,
                rounds: list[float]) -> tuple[list[dict], str | None]:
    """Rank 0's plan of the next round: (up to ``ranks`` shards, why the stage stops after them or None)."""
    # --regen_total_s: the shards' own times over their ranks, summed over every call (the manifest keeps them)
    total = sum(_gpu_s(e) for e in done["shards"].values())
    mean = total / len(done["shards"]) if done["shards"] else 0.0
    # a round of k shards adds about k of those (each shard's own time over its k ranks)
    if cfg.regen_total_s and done["shards"] and total + mean * min(ranks, len(todo)) > cfg.regen_total_s:
        return [], "closed"
    # A shard is never cut: start a round only if the mean round time of this call still fits in the budget.
    if cfg.regen_time_budget_s and rounds and elapsed + sum(rounds) / len(rounds) > cfg.regen_time_budget_s:
        return [], "budget"
    batch = []
    for shard in todo[:ranks]:
        if not (Path(cfg.data) / shard["name"]).is_file():
            # A corpus may travel in windows of shards (the manifest and the next few): stop at the first absent one.
            return batch, shard["name"]
        batch.append(shard)
    return batch, None


def _samples(cfg: TrainConfig, pid: str, temperature: float,
             first_seed: int | None = None) -> list[tuple[str, float, int]]:
    """(row id, temperature, seed) of each answer to prompt ``pid``: the first as the prompt asks, with the seed
    every earlier run gave it (``first_seed``: the prompt file's order; else the corpus' hash), so --regen_samples
    1 writes the bytes it always did; each further one at T=1 with a seed of its own and the id ``pid#k``."""
    def seed(key: str) -> int:
        return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    first = seed(f"{cfg.seed}:{pid}") if first_seed is None else first_seed
    return [(pid, temperature, first)] + [
        (f"{pid}#{k}", 1.0, seed(f"{cfg.seed}:{pid}#{k}")) for k in range(1, cfg.regen_samples)]


def _answer_shard(cfg: TrainConfig, engine, shard: dict, out: Path) -> dict:
    """Answer every prompt of one shard on an idle engine; write its rows in prompt order, atomically."""
    rows = corpus.read_shard(cfg.data, shard)
    todo, too_long = [], 0
    for i, r in enumerate(rows):
        ids = _prompt_ids(prompts.Source(r["id"], messages=tuple(r["messages"])), engine)
        if len(ids) > cfg.max_prompt_len:
            too_long += 1
            continue
        t = float(r.get("temperature", cfg.regen_temperature))
        for k, (pid, temp, seed) in enumerate(_samples(cfg, r["id"], t)):
            todo.append(((i, k), pid, ids, SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temp,
                                                          seed=seed)))
    results: dict[tuple[int, int], dict] = {}   # (row, sample) -> the answer
    pending, active = list(reversed(todo)), {}
    while pending or active:
        while pending and len(active) < 2 * cfg.regen_batch_size:
            i, pid, ids, params = pending.pop()
            active[engine.add_request(ids, params).request_id] = (i, pid, params.temperature)
        for req in engine.step():
            i, pid, temp = active.pop(req.request_id)
            results[i] = {"id": pid, "prompt_len": len(req.prompt_ids), "input_ids": req.prompt_ids + req.output_ids,
                          "finish_reason": req.finish_reason, "temperature": temp}
    name = "regen-" + shard["name"].removeprefix("prompts-")
    path = out / SHARD_DIR / name
    corpus.write_gz(path, [results[i] for i in sorted(results)])
    return {"file": f"{SHARD_DIR}/{name}", "sha256": sha256_file(path), "bytes": path.stat().st_size,
            "prompt_shard": shard["name"], "prompt_sha256": shard["sha256"], "rows": len(results),
            "too_long": too_long, "prompt_tokens": sum(r["prompt_len"] for r in results.values()),
            "response_tokens": sum(len(r["input_ids"]) - r["prompt_len"] for r in results.values()),
            "finish_reasons": dict(Counter(r["finish_reason"] for r in results.values()))}


def load_rows(cfg: TrainConfig) -> list[dict]:
    """The training rows of a finished regenerate stage (either mode), each with its ``loss_mask``."""
    if not corpus.is_corpus(cfg.data):
        return read_rows(data_dir(cfg) / DATA_FILE)
    manifest, rows = read_manifest(cfg), []
    # the shards the finished stage used: fewer than planned when --regen_total_s closed it early
    done = data_dir(cfg) / DONE_FILE
    used = json.loads(done.read_text()).get("shards") if done.is_file() else None
    for shard in planned_shards(cfg, corpus.load_manifest(cfg.data)):
        if used is not None and shard["name"] not in used:
            continue
        entry = manifest["shards"].get(shard["name"])
        path = data_dir(cfg) / entry["file"] if entry else None
        if path is None or not path.is_file():
            raise DFlashError("training data", f"regenerated shard for {shard['name']} is missing in "
                              f"{data_dir(cfg) / SHARD_DIR}", "copy the shards back, or run --stages regenerate")
        if sha256_file(path) != entry["sha256"]:
            raise DFlashError("training data", f"{path} does not match its sha256 in {MANIFEST}", "copy it again")
        for r in corpus.read_gz(path):
            r["loss_mask"] = [0] * r["prompt_len"] + [1] * (len(r["input_ids"]) - r["prompt_len"])
            rows.append(r)
    return rows

