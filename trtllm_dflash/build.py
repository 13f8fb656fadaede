# SPDX-License-Identifier: Apache-2.0
"""dflash-build: a Hugging Face target + its DFlash drafter -> a deployment ("engine") directory.

Consumes: a target and a drafter (short name, local folder or hub id; any known drafter format).
Produces: ``<out>/{manifest.json, llm_api_options.yaml, target/, drafter/, ranks/, triton/}``, written into a
hidden temp dir beside ``<out>`` and renamed into place, after every check that needs no GPU has passed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import __version__
from . import build_config as bc
from . import trtllm
from .bench.helpformat import HelpFormatter
from .checkpoints import drafter_formats, manifest, memory_fit, resolve, trtllm_checks
from .deployment import FORMAT_VERSION, Deployment
from .errors import DFlashError
from .model_config import DrafterConfig
from .versions import installed


@dataclass(frozen=True)
class Plan:
    """Everything decided before any file is written; a dry run prints it and stops."""

    cfg: bc.BuildConfig
    target: resolve.Resolved
    drafter: resolve.Resolved
    target_cfg: dict
    drafter_cfg: dict                   # canonical z-lab config.json
    drafter_format: str
    notes: tuple[str, ...]              # what normalising the drafter changes
    architecture: str
    max_draft_len: int
    attention_backend: str | None
    moe_backend: str | None
    validation: dict
    options: dict | None                # llm_api_options.yaml content; None on CPU
    config_from: tuple[str, str] = ("", "")   # where the target / drafter config.json was read
    memory: memory_fit.Fit | None = None      # estimated per-GPU use; None on CPU
    draft_policy: str | None = None           # torch backend: adaptive | fixed (auto resolved)
    schedule: dict | None = None              # the draft_len_schedule written for TensorRT-LLM, if any
    schedule_from: str = ""                   # where it came from (the summary and the manifest say it)

    @property
    def untrained(self) -> bool:
        return self.drafter.kind == "untrained"


def make_plan(cfg: bc.BuildConfig, *, dry_run: bool) -> Plan:
    """Resolve configs (no weights) and run every check; raises DFlashError on the first failure."""
    target_spec, drafter_spec = resolve.expand_short_name(cfg.target, cfg.drafter)
    target = resolve.resolve(target_spec, role="target", revision=cfg.target_revision, download=False)
    drafter = resolve.resolve(drafter_spec, role="drafter", revision=cfg.drafter_revision, download=False)
    target_cfg, target_from = _config(target, "target", dry_run=dry_run)
    gpu = trtllm_checks.gpu_profile(cfg.gpu)
    arch = trtllm_checks.architecture(target_cfg)
    validation: dict[str, str] = {}
    trtllm_checks.check_backend(cfg.backend, gpu, arch)
    validation["architecture"] = "ok"
    trtllm_checks.check_quant(cfg.quant, gpu, arch)
    if cfg.quant is not None:
        validation.update(_quant_checks(cfg, dry_run=dry_run))
    if drafter.kind == "untrained":
        from .checkpoints.drafter_init import drafter_config

        raw, fmt, drafter_from = drafter_config(target_cfg, **UNTRAINED_SHAPE), "z-lab", "drafter_init"
    else:
        raw, drafter_from = _config(drafter, "drafter", dry_run=dry_run)
        fmt = cfg.drafter_format or drafter_formats.detect(raw, _files(drafter))
    norm = drafter_formats.canonical_config(raw, fmt, target_cfg)
    block_size = int(norm.config["block_size"])
    max_draft_len = cfg.max_draft_len if cfg.max_draft_len is not None else block_size - 1
    if not 1 <= max_draft_len <= block_size - 1:
        raise DFlashError("max_draft_len", f"{max_draft_len} does not fit the drafter's block_size {block_size}",
                          f"use 1 <= --max_draft_len <= {block_size - 1}")
    from .checkpoints import validate

    for name in validate.check_pair(target_cfg, DrafterConfig.from_hf(norm.config), tp_size=cfg.tp_size,
                                    block_size=max_draft_len + 1):
        validation[f"pair {name}"] = "ok"
    trtllm_checks.check_parallel(target_cfg, cfg.tp_size, cfg.ep_size)
    validation["ep_size"] = "ok"
    if cfg.draft_len_schedule:
        trtllm.check_schedule(cfg.draft_len_schedule, max_draft_len, max_batch_size=cfg.max_batch_size)
    schedule, schedule_from = _schedule(cfg, target.source, max_draft_len, validation)
    if cfg.backend == "torch" and (cfg.draft_len_schedule or cfg.max_concurrency or cfg.use_rejection_sampling
                                   or cfg.enable_block_reuse):
        raise DFlashError("backend", "draft_len_schedule, max_concurrency, use_rejection_sampling and "
                          "enable_block_reuse are TensorRT-LLM settings", "use --backend trtllm, or drop them")
    attention = trtllm_checks.pick_drafter_attention(gpu, cfg.attention_backend)
    moe = trtllm_checks.pick_moe_backend(gpu, target_cfg, cfg.moe_backend)
    if cfg.mxfp4_moe != "auto":
        if target_cfg.get("model_type") != "gpt_oss":
            raise DFlashError("mxfp4_moe", f"is for gpt-oss's MXFP4 experts; the target is "
                              f"{target_cfg.get('model_type')!r}", "drop --mxfp4_moe")
        if gpu.family == "cpu":
            raise DFlashError("mxfp4_moe", f"{cfg.mxfp4_moe} runs on GPUs (the CPU dequantises the experts)",
                              "drop --mxfp4_moe for --gpu cpu")
    validation["gpu backends"] = "ok"
    trtllm_checks.check_runtime_sizes(target_cfg, max_seq_len=cfg.max_seq_len, max_batch_size=cfg.max_batch_size,
                                      max_num_tokens=cfg.max_num_tokens, max_draft_len=max_draft_len)
    validation["runtime sizes"] = "ok"
    fit = None
    if gpu.family != "cpu":
        fit = memory_fit.check(target_cfg, norm.config, gpu_name=gpu.name, memory_gib=gpu.memory_gib,
                               tp_size=cfg.tp_size, dtype=cfg.dtype, quant=cfg.quant,
                               expert_copies=2 if cfg.mxfp4_moe == "triton_kernels" else 1,
                               max_batch_size=cfg.max_batch_size, max_seq_len=cfg.max_seq_len,
                               free_gpu_memory_fraction=cfg.free_gpu_memory_fraction)
        validation["memory"] = "ok" if fit.full_batches >= cfg.max_batch_size else (
            f"warning: the KV cache holds {fit.full_batches} of max_batch_size {cfg.max_batch_size} sequences of "
            f"max_seq_len tokens per GPU (shorter ones share it)")
    for key in ("rope_theta",):
        if key in target_cfg and key in norm.config and target_cfg[key] != norm.config[key]:
            # ModelOpt exports once wrote 10000 here; a wrong theta silently ruins acceptance.
            validation[f"drafter {key}"] = f"warning: {norm.config[key]} != target {target_cfg[key]}"
    if drafter.kind == "untrained":
        validation["drafter trained"] = "warning: untrained drafter (acceptance ~1, plumbing demo only)"
    options = None if gpu.family == "cpu" else trtllm.llm_api_options(
        tp_size=cfg.tp_size, ep_size=cfg.ep_size if trtllm_checks.is_moe(target_cfg) else None, dtype=cfg.dtype,
        max_batch_size=cfg.max_batch_size, max_num_tokens=cfg.max_num_tokens, max_seq_len=cfg.max_seq_len,
        free_gpu_memory_fraction=cfg.free_gpu_memory_fraction, trust_remote_code="auto_map" in target_cfg,
        moe_backend=moe, speculative_model=str(_abs_out(cfg) / "drafter"), max_draft_len=max_draft_len,
        target_layer_ids=norm.config["dflash_config"]["target_layer_ids"],
        mask_token_id=norm.config["dflash_config"]["mask_token_id"], attention_backend=attention,
        draft_len_schedule=schedule, max_concurrency=cfg.max_concurrency,
        use_rejection_sampling=cfg.use_rejection_sampling, context_recompute_tail=cfg.context_recompute_tail)
    return Plan(cfg=cfg, target=target, drafter=drafter, target_cfg=target_cfg, drafter_cfg=norm.config,
                drafter_format=fmt, notes=tuple(norm.notes), architecture=arch, max_draft_len=max_draft_len,
                attention_backend=attention, moe_backend=moe, validation=validation, options=options,
                config_from=(target_from, drafter_from), memory=fit, draft_policy=_draft_policy(cfg),
                schedule=schedule if options is not None else None,
                schedule_from=schedule_from if options is not None else "")


def _draft_policy(cfg: bc.BuildConfig) -> str | None:
    """The torch runtime's policy; auto = adaptive on CPU at tp 1, fixed elsewhere (reasons: --draft_policy help)."""
    if cfg.backend != "torch":
        return None
    if cfg.draft_policy != "auto":
        return cfg.draft_policy
    return "adaptive" if cfg.gpu == "cpu" and cfg.tp_size == 1 else "fixed"


