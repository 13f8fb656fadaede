# SPDX-License-Identifier: Apache-2.0
"""The file record of a deployment directory's manifest.json: the sha256 of every file, checking it, and
the summary ``dflash-build inspect`` prints. Reading and writing the manifest itself is ``Deployment``'s
(trtllm_dflash/deployment.py).

A directory is complete exactly when its manifest.json exists: the build writes the manifest last, inside a
temporary directory that is then renamed into place, so a killed build never leaves a complete-looking one.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..deployment import MANIFEST

_CHUNK = 8 << 20                 # bytes per read
_PROGRESS_FROM = 256 << 20       # files at least this large get a progress bar


def sha256_file(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    bar = None
    if size >= _PROGRESS_FROM:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}", leave=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return digest.hexdigest()


def list_files(root: Path) -> list[str]:
    """Every file under ``root`` (following the links into target/), as sorted relative posix paths."""
    out = []
    for dirpath, _dirs, files in os.walk(root, followlinks=True):
        for name in files:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def hash_tree(root: Path) -> dict[str, str]:
    return {rel: sha256_file(root / rel) for rel in list_files(root)}


def verify(directory: Path, manifest: dict, *, full: bool = True) -> list[str]:
    """Problems found (empty = intact). ``full=False`` checks presence and sizes only (fast reuse check)."""
    directory = Path(directory)
    problems = []
    recorded = manifest.get("files", {})
    present = set(list_files(directory))
    for rel, digest in sorted(recorded.items()):
        path = directory / rel
        if path.is_symlink() and not path.exists():
            # A link into a cache that is not on this machine (the directory was moved or copied).
            problems.append(f"{rel}: links to {os.readlink(path)}, which does not exist here")
        elif rel not in present:
            problems.append(f"{rel}: missing")
        elif not full:
            if manifest.get("sizes", {}).get(rel) not in (None, path.stat().st_size):
                problems.append(f"{rel}: size changed")
        elif sha256_file(path) != digest:
            problems.append(f"{rel}: sha256 mismatch")
    problems += [f"{rel}: not in the manifest" for rel in sorted(present - set(recorded))
                 if not _bytecode_of(rel, recorded)]
    return problems


def _bytecode_of(rel: str, recorded: dict) -> bool:
    """``<dir>/__pycache__/<name>.<tag>.pyc`` of a recorded ``<dir>/<name>.py``: what a Python that imports the
    Triton model from the deployment itself (plain ``tritonserver --model-repository <dir>/triton``; its stub
    ignores PYTHONDONTWRITEBYTECODE) leaves beside it. Derived from a verified file and checked against it by
    Python on every import, so it changes nothing the deployment runs."""
    path = Path(rel)
    if path.parent.name != "__pycache__" or path.suffix != ".pyc":
        return False
    source = path.parent.parent / (path.name.split(".", 1)[0] + ".py")
    return source.as_posix() in recorded


def summary(manifest: dict) -> str:
    """A short human-readable description of a deployment."""
    rt, tgt, dft = manifest["runtime"], manifest["target"], manifest["drafter"]
    total = sum(manifest.get("sizes", {}).values())
    lines = [
        f"backend {manifest['backend']}  gpu {manifest['gpu']}  tp {manifest['tp_size']}  ep {manifest['ep_size']}",
        f"target  {tgt['source']} @ {tgt.get('revision') or '-'}  ({tgt['architecture']})",
        f"drafter {dft['source']} @ {dft.get('revision') or '-'}  (format {dft['format']}"
        + (", UNTRAINED: acceptance ~1, for plumbing demos only)" if dft.get("untrained") else ")"),
        f"runtime max_batch_size {rt['max_batch_size']}  max_seq_len {rt['max_seq_len']}  "
        f"block_size {rt['block_size']}  dtype {rt['dtype']}"
        + (f"  draft_policy {rt['draft_policy']}" if rt.get("draft_policy") else ""),
        f"files   {len(manifest['files'])} ({total / 2**20:.1f} MiB)  built {manifest.get('created', '-')}",
    ]
    trt = manifest.get("trtllm") or {}
    if trt.get("draft_len_schedule_from"):
        from ..trtllm import schedule_line

        lines.insert(-1, "trtllm  " + schedule_line(trt.get("draft_len_schedule"), trt["draft_len_schedule_from"]))
    quant = manifest.get("quant")
    if quant:   # written by quantize.QuantRecord
        lines.insert(2, f"quant   {quant['quant_algo']} (ModelOpt {quant['modelopt']}; KV cache "
                        f"{quant.get('kv_cache_quant_algo') or 'unquantized'}; calibrated on {quant['calib_data']} "
                        f"x {quant['calib_size']} prompts in {quant['calib_s']} s; not quantized: "
                        f"{', '.join(quant['exclude_modules'])})")
    failed = {k: v for k, v in manifest.get("validation", {}).items() if v != "ok"}
    lines += [f"note    {k}: {v}" for k, v in failed.items()]
    return "\n".join(lines)
