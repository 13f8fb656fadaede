# SPDX-License-Identifier: Apache-2.0
"""A dflash-train run packed into few files of bounded size and back, sha256-checked: for moving a run between a GPU
host and the machine that keeps it when the copy between them limits the number or the size of files (defaults:
up to 7 files a part, each < 15 MB).

  regen   the regenerated shards finished since ``--before`` (a copy of data/manifest.json taken when the run
          started), or with no --before all of them in parts of ``--max_files`` tar files, each <= ``MAX_BYTES``;
          plus the run's data/manifest.json and train_config.json
  ckpt    part ``--part`` of the checkpoint: state.json plus up to ``--max_files`` of its shard files (a
          checkpoint of N shard files travels in ceil(N / max_files) parts)
  drafter the exported drafter's weights as safetensors shards of <= MAX_BYTES each + index
  unpack  a folder of such files -> a run directory, each file checked against the sha256 its manifest or
          state.json records; used on both sides (files coming back, and files brought to a fresh host)
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tarfile
from pathlib import Path

from ..checkpoints.manifest import sha256_file
from ..errors import DFlashError, exit_code
from .corpus import write_json
from .regenerate import MANIFEST, SHARD_DIR
from .settings import CONFIG_FILE

MAX_BYTES, MAX_FILES = 15_000_000, 7


def pack_regen(run: Path, before: Path | None, out: Path, part: int = 0,
               max_files: int = MAX_FILES) -> tuple[list[Path], int]:
    """(files written, number of parts)."""
    data = run / "data"
    now = json.loads((data / MANIFEST).read_text())["shards"]
    old = json.loads(before.read_text())["shards"] if before is not None else {}
    new = sorted(e["file"] for k, e in now.items() if k not in old)
    out.mkdir(parents=True, exist_ok=True)
    groups, cur, used = [], [], 0
    for rel in new:
        size = (data / rel).stat().st_size
        if cur and used + size > MAX_BYTES:
            groups.append(cur)
            cur, used = [], 0
        cur.append(rel)
        used += size
    if cur:
        groups.append(cur)
    if before is not None and len(groups) > max_files:
        raise DFlashError("regen shards", f"{len(new)} new shards need {len(groups)} files (> {max_files})",
                          "lower --regen_time_budget_s so one run makes fewer shards")
    parts = max(1, math.ceil(len(groups) / max_files))
    if not 0 <= part < parts:
        raise DFlashError("--part", f"{part} is out of range: the shards come in {parts} parts", f"use 0..{parts - 1}")
    written = []
    for i, group in enumerate(groups[part * max_files:(part + 1) * max_files]):
        path = out / f"regen-part{i}.tar"
        with tarfile.open(path, "w") as tar:
            for rel in group:
                tar.add(data / rel, arcname=rel)
        written.append(path)
    shutil.copy(data / MANIFEST, out / MANIFEST)
    return written + [out / MANIFEST] + _config(run, out), parts


def _config(run: Path, out: Path) -> list[Path]:
    src = run / CONFIG_FILE
    return [Path(shutil.copy(src, out / src.name))] if src.is_file() else []


def pack_ckpt(run: Path, part: int, out: Path, max_files: int = MAX_FILES - 1) -> tuple[list[Path], int]:
    folder = run / "checkpoint"
    meta = json.loads((folder / "state.json").read_text())
    files = sorted(meta.get("files") or [])
    parts = max(1, math.ceil(len(files) / max_files))
    if not 0 <= part < parts:
        raise DFlashError("--part", f"{part} is out of range: this checkpoint comes in {parts} parts",
                          f"use 0..{parts - 1}")
    out.mkdir(parents=True, exist_ok=True)
    written = [Path(shutil.copy(folder / "state.json", out / "state.json"))]
    written += [Path(shutil.copy(folder / f, out / f)) for f in files[part * max_files:(part + 1) * max_files]]
    return written + _config(run, out), parts


def pack_drafter(run: Path, out: Path, max_bytes: int = MAX_BYTES) -> list[Path]:
    """drafter/model.safetensors -> model-0000k-of-0000n.safetensors + model.safetensors.index.json (the HF
    sharded layout, which our loader and transformers read as they are): tensors in name order, a new shard where
    the next tensor would take this one past ``max_bytes`` (SmolLM2's 3-layer drafter: two, a 5-layer one: three)."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(run / "drafter" / "model.safetensors"))
    groups: list[list[str]] = [[]]
    used = 0
    for key in sorted(sd):
        size = sd[key].numel() * sd[key].element_size()
        if size > max_bytes:
            raise DFlashError("drafter/model.safetensors", f"{key} is {size:,} bytes, over the {max_bytes:,} a "
                              "shard may hold", "pass a larger max_bytes where the copy takes larger files")
        if groups[-1] and used + size > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(key)
        used += size
    index = {"metadata": {}, "weight_map": {}}
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, keys in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: sd[k] for k in keys}, str(out / name))
        index["weight_map"].update({k: name for k in keys})
        written.append(out / name)
    (out / "model.safetensors.index.json").write_text(json.dumps(index) + "\n")
    return written + [out / "model.safetensors.index.json"]