def _schedule(cfg: bc.BuildConfig, target_source: str, max_draft_len: int, validation: dict) -> tuple[dict | None, str]:
    """TensorRT-LLM's draft_len_schedule: the user's (a flag or the preset) wins, ``none`` turns it off, else the
    one our cost model derives where a step-cost table was measured for this GPU and target."""
    if cfg.backend != "trtllm":
        return None, ""
    from . import draft_schedule

    if cfg.draft_len_schedule:
        zeros = draft_schedule.zero_draft_batch_sizes(cfg.draft_len_schedule, cfg.max_batch_size)
        if zeros:
            raise DFlashError("draft_len_schedule", f"drafts 0 at batch sizes {zeros[0]}..{zeros[-1]} "
                              f"(max_batch_size {cfg.max_batch_size}): {draft_schedule.ZERO_DRAFT_REASON}",
                              f"map every batch size up to {cfg.max_batch_size} to a draft length >= "
                              f"{draft_schedule.MIN_DRAFT_LEN} (end it with {cfg.max_batch_size}:1 or more)")
        return cfg.draft_len_schedule, "given (--draft_len_schedule or the preset)"
    if cfg.draft_len_schedule == {}:
        return None, "off (--draft_len_schedule none)"
    if cfg.max_concurrency is not None:
        if cfg.max_concurrency < cfg.max_batch_size:   # TensorRT-LLM reads it as {max_concurrency: max_draft_len}
            validation["max_concurrency"] = (f"warning: drafts 0 above {cfg.max_concurrency} concurrent requests: "
                                             f"{draft_schedule.ZERO_DRAFT_REASON}")
        return None, "not derived: --max_concurrency given (TensorRT-LLM refuses both)"
    derived = draft_schedule.derive(cfg.gpu, target_source, max_draft_len=max_draft_len,
                                    max_batch_size=cfg.max_batch_size, acceptance_rate=cfg.draft_acceptance_rate)
    if derived is None:
        return None, f"none: no measured step-cost table for {target_source} on {cfg.gpu}"
    if derived.note:
        validation["draft_len_schedule"] = f"warning: {derived.note}"
    if derived.schedule is None:
        return None, (f"none needed: our policy's {derived.source} drafts {max_draft_len} at every batch size up to "
                      f"{cfg.max_batch_size}")
    return derived.schedule, (f"derived from our policy's {derived.source}; at least {draft_schedule.MIN_DRAFT_LEN} "
                              f"draft at every batch size: {draft_schedule.ZERO_DRAFT_REASON}")


