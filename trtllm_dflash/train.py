# SPDX-License-Identifier: Apache-2.0
"""dflash-train: a Hugging Face target -> a trained DFlash drafter that dflash-build and TensorRT-LLM load.

Consumes: --target (HF folder, or smollm2-135m) and --data (sharegpt, a JSONL of prompts, or a sharded corpus
folder from python -m trtllm_dflash.training.corpus).
Produces: <out>/{data/, checkpoint/, drafter/, loss.csv, loss.png, report.json}; drafter/ is the canonical z-lab
layout. Stages: regenerate (the target answers the prompts with our runtime), train (NVIDIA ModelOpt, the paper's
recipe or ModelOpt's), export (ModelOpt export, normalised, then checked against our runtime). Each stage resumes,
also across time-limited calls (--regen_time_budget_s, --stop_after_s).

Data parallel: started under ``torchrun --nproc_per_node N`` or ``mpirun -n N``, every rank takes one device
(its LOCAL_RANK's GPU); regeneration gives each rank its own corpus shards, training gives each rank a slice of
every global batch (--batch_size is the global batch) and sums the gradients; rank 0 alone writes the run's files
and exports (``training/parallel.py``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import fields
from pathlib import Path

from .bench.helpformat import HelpFormatter
from .errors import DFlashError, exit_code
from .checkpoints.text import load_tokenizer
from .training.settings import CONFIG_FILE, PRESETS, STAGES, TrainConfig
from .training.target import resolve_target

EPILOG = r"""examples:
  dflash-train --target smollm2-135m --data sharegpt --out runs/smollm2 --num_layers 3 --num_prompts 5000
  dflash-train --target ./my-llama --data prompts.jsonl --out runs/llama --block_size 8 --epochs 3
  dflash-train --target smollm2-135m --data sharegpt --out runs/smollm2 --resume        # continue after a stop
  dflash-train ... --stages regenerate                      # only answer the prompts (GPU), train later
  python -m trtllm_dflash.training.corpus --out corpus      # 60k+ prompts in shards (ShareGPT turns + code)
  dflash-train --target smollm2-135m --data corpus --out runs/big --resume --stages regenerate \
      --regen_time_budget_s 480                             # answers whole shards, then stops; call again
  dflash-train ... --stages train --preset modelopt --max_steps 40000 --stop_after_s 500 --resume
  torchrun --nproc_per_node 4 -m trtllm_dflash.train ... --resume   # 4 GPUs: shards and batch slices per GPU
  dflash-build --target smollm2-135m --drafter runs/smollm2/drafter --out engines/smollm2

