# SPDX-License-Identifier: Apache-2.0
"""What produced a result: the command, the code (git SHA, clean or the hash of its diff), the installed
versions, the device, and the sha256 of every checkpoint it read. Every results file carries one record.

A copy of the working tree (the GPU host's) may travel without ``.git``, or with a ``.git`` that is not the one
that describes it; ``python -m trtllm_dflash.provenance --write DIR`` run here (before the copy) leaves
``DIR/.git_state.json``, which :func:`git_state` reads there.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

from .checkpoints.manifest import hash_tree, sha256_file
from .versions import installed

ROOT = Path(__file__).resolve().parent.parent
STATE_FILE = ".git_state.json"
PACKAGES = ("trtllm-dflash", "torch", "transformers", "triton", "nvidia-modelopt", "nvidia-pytriton",
            "tritonclient", "safetensors", "numpy")


def _git(*args: str, root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def _checkout_id(root: Path) -> str | None:
    """Which checkout ``root`` is (its git directory's device and inode): a copy of the tree elsewhere, with a
    ``.git`` of its own, has another even where its path and commit are the same."""
    git_dir = _git("rev-parse", "--absolute-git-dir", root=root)
    if git_dir is None:
        return None
    st = Path(git_dir.strip()).stat()
    return f"{st.st_dev}:{st.st_ino}"


def git_state(root: Path = ROOT) -> dict:
    """``{"sha", "dirty", "diff_sha256", "source"}``: the commit, and for a dirty tree the sha256 of
    ``git diff HEAD`` plus the untracked files' names, so two runs of the same dirty tree match.

    A ``.git_state.json`` in ``root`` wins: it exists only where ``--write`` put it for a copy of the tree,
    and such a copy may sit under a ``.git`` that describes other code (the GPU host's copy may have a stale
    one, or one at the same commit that counts the files carried beside the tree as untracked; a tree copied
    into a folder of another checkout sits inside that one's). Except in the checkout that wrote it (the file
    names it: ``checkout``), once that checkout has moved on: its commit is then HEAD or an ancestor of HEAD,
    and git answers. The record names which source answered."""
    top = _git("rev-parse", "--show-toplevel", root=root)
    own = top is not None and Path(top.strip()).resolve() == Path(root).resolve()
    sha = _git("rev-parse", "HEAD", root=root) if own else None
    state = root / STATE_FILE
    if state.is_file():
        written = json.loads(state.read_text())
        writer = written.get("checkout")
        if not (sha is not None and written.get("sha") and (writer is None or writer == _checkout_id(root))
                and _git("merge-base", "--is-ancestor", written["sha"], sha.strip(), root=root) is not None):
            return {**{k: v for k, v in written.items() if k != "checkout"}, "source": STATE_FILE}
    if sha is not None:
        diff = _git("diff", "HEAD", "--binary", root=root) or ""
        untracked = _git("ls-files", "--others", "--exclude-standard", root=root) or ""
        dirty = bool(diff.strip() or untracked.strip())
        digest = hashlib.sha256((diff + "\0" + untracked).encode()).hexdigest() if dirty else None
        return {"sha": sha.strip(), "dirty": dirty, "diff_sha256": digest, "source": "git"}
    return {"sha": None, "dirty": None, "diff_sha256": None, "source": "unknown (no .git and no .git_state.json)"}


def checkpoint_digest(path: str | Path) -> dict:
    """sha256 of a checkpoint: of the file, or for a directory of its sorted (name, sha256) list, which is
    what ``dflash-build inspect`` prints for the drafter and target."""
    path = Path(path)
    if path.is_file():
        return {"path": str(path), "sha256": sha256_file(path)}
    files = hash_tree(path)
    return {"path": str(path), "sha256": tree_digest(files), "files": files}


def tree_digest(files: dict[str, str]) -> str:
    """sha256 of a folder from its {relative name: sha256} list (a deployment manifest has that list already)."""
    return hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def device_info() -> dict:
    info = {"host": platform.node(), "python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    try:
        import torch
    except ImportError:
        return info
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_count=torch.cuda.device_count(), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, sm=f"{p.major}.{p.minor}")
    else:
        info.update(gpu=None, torch_threads=torch.get_num_threads())
    return info


def _module_argv(argv: list[str]) -> list[str]:
    """argv as typed: a module of this package run with ``-m`` (or through dflash-bench) has its file in argv[0]."""
    package = Path(__file__).resolve().parent
    script = Path(argv[0]).resolve() if argv and argv[0].endswith(".py") else None
    if script is None or package not in script.parents:
        return list(argv)
    module = ".".join(script.relative_to(package.parent).with_suffix("").parts)
    return ["-m", module, *argv[1:]]


def record(command: list[str] | str | None = None, checkpoints: dict[str, str | Path] | None = None,
           packages: tuple[str, ...] = PACKAGES) -> dict:
    """The provenance block of a results file. ``command`` defaults to this process's argv."""
    if command is None:
        command = [Path(sys.executable).name, *_module_argv(sys.argv)]
    git = git_state()
    return {
        "command": command if isinstance(command, str) else " ".join(str(c) for c in command),
        "git_sha": git["sha"] and git["sha"] + ("-dirty" if git["dirty"] else ""),   # the one line a reader looks for
        "git": git,
        "versions": installed(*packages),
        "device": device_info(),
        "checkpoints": {name: checkpoint_digest(p) for name, p in (checkpoints or {}).items() if p is not None},
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.provenance",
                                description="Print this checkout's git state, or write it into a copy of the tree "
                                            "that travels without .git (the GPU host).")
    p.add_argument("--write", metavar="DIR", help=f"write DIR/{STATE_FILE} (the state of this checkout)")
    args = p.parse_args(argv)
    stale = ROOT / STATE_FILE
    if args.write and Path(args.write).resolve() == ROOT and stale.is_file():
        stale.unlink()          # the state of this checkout, not of an earlier --write
    state = {k: v for k, v in git_state().items() if k != "source"}
    if args.write:
        state["checkout"] = _checkout_id(ROOT)
        Path(args.write, STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    print(json.dumps(state))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