# The demo's untrained drafter: one layer, block 16 (target_layer_ids by the z-lab rule, last vocab id as mask).
UNTRAINED_SHAPE = {"num_layers": 1, "block_size": 16}


def _config(res: resolve.Resolved, role: str, *, dry_run: bool) -> tuple[dict, str]:
    """(config.json, where it came from). Dry runs never download; real builds fetch config.json only."""
    from .checkpoints import hf

    if res.path is not None:
        return hf.read_config(res.path), str(res.path)
    public = resolve.public_config(res.source)
    if dry_run and public is not None:
        return public, "the public-config table (the real build reads the checkpoint's config.json)"
    if res.kind == "packaged":
        path = resolve.resolve(res.spec, role=role).path
        return hf.read_config(path), str(path)
    if dry_run:
        raise DFlashError(res.spec, "a dry run needs its config.json: not a known model and not in the local HF cache",
                          "pass a local folder, or run once without --dry_run to download it")
    path = resolve.fetch_config(res, role)
    return hf.read_config(path), str(path / "config.json")


def _files(res: resolve.Resolved) -> set[str]:
    return {p.name for p in res.path.iterdir()} if res.path is not None else set()


# Where the YAML's paths point when a dry run has no --out: a visible placeholder, never a made-up folder under cwd.
NO_OUT = "<out>"


def _abs_out(cfg: bc.BuildConfig) -> Path:
    return Path(cfg.out).expanduser().absolute() if cfg.out else Path(NO_OUT)


def _quant_checks(cfg: bc.BuildConfig, *, dry_run: bool) -> dict[str, str]:
    """ModelOpt must import before anything is written (a dry run needs none); what to say about the result."""
    if not dry_run:
        from .quantize import require_modelopt

        require_modelopt()
    out = {"quant": "ok"}
    if cfg.calib_data == "random":
        out["calib_data"] = "warning: random token ids calibrate activation ranges poorly (plumbing tests only)"
    if cfg.backend == "torch":
        out["quant on the torch backend"] = ("warning: weights are dequantised on load (the quantized values, run "
                                             "in the model dtype: no speed or memory gain)")
    return out


# ---- writing the directory ---------------------------------------------------------------------------
def build(cfg: bc.BuildConfig, *, force: bool = False, plan: Plan | None = None, log=print) -> Path:
    """Plan, validate, then write ``cfg.out`` atomically; reuse it when it was built from the same inputs."""
    if not cfg.out:
        raise DFlashError("out", "missing", "pass --out DIR (or --dry_run to only print the plan)")
    out = Path(cfg.out).expanduser().absolute()
    plan = plan or make_plan(cfg, dry_run=False)
    stamp = fingerprint(plan)
    if _reusable(out, stamp, force):
        log(f"{out} is up to date (same inputs and settings; --force rebuilds it)")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        record = write_directory(plan, tmp, stamp, log=log)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out} ({len(record['files'])} files)")
    return out


def write_directory(plan: Plan, tmp: Path, stamp: str, *, log=print) -> dict:
    """Fill ``tmp``; manifest.json is written last, so only a finished directory has one."""
    from .checkpoints import hf, validate

    cfg = plan.cfg
    target = resolve.resolve(plan.target.spec, role="target", revision=cfg.target_revision)
    if cfg.quant is None:
        target_files = _link_target(target.path, tmp / "target", copy=cfg.copy_target, allow_pickle=cfg.allow_pickle)
        quant = None
    else:   # ModelOpt PTQ writes a new target folder (weights, hf_quant_config.json, tokenizer files)
        from . import quantize

        hf.weight_files(target.path, allow_pickle=cfg.allow_pickle)
        target_files = "written"
        quant = quantize.record_dict(quantize.quantize_target(
            target.path, tmp / "target", quant=cfg.quant, calib_data=cfg.calib_data, calib_size=cfg.calib_size,
            log=log))
    if plan.untrained:
        from .checkpoints.drafter_init import write_random_drafter

        write_random_drafter(target.path, tmp / "drafter", **UNTRAINED_SHAPE, seed=0)
        drafter, notes = plan.drafter, ["untrained: random weights from checkpoints.drafter_init (seed 0)"]
    else:
        drafter = resolve.resolve(plan.drafter.spec, role="drafter", revision=cfg.drafter_revision)
        notes = drafter_formats.normalise(drafter.path, tmp / "drafter", target.path, plan.target_cfg,
                                          fmt=plan.drafter_format, allow_pickle=cfg.allow_pickle).notes
    drafter_cfg = hf.read_config(tmp / "drafter")
    validate.check_pair(plan.target_cfg, DrafterConfig.from_hf(drafter_cfg), tp_size=cfg.tp_size,
                        block_size=plan.max_draft_len + 1)
    if cfg.presharded:
        _write_ranks(tmp, cfg.tp_size, cfg.allow_pickle, log, ep_size=cfg.ep_size)
    if plan.options is not None:
        (tmp / trtllm.OPTIONS_FILE).write_text(trtllm.dump_options(plan.options, quant=cfg.quant))
    record = _manifest(plan, target, drafter, drafter_cfg, notes, stamp)
    record["target"]["files"] = target_files
    record["target"]["linked"] = target_files == "symlink"
    record["self_contained"] = target_files != "symlink"
    if target_files == "symlink":
        record["validation"]["self-contained"] = (f"warning: target/ links into {target.path} (another filesystem): "
                                                  "the directory does not move to another machine (--copy_target)")
        log(f"self-contained: {record['validation']['self-contained']}")
    record["quant"] = quant
    record["out"] = str(_abs_out(cfg))
    if not any((tmp / "target" / name).exists() for name in ("tokenizer.json", "tokenizer.model")):
        # Token-id clients still work; text prompts, trtllm-serve and Triton need a tokenizer.
        record["validation"]["target tokenizer"] = "warning: none in the target folder (text prompts need one)"
    record["triton"] = _fill_triton(tmp, record)
    files = manifest.hash_tree(tmp)
    record["files"], record["sizes"] = files, {rel: (tmp / rel).stat().st_size for rel in files}
    Deployment.write(tmp, record)
    return record


