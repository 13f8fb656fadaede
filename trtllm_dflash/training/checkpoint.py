# SPDX-License-Identifier: Apache-2.0
"""Training checkpoints without pickle: ``<out>/checkpoint/{state.safetensors, state.json}``.

state.safetensors holds the draft weights (``model.*``), AdamW's moments (``opt.<param index>.<name>``) and the
RNG states (``rng.cpu``, ``rng.cuda``; ModelOpt draws anchors from torch's generator). state.json holds the step,
the wall time spent so far and the optimizer's param groups. A checkpoint is written beside the old one and
swapped in by renames, so a kill leaves either the old or the new one, never half of each.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import DFlashError

DIR = "checkpoint"


def save(out_dir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, step: int, elapsed_s: float) -> Path:
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
    save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp / "state.safetensors"))
    meta = {"step": step, "elapsed_s": elapsed_s, "param_groups": sd["param_groups"], "opt_scalars": extra}
    (tmp / "state.json").write_text(json.dumps(meta, indent=1) + "\n")
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{DIR}.old-", dir=out_dir))
        os.replace(final, trash / DIR)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def exists(out_dir: Path) -> bool:
    return (out_dir / DIR / "state.json").is_file()


def load(out_dir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer | None) -> tuple[int, float]:
    """Restore weights, and optimizer and RNG unless ``opt`` is None, in place; returns (step, elapsed_s)."""
    folder = out_dir / DIR
    meta = json.loads((folder / "state.json").read_text())
    tensors = load_file(str(folder / "state.safetensors"))
    device = next(module.parameters()).device
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise DFlashError(str(folder), f"does not fit this draft ({(missing or unexpected)[0]})",
                          "resume with the settings the run started with, or start a new --out")
    if opt is None:
        return int(meta["step"]), float(meta["elapsed_s"])
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
    return int(meta["step"]), float(meta["elapsed_s"])
