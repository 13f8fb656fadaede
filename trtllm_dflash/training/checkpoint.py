# SPDX-License-Identifier: Apache-2.0
"""Training checkpoints without pickle: ``<out>/checkpoint/{state.json, state-00000.safetensors, ...}``.

The safetensors shards hold the draft weights (``model.*``), AdamW's moments (``opt.<param index>.<name>``) and the
RNG states (``rng.cpu``, ``rng.cuda``; ModelOpt draws anchors from torch's generator), packed into files of at
most ``SHARD_BYTES`` so a checkpoint travels through channels with a per-file limit (the GPU hosts return files
< 16 MB); a tensor larger than that is cut into flat pieces and joined on load. state.json holds the step, the wall
time spent, the response tokens trained on, the optimizer's param groups and each shard's sha256. A checkpoint is
written beside the old one and swapped in by renames, so a kill leaves either the old or the new one, never half
of each. Checkpoints of the one-file layout (``state.safetensors``) still load.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..checkpoints.manifest import sha256_file
from ..errors import DFlashError

DIR = "checkpoint"
SHARD_BYTES = 15_000_000


def save(out_dir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, step: int, elapsed_s: float,
         tokens: int = 0) -> Path:
    final = out_dir / DIR
    tmp = Path(tempfile.mkdtemp(prefix=f".{DIR}.tmp-", dir=out_dir))
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in module.state_dict().items() if "rotary_emb" not in k}
    sd = opt.state_dict()
    extra = {}
    for idx, state in sd["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                tensors[f"opt.{idx}.{k}"] = v.detach().contiguous()
            else:
                extra[f"{idx}.{k}"] = v
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    files, split = _write_shards(tmp, {k: v.cpu() for k, v in tensors.items()}, SHARD_BYTES)
    meta = {"step": step, "elapsed_s": elapsed_s, "tokens": tokens, "param_groups": sd["param_groups"],
            "opt_scalars": extra, "files": files, "split": split}
    (tmp / "state.json").write_text(json.dumps(meta, indent=1) + "\n")
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{DIR}.old-", dir=out_dir))
        os.replace(final, trash / DIR)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def _write_shards(folder: Path, tensors: dict[str, torch.Tensor], limit: int) -> tuple[dict, dict]:
    """Pack ``tensors`` into state-NNNNN.safetensors files of <= ``limit`` bytes of tensor data each (the
    header adds a few kB). Returns ({file: sha256}, {split key: [shape, dtype, pieces]})."""
    pieces, split = [], {}
    for k in sorted(tensors):
        v = tensors[k]
        size = v.numel() * v.element_size()
        if size <= limit:
            pieces.append((k, v, size))
            continue
        flat, per = v.reshape(-1), max(1, limit // v.element_size())
        n = math.ceil(flat.numel() / per)
        split[k] = [list(v.shape), str(v.dtype).removeprefix("torch."), n]
        pieces += [(f"{k}#{i}", flat[i * per:(i + 1) * per].clone(), min(per, flat.numel() - i * per) *
                    v.element_size()) for i in range(n)]
    groups, cur, used = [], {}, 0
    for k, v, size in pieces:
        if cur and used + size > limit:
            groups.append(cur)
            cur, used = {}, 0
        cur[k], used = v, used + size
    groups.append(cur)
    files = {}
    for i, group in enumerate(groups):
        name = f"state-{i:05d}.safetensors"
        save_file(group, str(folder / name))
        files[name] = sha256_file(folder / name)
    return files, split


def _read_shards(folder: Path, meta: dict) -> dict[str, torch.Tensor]:
    if "files" not in meta:  # the one-file layout
        return load_file(str(folder / "state.safetensors"))
    tensors = {}
    for name, digest in meta["files"].items():
        path = folder / name
        if not path.is_file() or sha256_file(path) != digest:
            raise DFlashError(str(path), "is missing or does not match its sha256 in state.json",
                              "copy every file of the checkpoint folder again")
        tensors.update(load_file(str(path)))
    for k, (shape, _dtype, n) in meta["split"].items():
        tensors[k] = torch.cat([tensors.pop(f"{k}#{i}") for i in range(n)]).reshape(shape)
    return tensors


def exists(out_dir: Path) -> bool:
    return (out_dir / DIR / "state.json").is_file()


def load(out_dir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer | None) -> tuple[int, float, int]:
    """Restore weights, and optimizer and RNG unless ``opt`` is None, in place; returns (step, elapsed_s,
    tokens)."""
    folder = out_dir / DIR
    meta = json.loads((folder / "state.json").read_text())
    tensors = _read_shards(folder, meta)
    done = int(meta["step"]), float(meta["elapsed_s"]), int(meta.get("tokens", 0))
    device = next(module.parameters()).device
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise DFlashError(str(folder), f"does not fit this draft ({(missing or unexpected)[0]})",
                          "resume with the settings the run started with, or start a new --out")
    if opt is None:
        return done
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            idx, name = k[len("opt."):].split(".", 1)
            state.setdefault(int(idx), {})[name] = v if name == "step" else v.to(device)
    for k, v in meta["opt_scalars"].items():
        idx, name = k.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return done