def _link_target(src: Path, dst: Path, *, copy: bool, allow_pickle: bool) -> str:
    """Hard-link (or copy) the target's top-level files; subfolders (e.g. gpt-oss original/) are not needed.

    Hard links, not symbolic ones: they cost no disk, yet the directory holds the files themselves, so it moves,
    copies (cp -r, rsync, scp) and outlives a cleaned cache. Across filesystems a hard link is impossible; then
    the files are symbolic links into the cache (absolute, as the cache does not move with the directory), and
    the manifest says the directory is not self-contained (--copy_target makes it so). Returns how: "hardlink",
    "symlink" or "copy"."""
    from .checkpoints import hf

    hf.weight_files(src, allow_pickle=allow_pickle)   # refuses pickle-only checkpoints early
    dst.mkdir()
    files = [f for f in sorted(src.iterdir()) if not f.name.startswith(".") and f.is_file()
             and (allow_pickle or f.suffix not in hf.PICKLE_SUFFIXES)]
    if copy:
        for f in files:
            _copy_with_progress(f, dst / f.name)
        return "copy"
    try:
        for f in files:
            os.link(f.resolve(), dst / f.name)
        return "hardlink"
    except OSError:     # another filesystem (EXDEV), or links not allowed there
        for done in dst.iterdir():      # one kind per directory, so the manifest can say which
            done.unlink()
    for f in files:
        os.symlink(f.resolve(), dst / f.name)
    return "symlink"


def _copy_with_progress(src: Path, dst: Path) -> None:
    from tqdm import tqdm

    size = src.stat().st_size
    with open(src, "rb") as fi, open(dst, "wb") as fo, tqdm(total=size, unit="B", unit_scale=True,
                                                            desc=f"copy {src.name}", disable=size < 256 << 20) as bar:
        while chunk := fi.read(8 << 20):
            fo.write(chunk)
            bar.update(len(chunk))


def _write_ranks(tmp: Path, tp_size: int, allow_pickle: bool, log, ep_size: int = 1) -> None:
    """ranks/rank{r}.safetensors: each torch-backend rank then reads only its own shard."""
    from tqdm import tqdm

    from .checkpoints import hf
    from .runtime.shard import shard_for_rank

    target_sd = hf.load_state_dict(tmp / "target", allow_pickle=allow_pickle)
    drafter_sd = hf.load_state_dict(tmp / "drafter")
    kv_heads = tuple(c.get("num_key_value_heads") or c["num_attention_heads"]
                     for c in (hf.read_config(tmp / "target"), hf.read_config(tmp / "drafter")))
    for rank in tqdm(range(tp_size), desc="pre-shard ranks", disable=tp_size == 1):
        hf.save_state_dict(shard_for_rank(target_sd, drafter_sd, tp_size, rank, ep_size, kv_heads), tmp / "ranks",
                           f"rank{rank}.safetensors")
    log(f"pre-sharded {tp_size} rank file(s)")


def _fill_triton(tmp: Path, record: dict) -> str:
    """The Triton model repository is written by trtllm_dflash.serving.repo, when that module exists.

    It is called on the temp dir; ``record["out"]`` is where the directory will live once renamed."""
    try:
        from .serving import repo
    except ModuleNotFoundError as err:
        if err.name not in ("trtllm_dflash.serving.repo", "trtllm_dflash.serving"):
            raise
        return "skipped: trtllm_dflash.serving.repo is not available"
    repo.fill_triton(tmp, record)
    return "filled"


def _manifest(plan: Plan, target: resolve.Resolved, drafter: resolve.Resolved, drafter_cfg: dict,
              notes: list[str], stamp: str) -> dict:
    cfg, dflash = plan.cfg, drafter_cfg["dflash_config"]
    return {
        "format_version": FORMAT_VERSION, "backend": cfg.backend, "tp_size": cfg.tp_size,
        "ep_size": cfg.ep_size, "gpu": cfg.gpu, "quant": None,
        "runtime": {"max_batch_size": cfg.max_batch_size, "max_seq_len": cfg.max_seq_len,
                    "block_size": plan.max_draft_len + 1, "dtype": cfg.dtype,
                    **({"draft_policy": plan.draft_policy} if plan.draft_policy else {}),
                    **({"batch_invariant": True} if cfg.batch_invariant else {}),
                    **({"mxfp4_moe": cfg.mxfp4_moe} if cfg.mxfp4_moe != "auto" else {})},
        "target": {"path": "target", "source": target.source, "kind": target.kind, "revision": target.revision,
                   "architecture": plan.architecture,
                   "linked": not cfg.copy_target and cfg.quant is None},
        "drafter": {"path": "drafter", "source": drafter.source, "kind": drafter.kind, "revision": drafter.revision,
                    "format": plan.drafter_format, "untrained": plan.untrained, "normalised": notes,
                    "block_size": drafter_cfg["block_size"], "num_layers": drafter_cfg["num_hidden_layers"],
                    "target_layer_ids": dflash["target_layer_ids"], "mask_token_id": dflash["mask_token_id"]},
        "trtllm": None if plan.options is None else {
            "options": trtllm.OPTIONS_FILE, "versions": trtllm.version_range(plan.options),
            "min_version": trtllm.min_version(plan.options), "schema": trtllm.SCHEMA_VERSION,
            "max_draft_len": plan.max_draft_len, "draft_len_schedule": plan.schedule,
            "draft_len_schedule_from": plan.schedule_from,
            "attention_backend": plan.attention_backend, "moe_backend": plan.moe_backend},
        "presharded": cfg.presharded, "settings": asdict(cfg), "inputs_fingerprint": stamp,
        "validation": plan.validation, "versions": _versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _versions() -> dict:
    return {"trtllm_dflash": __version__, "python": platform.python_version(),
            **installed("torch", "transformers", "safetensors", "huggingface_hub")}


def fingerprint(plan: Plan) -> str:
    """What makes two builds the same: settings, tool version and the identity of both inputs."""
    settings = {k: v for k, v in asdict(plan.cfg).items() if k != "out"}
    if plan.cfg.quant is None:   # calibration settings only matter to quantized builds
        settings = {k: v for k, v in settings.items() if not k.startswith("calib_")}
    inputs = {"version": __version__, "settings": settings, "target": _stamp(plan.target),
              "drafter": _stamp(plan.drafter)}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _stamp(res: resolve.Resolved) -> dict:
    stamp = {"source": res.source, "revision": res.revision}
    if res.kind == "local":
        stamp["files"] = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in res.path.iterdir()
                                if p.is_file())
    return stamp