def unpack(src: Path, run: Path) -> dict:
    """Returned files in ``src`` -> ``run``; returns what arrived and what is still missing."""
    got = {"shards": 0, "checkpoint_files": 0}
    data = run / "data"
    run.mkdir(parents=True, exist_ok=True)
    if (src / CONFIG_FILE).is_file() and not (run / CONFIG_FILE).is_file():
        shutil.copy(src / CONFIG_FILE, run / CONFIG_FILE)
    if (src / MANIFEST).is_file():
        (data / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        for tar in sorted(src.glob("regen-part*.tar")):
            with tarfile.open(tar) as t:
                for m in t.getmembers():
                    if not m.isfile() or not m.name.startswith(f"{SHARD_DIR}/") or ".." in m.name:
                        raise DFlashError(str(tar), f"holds {m.name!r}, not a regenerated shard", "pack it again")
                    (data / m.name).write_bytes(t.extractfile(m).read())
                    got["shards"] += 1
        manifest = json.loads((src / MANIFEST).read_text())
        for name, e in manifest["shards"].items():
            path = data / e["file"]
            if path.is_file() and sha256_file(path) != e["sha256"]:
                raise DFlashError(str(path), "does not match its sha256 in the returned manifest", "fetch it again")
        write_json(data / MANIFEST, manifest)
        got["shards_missing"] = sorted(n for n, e in manifest["shards"].items() if not (data / e["file"]).is_file())
    if (src / "state.json").is_file():
        meta = json.loads((src / "state.json").read_text())
        ck = run / "checkpoint"
        ck.mkdir(parents=True, exist_ok=True)
        old = json.loads((ck / "state.json").read_text()) if (ck / "state.json").is_file() else None
        if old is not None and old["step"] != meta["step"]:  # a newer checkpoint: drop the older one's files
            for f in old.get("files") or []:
                (ck / f).unlink(missing_ok=True)
        for f, digest in meta["files"].items():
            if (src / f).is_file():
                if sha256_file(src / f) != digest:
                    raise DFlashError(str(src / f), "does not match its sha256 in state.json", "fetch it again")
                shutil.copy(src / f, ck / f)
                got["checkpoint_files"] += 1
        write_json(ck / "state.json", meta)
        got["checkpoint_step"] = meta["step"]
        got["checkpoint_missing"] = sorted(f for f in meta["files"] if not (ck / f).is_file())
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.bundle", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("regen", help="pack the shards regenerated since --before")
    r.add_argument("--run", required=True)
    r.add_argument("--before", help="data/manifest.json as it was when the run started (a missing file = none "
                   "done); omit it to pack every shard, in parts")
    r.add_argument("--part", type=int, default=0)
    r.add_argument("--max_files", type=int, default=MAX_FILES, help="tar files per part")
    r.add_argument("--out", required=True)
    c = sub.add_parser("ckpt", help="pack part --part of the checkpoint")
    c.add_argument("--run", required=True)
    c.add_argument("--part", type=int, default=0)
    c.add_argument("--max_files", type=int, default=MAX_FILES - 1, help="checkpoint files per part")
    c.add_argument("--out", required=True)
    d = sub.add_parser("drafter", help="the exported drafter's weights in shards of <= 15 MB + index")
    d.add_argument("--run", required=True)
    d.add_argument("--out", required=True)
    u = sub.add_parser("unpack", help="returned files -> the run directory (sha256-checked)")
    u.add_argument("src")
    u.add_argument("--run", required=True)
    a = p.parse_args(argv)
    if a.cmd == "regen":
        before = None
        if a.before:
            before = Path(a.before) if Path(a.before).is_file() else Path(a.out) / ".none.json"
            if not before.is_file():
                Path(a.out).mkdir(parents=True, exist_ok=True)
                before.write_text('{"shards": {}}')
        files, parts = pack_regen(Path(a.run), before, Path(a.out), a.part, a.max_files)
        if before is not None and before.parent == Path(a.out):
            before.unlink()
        print(json.dumps({"files": [f.name for f in files], "part": a.part, "parts": parts}))
    elif a.cmd == "ckpt":
        files, parts = pack_ckpt(Path(a.run), a.part, Path(a.out), a.max_files)
        print(json.dumps({"files": [f.name for f in files], "part": a.part, "parts": parts}))
    elif a.cmd == "drafter":
        print(json.dumps({"files": [f.name for f in pack_drafter(Path(a.run), Path(a.out))]}))
    else:
        print(json.dumps(unpack(Path(a.src), Path(a.run))))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
