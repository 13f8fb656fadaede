# SPDX-License-Identifier: Apache-2.0
"""Reading and writing Hugging Face checkpoint folders: config.json and the weights, safetensors (sharded or not).
Their tokenizer and stop ids: checkpoints/text.py.

Pickle checkpoints (``*.bin``, ``*.pt``) can run code when loaded, so they are refused unless the caller
opts in; then they load with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import DFlashError
from .manifest import sha256_file

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def read_config(path: str | Path) -> dict:
    """The folder's config.json as a dict."""
    path = Path(path)
    cfg = path / "config.json"
    if not path.is_dir():
        raise DFlashError(str(path), "is not a directory", "pass a Hugging Face checkpoint folder")
    if not cfg.is_file():
        raise DFlashError(str(cfg), "missing", "pass a Hugging Face checkpoint folder (config.json + *.safetensors)")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as err:
        raise DFlashError(str(cfg), f"is not valid JSON ({err})", "restore the file from its source") from None


def weight_files(path: str | Path, *, allow_pickle: bool = False) -> list[Path]:
    """The weight files of a checkpoint folder, safetensors first; pickle only when allowed."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise DFlashError(str(index), f"names missing shard files {missing[:3]}", "download the complete checkpoint")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles and not allow_pickle:
        raise DFlashError(
            str(path), f"has only pickle weights ({pickles[0].name}); pickle can run code when loaded",
            "convert to safetensors, or opt in with --allow_pickle (loads with torch.load(weights_only=True))")
    if pickles:
        return pickles
    raise DFlashError(str(path), "has no *.safetensors weights", "pass a folder that holds the checkpoint's weights")


def load_state_dict(
    path: str | Path,
    *,
    allow_pickle: bool = False,
    select: Callable[[str], bool] | None = None,
    slicer: Callable[[str, object], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Load tensors from a checkpoint folder.

    ``select(name)`` filters names; ``slicer(name, t)`` keeps part of each tensor: from a safetensors lazy slice
    (``t[a:b]``, ``t[:, a:b]``) it reads only that part, so a tensor-parallel rank reads only its shard; a pickle
    file's tensors are loaded whole, then cut.
    """
    out: dict[str, torch.Tensor] = {}
    for f in weight_files(path, allow_pickle=allow_pickle):
        if f.suffix != ".safetensors":
            sd = torch.load(f, map_location="cpu", weights_only=True)
            for name, t in sd.items():
                if select is None or select(name):
                    out[name] = slicer(name, t) if slicer else t
            continue
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                if select is not None and not select(name):
                    continue
                out[name] = slicer(name, fh.get_slice(name)) if slicer else fh.get_tensor(name)
    return out


def save_state_dict(sd: dict[str, torch.Tensor], path: str | Path, filename: str = "model.safetensors") -> Path:
    """Save tensors as one safetensors file (contiguous, no shared storage)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    out = path / filename
    save_file({k: v.detach().contiguous().clone() for k, v in sd.items()}, str(out))
    return out


def weight_digests(path: str | Path) -> dict[str, str]:
    """{file name: sha256} of a checkpoint folder's weight files: how a tool that derives a checkpoint from others
    records exactly which files it read."""
    return {f.name: sha256_file(f) for f in weight_files(path)}


def check_new_folder(out: Path, field: str = "--out") -> None:
    """Refuse an output folder that exists and is not empty: tools that write a checkpoint never overwrite."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DFlashError(field, f"{out} exists and is not empty", "pass a new folder (nothing is overwritten)")


def write_new_folder(out: Path, config: dict, sd: dict[str, torch.Tensor]) -> Path:
    """config.json + one model.safetensors into the new folder ``out`` (the caller has checked it with
    check_new_folder before doing the work), which appears whole or not at all (written beside it under a temporary
    name, then renamed). Returns the written safetensors file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_state_dict(sd, tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "model.safetensors"