def _reusable(out: Path, stamp: str, force: bool) -> bool:
    if not out.exists():
        return False
    if not out.is_dir():
        raise DFlashError("out", f"{out} is a file", "choose another --out")
    has_manifest = Deployment.is_deployment(out)
    if not has_manifest and any(out.iterdir()):
        raise DFlashError("out", f"{out} exists and is not a deployment directory",
                          "choose another --out (dflash-build never replaces other folders, even with --force)")
    if not has_manifest or force:
        return False
    try:
        old = Deployment.open(out).manifest
    except DFlashError:
        old = {}
    if old.get("inputs_fingerprint") == stamp and not manifest.verify(out, old, full=False):
        return True
    raise DFlashError("out", f"{out} holds a deployment built from other inputs or settings (or damaged)",
                      "pass --force to rebuild it, or choose another --out")


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished temp dir into place; an old deployment is moved aside first, then deleted."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(out: Path) -> None:
    """Temp dirs of killed builds (their pid is gone) never look complete; clear them away."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- printing -------------------------------------------------------------------------------------------
def describe(plan: Plan) -> str:
    cfg, t, d = plan.cfg, plan.target_cfg, plan.drafter_cfg
    gpu = trtllm_checks.gpu_profile(cfg.gpu)
    experts = trtllm_checks.num_experts(t)

    def origin(res: resolve.Resolved, where: str) -> str:
        if res.kind == "untrained":
            return "untrained (random weights written for this target)"
        return f"{res.source} [{res.kind}, revision {res.revision or '-'}] config from {where}"

    warnings = [f"{k}: {v}" for k, v in plan.validation.items() if v != "ok"]
    lines = [
        f"target   {origin(plan.target, plan.config_from[0])}",
        f"         {plan.architecture}: {t['num_hidden_layers']} layers, hidden {t['hidden_size']}, "
        f"{t['num_attention_heads']}/{t.get('num_key_value_heads')} heads, vocab {t['vocab_size']}"
        + (f", {experts} experts" if experts else ""),
        f"drafter  {origin(plan.drafter, plan.config_from[1])}",
        f"         format {plan.drafter_format}: {d['num_hidden_layers']} layers, block_size {d['block_size']}, "
        f"target_layer_ids {d['dflash_config']['target_layer_ids']}, mask_token_id {d['dflash_config']['mask_token_id']}",
        *[f"         normalise: {n}" for n in plan.notes],
        f"backend  {cfg.backend} on {gpu.name} ({gpu.family}" + (f", SM{gpu.sm})" if gpu.sm else ")")
        + f"  tp {cfg.tp_size}  ep {cfg.ep_size}  dtype {cfg.dtype}",
        f"runtime  max_batch_size {cfg.max_batch_size}  max_seq_len {cfg.max_seq_len}  max_num_tokens "
        f"{cfg.max_num_tokens}  max_draft_len {plan.max_draft_len} (block {plan.max_draft_len + 1})"
        + (f"  draft_policy {plan.draft_policy}" + (" (auto)" if cfg.draft_policy == "auto" else "")
           if plan.draft_policy else "") + ("  batch_invariant" if cfg.batch_invariant else ""),
        f"kernels  drafter attention {plan.attention_backend or '-'}  moe {plan.moe_backend or '-'}  "
        f"target attention {trtllm_checks.TARGET_ATTN_BACKEND if plan.options else '-'}"
        + (f"  mxfp4_moe {cfg.mxfp4_moe}" if cfg.mxfp4_moe != "auto" else ""),
        *([f"trtllm   TensorRT-LLM {trtllm.version_range(plan.options)} (schema {trtllm.SCHEMA_VERSION})"
           + (f"  block reuse, recompute tail {cfg.context_recompute_tail}" if cfg.enable_block_reuse else ""),
           *([f"         {trtllm.schedule_line(plan.schedule, plan.schedule_from)}"] if plan.schedule_from else [])]
          if plan.options else []),
        *([f"memory   per GPU: weights {plan.memory.weights_gib:.1f} GiB, KV cache {plan.memory.kv_gib_per_seq:.2f} GiB "
           f"per {cfg.max_seq_len}-token sequence, {plan.memory.kv_budget_gib:.1f} GiB for it "
           f"(estimated from config.json)"] if plan.memory else []),
        f"checks   {sum(v == 'ok' for v in plan.validation.values())} passed"
        + "".join(f"\n         {w}" for w in warnings),
        *([f"quant    {cfg.quant}: ModelOpt PTQ of the target, calibrated on {cfg.calib_data} x {cfg.calib_size} "
           "prompts"] if cfg.quant else []),
        f"out      {_abs_out(cfg)}" if cfg.out else f"out      not given: {NO_OUT} in the YAML stands for the --out "
        "directory a real build writes",
    ]
    if plan.untrained:
        lines.append("NOTE     the drafter is UNTRAINED: output equals the target's, acceptance ~1 token/step "
                     "(a demo of the plumbing, not a speed-up)")
    return "\n".join(lines)


def commands(out: Path, record_like: dict) -> list[str]:
    """The exact lines to run this directory."""
    lines = []
    if record_like["backend"] == "torch":
        lines.append(f"dflash-generate --deployment_dir {out} --prompt 'Hello'")
    if (out / trtllm.OPTIONS_FILE).is_file() or record_like.get("trtllm"):
        lines.append(trtllm.shell_line(trtllm.serve_command(out)))
        lines += [trtllm.shell_line(c) for c in trtllm.bench_commands(out, record_like)]
    return lines


# ---- command line ---------------------------------------------------------------------------------------
EXAMPLES = r"""examples:
  dflash-build --target smollm2-135m --gpu cpu --out engines/smollm2/cpu/1-gpu   # demo, the shipped drafter
  dflash-build --config build_configs/gpt-oss-120b_b300_tp8.yaml --dry_run       # plan + YAML, no download
  dflash-build --tp 8 --target gpt-oss-120b --gpu h200 --out engines/gpt-oss-120b  # its preset's values
  dflash-build --config build_configs/qwen3-8b_h100_tp1.yaml --out /models/qwen3-8b-dflash
  dflash-build --target Qwen/Qwen3-8B --drafter ./my-specforge-ckpt --tp 2 --backend torch --presharded \
      --out engines/qwen3-8b/tp2
  dflash-build --config build_configs/qwen3-8b_b200_tp1.yaml --quant nvfp4 \
      --out /models/qwen3-8b-nvfp4                                              # ModelOpt PTQ of the target
  dflash-build inspect engines/smollm2/cpu/1-gpu                                  # summary + sha256 check