--data JSONL rows: {"prompt": "..."} | {"messages": [{"role": "user", "content": "..."}]} | {"prompt_ids": [..]}
needs: pip install 'trtllm-dflash[modelopt]' (nvidia-modelopt==0.47.0, transformers<5.15)
"""
# Flags grouped as in --help; each is a TrainConfig field of the same name.
_GROUPS = {
    "regenerate (stage 1)": ("num_prompts", "max_prompt_len", "max_new_tokens", "regen_temperature",
                             "regen_samples", "regen_batch_size", "regen_time_budget_s", "regen_total_s", "exclude_eval"),
    "drafter": ("block_size", "num_layers", "target_layer_ids", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "mask_token_id", "init_drafter"),
    "train (stage 2)": ("loss", "kd_impl", "loss_decay_gamma", "num_anchors", "max_seq_len", "batch_size",
                        "probe_batch_sizes",
                        "probe_s", "lr", "weight_decay",
                        "warmup_ratio", "warmup_steps", "lr_schedule", "grad_clip", "epochs", "max_steps",
                        "train_time_budget_s", "stop_after_s", "save_every", "log_every"),
    "export (stage 3)": ("export_dtype", "verify_prompts", "verify_max_new_tokens"),
}
_HELP = {
    "num_prompts": "prompts to answer (after dropping eval overlaps and over-long ones)",
    "max_prompt_len": "prompts longer than this (tokens, chat template applied) are skipped",
    "max_new_tokens": "answer length cap (tokens)",
    "regen_temperature": "0 = greedy answers (tau_greedy is measured on those); a corpus row's own "
                         "temperature wins",
    "regen_samples": "answers per prompt: the first as the prompt asks (greedy, or its corpus row's temperature), "
                     "each further one sampled at T=1 with a seed of its own, so the drafter sees more distinct "
                     "answers without more prompts (training repeats data less; rows count once per answer)",
    "regen_batch_size": "concurrent requests in the runtime",
    "regen_time_budget_s": "stop admitting prompts after this many seconds (0 = no limit); with a corpus folder, "
                           "start no shard that would end past it (the rest waits for a --resume call)",
    "regen_total_s": "with a corpus folder: once the answered shards took this long (summed over calls; under N "
                     "ranks each shard counts its time / N: wall seconds), stop and "
                     "train on them (0 = answer every shard)",
    "probe_batch_sizes": "before training starts, time a few steps at each of these batch sizes (per rank) and "
                         "train at the one with the most tokens/s (x the ranks = the global batch); --batch_size x "
                         "--max_steps (or --train_time_budget_s) is kept as the budget, turned into steps at the chosen size (batch_probe.json says what it measured)",
    "probe_s": "seconds the batch-size probe spends, over all its sizes",
    "exclude_eval": "drop prompts that also occur in HumanEval / MT-Bench",
    "block_size": "tokens per block: the anchor + block_size - 1 drafts",
    "num_layers": "draft layers; ModelOpt 0.47 taps one target layer per draft layer",
    "target_layer_ids": "0-based target layers to tap; unset = the z-lab rule (2nd .. 3rd-to-last)",
    "intermediate_size": "draft MLP width; unset = the target's",
    "num_attention_heads": "unset = the target's",
    "num_key_value_heads": "unset = the target's",
    "head_dim": "unset = the target's",
    "mask_token_id": "block filler id; unset = chosen from the tokenizer (report.json says which and why)",
    "init_drafter": "warm start: a drafter folder (z-lab layout) or smollm2-135m-dflash; its block size, layers, "
                    "tapped target layers, mask id and sizes must equal this run's (a longer schedule on the same "
                    "drafter continues its training instead of starting from random weights)",
    "loss": "kd = distil the target's logits (ModelOpt), ce = cross-entropy on the regenerated tokens",
    "kd_impl": "how the kd loss is computed: fused = in row chunks, never the whole batch's [rows, vocab] logits "
               "(same loss and gradients); modelopt = ModelOpt's own code",
    "loss_decay_gamma": "weight exp(-(k-1)/gamma) of block position k; unset = 7 for B16, 5 B10, 4 B8",
    "num_anchors": "random anchors (blocks) per sequence",
    "max_seq_len": "training sequences are cut to this many tokens",
    "batch_size": "sequences per optimizer step, over all data-parallel ranks (a multiple of their number)",
    "lr": "AdamW peak learning rate",
    "weight_decay": "AdamW weight decay",
    "warmup_ratio": "share of the schedule spent on linear warmup",
    "warmup_steps": "warmup steps instead of --warmup_ratio (ModelOpt's recipe: 100)",
    "lr_schedule": "decay after warmup: cosine (the paper's) or linear (ModelOpt's)",
    "stop_after_s": "checkpoint and stop this call after this many seconds; --resume continues the same "
                    "schedule (for time-limited calls; use with --max_steps)",
    "grad_clip": "max gradient norm",
    "epochs": "passes over the data (unless --max_steps)",
    "max_steps": "optimizer steps; unset = --epochs over the data",
    "train_time_budget_s": "fit the whole warmup + cosine schedule into this many seconds (0 = off)",
    "save_every": "checkpoint every N steps (and at the end)",
    "log_every": "loss.csv row every N steps",
    "export_dtype": "dtype of the shipped drafter weights",
    "verify_prompts": "DFlash greedy == AR greedy is checked on this many training prompts",
    "verify_max_new_tokens": "tokens generated per prompt in that check",
}
_CHOICES = {"loss": ("kd", "ce"), "kd_impl": ("fused", "modelopt"), "export_dtype": ("bfloat16", "float16", "float32"),
            "lr_schedule": ("cosine", "linear")}


def build_parser() -> argparse.ArgumentParser:
    d = {f.name: f for f in fields(TrainConfig)}
    p = argparse.ArgumentParser(prog="dflash-train", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=_Formatter)
    p.add_argument("--target", required=True, help="HF target folder, or smollm2-135m (the packaged SmolLM2)")
    p.add_argument("--data", required=True, help="sharegpt, a .jsonl file of prompts, or a corpus folder")
    p.add_argument("--preset", default=d["preset"].default, choices=tuple(PRESETS),
                   help="recipe defaults: paper (the DFlash paper's) or modelopt (ModelOpt's dflash.yaml: block 8, "
                        "512 anchors, gamma 4, 5 layers, linear LR, 100 warmup steps, 10 epochs); flags win")
    p.add_argument("--out", "--output_dir", required=True, help="run directory")
    p.add_argument("--stages", default=",".join(STAGES), help="comma list of stages to run")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (same settings)")
    p.add_argument("--seed", type=int, default=d["seed"].default, help="prompt order, draft init, anchors")
    p.add_argument("--device", default=d["device"].default, help="auto, cpu, cuda, cuda:1")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    for title, names in _GROUPS.items():
        g = p.add_argument_group(title)
        for name in names:
            f = d[name]
            kind = str(f.type)
            if kind == "bool":
                g.add_argument(f"--no_{name}", dest=name, action="store_false", help=f"do not {_HELP[name]}")
            elif name in ("target_layer_ids", "probe_batch_sizes"):
                g.add_argument(f"--{name}", type=int, nargs="+", default=None, help=_HELP[name])
            elif name == "warmup_steps":
                g.add_argument(f"--{name}", type=int, default=None, help=_HELP[name])
            else:
                conv = float if "float" in kind else int if "int" in kind else str
                g.add_argument(f"--{name}", type=conv, default=f.default, help=_HELP[name], choices=_CHOICES.get(name))
    return p


# Examples kept one per line; "(default: X)" only where there is a value (not for flags or None).
_Formatter = HelpFormatter


def config_from_args(argv: list[str] | None) -> TrainConfig:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    # The preset's values become the parser's defaults, so a flag on the command line wins over them (also when
    # spelled as an argparse abbreviation, which a scan of argv for "--name" missed).
    parser.set_defaults(**PRESETS[parser.parse_known_args(argv)[0].preset])
    ns = vars(parser.parse_args(argv))
    ns["progress"] = not ns.pop("quiet")
    ns["stages"] = tuple(s.strip() for s in ns["stages"].split(",") if s.strip())
    for name in ("target_layer_ids", "probe_batch_sizes"):
        if ns[name] is not None:
            ns[name] = tuple(ns[name])
    return TrainConfig(**ns)


def _start(cfg: TrainConfig) -> None:
    """A new run needs an empty or absent --out; --resume needs the same settings as the run it continues."""
    out = cfg.out_dir
    saved = out / CONFIG_FILE
    if saved.is_file():
        if not cfg.resume:
            raise DFlashError("--out", f"{out} holds a previous dflash-train run", "pass --resume, or a new --out")
        cfg.check_resume(saved)
    elif out.is_dir() and any(p.name != "data" for p in out.iterdir()):
        # data/ alone is allowed: regenerated data copied from another run, trained here with other settings
        raise DFlashError("--out", f"{out} is not empty and holds no dflash-train run", "pass a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save()


def run(cfg: TrainConfig, log=print) -> dict:
    """All requested stages; returns the report's sections. report.json is written even when a stage fails
    (with ``status`` saying how), so a failed GPU run still says how far it got. Under N ranks every rank calls
    this; rank 0 alone logs and writes."""
    from dataclasses import replace

    from .training import batch_probe, parallel, regenerate, report

    t0 = time.perf_counter()
    dp, device = parallel.init(cfg.device)
    if not dp.is_main:
        log, cfg = (lambda *a, **k: None), replace(cfg, progress=False)
    result = _run(cfg, log, dp, device, t0, batch_probe, regenerate, report)
    # Every rank leaves together, once rank 0 has exported and written the report. After a failure no barrier:
    # the launcher ends the other ranks (a barrier could wait on a rank stuck in a collective the failed one
    # never reaches).
    dp.close()
    return result


def _run(cfg: TrainConfig, log, dp, device, t0: float, batch_probe, regenerate, report) -> dict:
    cfg = batch_probe.applied(cfg)   # a resumed run trains at the batch size its probe chose
    dp.on_main(_start, cfg)
    target_dir = resolve_target(cfg.target)
    out, sections = cfg.out_dir, {"settings": cfg.to_json(), "target_dir": str(target_dir), "status": "running"}
    if dp.active:
        sections["ranks"] = dp.size
    is_done = lambda: dp.broadcast_object(regenerate.is_done(cfg))   # noqa: E731 - rank 0's view of the files
    try:
        if "regenerate" in cfg.stages:
            if is_done():
                log(f"regenerate: done earlier ({regenerate.data_dir(cfg) / regenerate.DONE_FILE})")
            else:
                sections["regenerate"] = regenerate.run(cfg, target_dir, log, dp)
        if not is_done() and not {"train", "export"} & set(cfg.stages):
            sections["status"] = "ok: regenerate continues in a later call (--resume)"
            return sections
        if not is_done():
            raise DFlashError("training data", f"stage regenerate has not finished in {out}",
                              "run with --stages regenerate (it resumes where it stopped)")
        sections["data"] = json.loads((regenerate.data_dir(cfg) / regenerate.DONE_FILE).read_text())["counts"]
        if "export" in cfg.stages and "train" not in cfg.stages and not (out / "checkpoint").is_dir():
            raise DFlashError("--stages", "export without a trained checkpoint in --out", "include the train stage")
        if {"train", "export"} & set(cfg.stages):
            _train_and_export(cfg, target_dir, sections, log, dp, device)
        sections["status"] = "ok"
    except BaseException as err:
        sections["status"] = f"failed: {type(err).__name__}: {err}"
        raise
    finally:
        if dp.is_main:
            sections["total_s"] = round(time.perf_counter() - t0, 1)
            sections["loss_png"] = report.plot(out, report.title(cfg.to_json()))
            log(f"report: {report.write(out, sections)}")
    return sections


def _train_and_export(cfg: TrainConfig, target_dir: Path, sections: dict, log, dp, device) -> None:
    import torch

    from .checkpoints import hf
    from .training import anchors, batch_probe, batches, checkpoint, loop, mask_token, modelopt_model, regenerate

    rows = regenerate.load_rows(cfg)
    tokenizer = load_tokenizer(target_dir)
    mask, why = mask_token.choose(tokenizer, hf.read_config(target_dir)["vocab_size"], cfg.mask_token_id)
    data, counts = batches.examples(rows, cfg.max_seq_len)
    counts["mask_token_in_data"] = sum(e.input_ids.count(mask) for e in data)
    sections["mask_token"] = {"id": mask, "why": why,
                              "token": tokenizer.convert_ids_to_tokens(mask) if tokenizer is not None else None}
    sections["data"].update(counts)
    log(f"mask_token_id {mask}: {why}; {len(data)} examples, {counts['supervised_tokens']} response tokens")
    torch.manual_seed(cfg.seed)  # the draft's initial weights
    model, mo_cfg = modelopt_model.build(cfg, target_dir, mask, device)
    anchors.install(model)   # anchors per sample: the same on any number of ranks
    dp.broadcast_params(modelopt_model.trainable(model))
    n_params = sum(p.numel() for p in model.dflash_module.parameters())
    sections["modelopt"] = {"config": mo_cfg, "draft_parameters": n_params}
    log(f"train: ModelOpt DFlash draft, {n_params / 1e6:.2f} M parameters, target layers "
        f"{mo_cfg['dflash_architecture_config']['target_layer_ids']}, on {device}"
        + (f" x {dp.size} ranks" if dp.active else ""))
    probe = dp.broadcast_object("train" in cfg.stages and bool(cfg.probe_batch_sizes)
                                and not checkpoint.exists(cfg.out_dir)
                                and not (cfg.out_dir / batch_probe.PROBE_FILE).is_file())
    if probe:
        cfg, sections["batch_probe"] = batch_probe.run(cfg, model, data, log, dp)
        if dp.is_main:
            cfg.save()   # the probe's choice: what a --resume call is checked against
        sections["settings"] = cfg.to_json()
    if "train" in cfg.stages:
        stream = batches.BatchStream(data, cfg.batch_size, cfg.block_size, cfg.seed, rank=dp.rank, ranks=dp.size)
        max_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(data) / cfg.batch_size))
        sections["train"] = loop.run(cfg, model, stream, max_steps, log, dp)
        if not dp.is_main:   # rank 0 exports alone; the others wait for it in run()'s closing barrier (an
            return           # MPI launcher ends every rank as soon as one has left)
        if sections["train"]["paused"]:
            log("export: skipped, training is not finished (continue with --resume)")
            return
    else:
        if not dp.is_main:
            return
        checkpoint.load(cfg.out_dir, model.dflash_module, None)
    if "export" not in cfg.stages:
        return
    from .training import corpus, export

    data_name = corpus.describe(cfg.data) if corpus.is_corpus(cfg.data) else cfg.data
    provenance = {"target": cfg.target, "data": data_name, "examples": len(data), "loss": cfg.loss,
                  "steps": sections.get("train", {}).get("steps")}
    if cfg.init_drafter:   # a continued drafter says what it continued from
        from .provenance import checkpoint_digest
        init = modelopt_model.init_drafter_dir(cfg.init_drafter)
        provenance["init_drafter"] = {"spec": cfg.init_drafter, "sha256": checkpoint_digest(init)["sha256"],
                                      "steps": json.loads((init / "config.json").read_text()).get(
                                          "dflash_training", {}).get("steps")}
    drafter = export.export(cfg, model, target_dir, provenance, log)
    result = sections["export"] = {"drafter_dir": str(drafter),
                                   "size_bytes": sum(f.stat().st_size for f in drafter.iterdir())}
    # Filled in as the checks pass, so a failure leaves the earlier ones on record.
    result["rope"] = export.check_rope(model, drafter, target_dir)
    result["parity"] = export.check_parity(model, drafter, cfg.export_dtype)
    del model  # the greedy check loads the target into two engines of its own
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows[: cfg.verify_prompts]]
    result["greedy"] = export.check_greedy(cfg, target_dir, drafter, prompts)
    log(f"export: checks passed (rope, parity {result['parity']['max_rel_diff']:.1e}, DFlash greedy == AR greedy "
        f"on {len(prompts)} prompts, tau {result['greedy']['tau']})")


def main(argv: list[str] | None = None) -> int:
    cfg = config_from_args(argv)
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