short names: gpt-oss-120b, gpt-oss-20b, qwen3-8b, llama-3.1-8b, smollm2-135m (target + its known drafter)
drafter formats: z-lab, modelopt, speculators, specforge (normalised to the z-lab layout)
"""


# Examples kept one per line; "(default: X)" only where there is a value (not for flags or None).
_Formatter = HelpFormatter


def build_parser(show_defaults: bool = True) -> argparse.ArgumentParser:
    """``show_defaults=False`` gives a parser whose namespace holds only the flags actually typed."""
    d = bc.BuildConfig.__dataclass_fields__
    kw = (lambda name: {"default": d[name].default}) if show_defaults else (lambda name: {"default": argparse.SUPPRESS})
    p = argparse.ArgumentParser(prog="dflash-build", description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                formatter_class=_Formatter,
                                argument_default=None if show_defaults else argparse.SUPPRESS)
    p.add_argument("--config", default=argparse.SUPPRESS if not show_defaults else None,
                   help="preset YAML (build_configs/<model>_<gpu>_tp<N>.yaml); flags override it. Without it, the "
                   "preset named after --target, --gpu and --tp is used when one exists")
    p.add_argument("--no_preset", action="store_true", default=False if show_defaults else argparse.SUPPRESS,
                   help="without --config: use the built-in defaults even where a preset matches")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--target", default=None if show_defaults else argparse.SUPPRESS,
                   help="short name, local HF folder or hub id (required, here or in --config)")
    g.add_argument("--drafter", **kw("drafter"), help="hub id, folder or smollm2-135m-dflash (ships with this "
                   "package); default: the target's known drafter; 'untrained' = random drafter (demo)")
    g.add_argument("--drafter_format", choices=drafter_formats.KNOWN_FORMATS, **kw("drafter_format"),
                   help="skip format detection")
    g.add_argument("--target_revision", **kw("target_revision"), help="hub branch, tag or commit")
    g.add_argument("--drafter_revision", **kw("drafter_revision"), help="hub branch, tag or commit")
    g.add_argument("--allow_pickle", action="store_true", **kw("allow_pickle"),
                   help="accept *.bin/*.pt weights (loaded with torch.load(weights_only=True))")
    g = p.add_argument_group("parallelism and hardware")
    g.add_argument("--tp_size", "--tp", type=int, **kw("tp_size"), help="tensor-parallel ranks")
    g.add_argument("--ep_size", "--ep", type=int, **kw("ep_size"), help="expert-parallel size (MoE targets)")
    g.add_argument("--gpu", choices=bc.GPU_NAMES, **kw("gpu"), help="the GPU the deployment is built and checked for (not this machine's: a CPU-only box builds for "
                   "an H100 by default); cpu = our runtime on CPU")
    g.add_argument("--backend", choices=bc.BACKENDS, **kw("backend"),
                   help=f"torch = our runtime (CPU/GPU), trtllm = TensorRT-LLM >={trtllm.MIN_VERSION},<{trtllm.BELOW_VERSION}")
    g = p.add_argument_group("runtime limits")
    g.add_argument("--draft_policy", choices=bc.DRAFT_POLICIES, **kw("draft_policy"),
                   help="torch backend: how our runtime picks the block per step. fixed = always the full block; "
                   "adaptive = measure step costs when the engine loads, then per step the block with the most "
                   "expected tokens per second, down to 1 (AR). auto = adaptive on CPU (a full block costs 3.3x an AR "
                   "step there, smollm2-135m, so fixed runs DFlash at ~0.5x AR), fixed on GPUs: in the H100 SmolLM2 "
                   "sweep fixed beat adaptive at concurrency 2-16 (equal median inter-token gaps, up to 2x the p99: "
                   "adaptive switches between up to five blocks, each shape a CUDA graph captured on first use "
                   "mid-serving) and its worst level vs AR was 0.77x against adaptive's 0.52x")
    g.add_argument("--batch_invariant", action="store_true", **kw("batch_invariant"),
                   help="torch backend: batch-invariant numerics (runtime.batch_invariant): each row computed in an "
                   "order that depends on that row alone, so greedy DFlash == AR token for token in bf16 and a "
                   "request's tokens do not depend on its batch; costs 1.01-1.05x at batch 1 and 1.38x at batch 64 "
                   "on an H200 (Qwen3-8B shapes)")
    g.add_argument("--mxfp4_moe", choices=bc.MXFP4_MOE, **kw("mxfp4_moe"),
                   help="torch backend, gpt-oss: how the MXFP4 experts run on the GPU. auto = triton = our fused "
                   "kernels; triton_kernels = ours for one-token steps, vLLM's Triton MoE kernels (the triton_kernels "
                   "package, sm90+, importable on the serving host) for steps of 2+ tokens, from a second copy of the "
                   "experts (twice their memory; ep_size 1). gpt-oss-120b on an H200, batch 1, block 10: DFlash step "
                   "10.0 ms, AR 3.3 ms (the accepted tokens a step needs to beat AR: 3.0; with our kernels alone, at an "
                   "earlier commit, 15.5 ms and 4.2) (benchmarks/results/gpt_oss_120b_step_triton_kernels_h200.json)")
    g.add_argument("--dtype", choices=bc.DTYPES, **kw("dtype"), help="auto = bf16 on GPU, fp32 on CPU")
    g.add_argument("--max_batch_size", type=int, **kw("max_batch_size"), help="concurrent requests")
    g.add_argument("--max_seq_len", type=int, **kw("max_seq_len"), help="prompt + output tokens per request")
    g.add_argument("--max_num_tokens", type=int, **kw("max_num_tokens"), help="tokens per engine step (TensorRT-LLM)")
    g.add_argument("--max_draft_len", type=int, **kw("max_draft_len"),
                   help="drafted tokens per step; default: drafter block_size - 1")
    g.add_argument("--free_gpu_memory_fraction", type=float, **kw("free_gpu_memory_fraction"),
                   help="KV-cache share of free GPU memory (TensorRT-LLM)")
    g = p.add_argument_group("TensorRT-LLM kernels")
    g.add_argument("--attention_backend", choices=("VANILLA", "FA4", "TRTLLM"), **kw("attention_backend"),
                   help="drafter attention; default by GPU (Hopper FA4, Blackwell TRTLLM); VANILLA needs flash-attn")
    g.add_argument("--moe_backend", **kw("moe_backend"), help="MoE targets; default by GPU (Hopper TRITON, "
                   "Blackwell TRTLLM)")
    g.add_argument("--draft_len_schedule", **kw("draft_len_schedule"),
                   help="draft length by load, batch:draft pairs read as TensorRT-LLM reads them (the largest draft up "
                   "to each batch size): 1:7,16:4,64:2 = batch 1 drafts 7, 2-16 draft 4, 17-64 draft 2, above 64 none; "
                   "must start at 1:<max_draft_len>; TensorRT-LLM >= 1.3.0rc27. Default: derived from our measured "
                   "step costs where we have them for this GPU and target (the summary says which); none = no schedule")
    g.add_argument("--draft_acceptance_rate", type=float, **kw("draft_acceptance_rate"),
                   help="per-position draft acceptance the derived schedule assumes (0.7 = 3.3 tokens per step at "
                   "block 16, 2.9 at block 8)")
    g.add_argument("--max_concurrency", type=int, **kw("max_concurrency"),
                   help="turn speculation off above this many concurrent requests (not with --draft_len_schedule)")
    g.add_argument("--use_rejection_sampling", action="store_true", **kw("use_rejection_sampling"),
                   help="TensorRT-LLM's rejection sampler for sampled requests (prototype, needs FlashInfer)")
    g.add_argument("--enable_block_reuse", action="store_true", **kw("enable_block_reuse"),
                   help="prefix-cache block reuse; DFlash recomputes --context_recompute_tail prompt tokens on a hit "
                   "(TensorRT-LLM >= 1.4.0rc1)")
    g.add_argument("--context_recompute_tail", type=int, **kw("context_recompute_tail"),
                   help=f"prompt tokens recomputed on a cache hit (default {bc.DEFAULT_RECOMPUTE_TAIL} with reuse)")
    g = p.add_argument_group("output")
    g.add_argument("--out", "--output_dir", **kw("out"), help="deployment directory")
    g.add_argument("--presharded", action="store_true", **kw("presharded"),
                   help="torch backend: write ranks/rank{r}.safetensors")
    g.add_argument("--copy_target", action="store_true", **kw("copy_target"), help="copy the target's files; by default they are hard links (no extra disk, still self-contained) or, across filesystems, symbolic links into the cache (the directory then does not move)")
    g.add_argument("--force", action="store_true", default=False if show_defaults else argparse.SUPPRESS,
                   help="rebuild even if --out is up to date or was built from other inputs")
    g.add_argument("--dry_run", "--dry-run", action="store_true", default=False if show_defaults else argparse.SUPPRESS,
                   help="print the plan and llm_api_options.yaml; no download, nothing written")
    g = p.add_argument_group("quantization (ModelOpt PTQ of the target; pip install 'trtllm-dflash[modelopt]')")
    g.add_argument("--quant", choices=bc.QUANTS, **kw("quant"),
                   help="fp8 (Hopper and newer) or nvfp4 (Blackwell) into <out>/target; none = keep its weights")
    g.add_argument("--calib_data", **kw("calib_data"), help="calibration prompts: sharegpt, humaneval, mtbench "
                   "(packaged sets, chat-templated), random (token ids, plumbing tests only) or a .jsonl file of "
                   "{\"messages\": [...]} or {\"text\": ...} lines")
    g.add_argument("--calib_size", type=int, **kw("calib_size"), help="calibration prompts (each cut to 512 tokens)")
    return p


def config_from_args(argv: list[str], notes: list[str] | None = None) -> tuple[bc.BuildConfig, bool, bool]:
    """(BuildConfig, dry_run, force): defaults < preset < flags typed on the command line.

    The preset is --config's, or else the one made for the typed --target, --gpu and --tp (build_configs/
    <target>_<gpu>_tp<N>.yaml), so the README's one-line build gets NVIDIA's batch, sequence and EP settings rather
    than the generic defaults. It is skipped with --no_preset, or when --backend names another backend than the
    preset's (its kernels and schedule are that backend's). What was chosen, and why, is appended to ``notes``."""
    ns = build_parser().parse_args(argv)
    typed = vars(build_parser(show_defaults=False).parse_args(argv))
    notes = [] if notes is None else notes
    preset = {}
    if ns.config:
        preset = bc.load_preset(ns.config)
    elif "gpu" in typed and not ns.no_preset:
        preset = _matching_preset(typed, notes)
    overrides = {k: v for k, v in typed.items() if k in bc.FIELD_NAMES}
    return bc.make(preset, overrides), ns.dry_run, ns.force


def _matching_preset(typed: dict, notes: list[str]) -> dict:
    target = _short_name(typed.get("target") or "")
    if target not in resolve.KNOWN_MODELS:      # presets exist for known models only (a folder never has one)
        return {}
    tp_size = typed.get("tp_size", 1)
    path = bc.preset_path(target, typed["gpu"], tp_size)
    if path is None:
        near = [p.stem for p in bc.presets_for(target)]
        if near:
            notes.append(f"preset   none for {target} on {typed['gpu']} at tp {tp_size} (defaults used); presets for "
                         f"{target}: {', '.join(near)} (--config build_configs/<name>.yaml starts from one)")
        return {}
    preset = bc.load_preset(path)
    shown = _shown(path)
    if typed.get("backend", preset.get("backend", "torch")) != preset.get("backend", "torch"):
        notes.append(f"preset   {shown} not used: it is for --backend {preset.get('backend', 'torch')} "
                     f"(defaults used)")
        return {}
    notes.append(f"preset   {shown} (matches --target, --gpu and --tp; flags override it; --no_preset skips it)")
    return preset


def _short_name(target: str) -> str:
    """A known model's short name for its hub id too (presets are named by short name)."""
    by_hub_id = {known.target.lower(): name for name, known in resolve.KNOWN_MODELS.items()}
    return by_hub_id.get(target.lower(), target)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def checkpoint_sha256(record: dict, role: str) -> str:
    """sha256 of the deployment's target/ or drafter/ folder from the manifest's file list, equal to
    provenance.checkpoint_digest(<dir>/<role>) (which a benchmark run on that folder records)."""
    from .provenance import tree_digest
    prefix = record.get(role, {}).get("path", role).rstrip("/") + "/"
    return tree_digest({rel[len(prefix):]: h for rel, h in record["files"].items() if rel.startswith(prefix)})


def inspect(directory: str | Path, *, verify: bool = True, log=print) -> dict:
    directory = Path(directory).absolute()
    record = Deployment.open(directory).manifest
    log(manifest.summary(record))
    if verify:
        problems = manifest.verify(directory, record)
        if problems:
            dangling = "which does not exist here" in problems[0]
            raise DFlashError(str(directory), f"{len(problems)} file(s) do not match the manifest "
                              f"(first: {problems[0]})",
                              "its target was linked into a cache on another filesystem; rebuild it with "
                              "dflash-build --copy_target to move it" if dangling
                              else "rebuild it with dflash-build --force")
        log(f"verified sha256 of {len(record['files'])} files: ok")
    for role in ("target", "drafter"):   # the digest provenance.record writes into results files for this folder
        log(f"{role} sha256 {checkpoint_sha256(record, role)}  ({role}/, as provenance.checkpoint_digest)")
    for line in commands(directory, record):
        log(f"  {line}")
    return record


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inspect"]:
        p = argparse.ArgumentParser(prog="dflash-build inspect", formatter_class=_Formatter,
                                    description="Print a deployment directory's summary and verify its sha256s.")
        p.add_argument("directory")
        p.add_argument("--no_verify", action="store_true", help="skip hashing (summary only)")
        args = p.parse_args(argv[1:])
        inspect(args.directory, verify=not args.no_verify)
        return 0
    notes: list[str] = []
    cfg, dry_run, force = config_from_args(argv, notes)
    for line in notes:
        print(line)
    if dry_run:
        plan = make_plan(cfg, dry_run=True)
        print(describe(plan))
        if plan.options is not None:
            print(f"\n--- {trtllm.OPTIONS_FILE} ---")
            print(trtllm.dump_options(plan.options, quant=cfg.quant), end="")
        print("\ndry run: nothing downloaded or written")
        return 0
    plan = make_plan(cfg, dry_run=False)
    print(describe(plan))
    out = build(cfg, force=force, plan=plan)
    record = Deployment.open(out).manifest
    print("run it:")
    for line in commands(out, record):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    from .cli import build_main

    sys.exit(build_main(sys.argv[1:]))
