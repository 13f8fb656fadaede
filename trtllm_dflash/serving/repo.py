# SPDX-License-Identifier: Apache-2.0
"""Fill the Triton model repository template (``triton_model_repo/``) for one deployment directory.

In: ``triton_model_repo/tensorrt_llm`` (``${...}`` placeholders) and a deployment manifest.
Out: ``<out_dir>/triton/tensorrt_llm/{config.pbtxt, 1/model.py, 1/model.yaml}``.
Semantics of tensorrtllm_backend's ``tools/fill_template.py`` (every given key must occur in the
templates), plus the check it lacks: a ``${`` left after filling is an error.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..deployment import BACKENDS
from ..errors import DFlashError

MODEL_NAME = "tensorrt_llm"
_TEMPLATED = ("config.pbtxt", "1/model.yaml")
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def template_dir() -> Path:
    """``triton_model_repo/`` of the source checkout this package runs from."""
    path = Path(__file__).resolve().parents[2] / "triton_model_repo"
    if not (path / MODEL_NAME / "config.pbtxt").is_file():
        raise DFlashError("triton_model_repo", f"templates not found at {path}",
                          "install trtllm-dflash from a source checkout (pip install -e .)")
    return path


def fill_template(text: str, values: dict[str, str], where: str = "template") -> str:
    """Replace ``${key}`` by ``values[key]``; a placeholder without a value is an error."""
    out = _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    if "${" in out:
        left = sorted(set(re.findall(r"\$\{[^}]*\}?", out)))
        raise DFlashError(where, f"placeholders left unfilled: {', '.join(left)}",
                          "give a value for each of them")
    return out


def placeholder_values(deployment_dir: Path, model_dir: Path, manifest: dict,
                       decoupled_mode: bool) -> dict[str, str]:
    """The values for each templated file. ``deployment_dir`` is relative when the repository sits inside
    the deployment (``<dir>/triton``), so the directory can be moved or mounted elsewhere."""
    backend = manifest.get("backend")
    if backend not in BACKENDS:
        raise DFlashError("manifest.backend", f"is {backend!r}", f"use one of {', '.join(BACKENDS)}")
    tp_size = manifest.get("tp_size", 1)
    if not isinstance(tp_size, int) or tp_size < 1:
        raise DFlashError("manifest.tp_size", f"is {tp_size!r}", "use a positive integer")
    version_dir = model_dir / "1"
    deployment_dir = deployment_dir.resolve()
    where = (os.path.relpath(deployment_dir, version_dir.resolve())
             if deployment_dir in version_dir.resolve().parents else str(deployment_dir))
    # json.dumps gives a double-quoted string that is also valid YAML, whatever the path holds.
    return {"deployment_dir": json.dumps(where), "decoupled_mode": "true" if decoupled_mode else "false"}


def fill_triton(out_dir: Path, manifest: dict, *, decoupled_mode: bool = True,
                repo_dir: Path | None = None) -> Path:
    """Write the filled repository for the deployment at ``out_dir``; returns the repository root.

    ``repo_dir`` defaults to ``<out_dir>/triton``; pass another path for a throwaway repository that
    serves ``out_dir`` (for example with another ``decoupled_mode``). An existing model directory in it
    is replaced as a whole.
    """
    out_dir = Path(out_dir)
    repo_dir = Path(repo_dir) if repo_dir is not None else out_dir / "triton"
    model_dir = repo_dir / MODEL_NAME
    values = placeholder_values(out_dir, model_dir, manifest, decoupled_mode)
    src = template_dir() / MODEL_NAME
    repo_dir.mkdir(parents=True, exist_ok=True)
    # Fill into a sibling temp dir, then swap it in: a failed fill leaves no half-written model.
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.", dir=repo_dir))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        texts = {name: (tmp / name).read_text() for name in _TEMPLATED}
        unused = [k for k in values if not any(f"${{{k}}}" in t for t in texts.values())]
        if unused:   # fill_template.py's rule: a value nobody asked for is a mistake
            raise DFlashError(MODEL_NAME, f"templates have no placeholder for {', '.join(sorted(unused))}",
                              "keep trtllm_dflash/serving/repo.py and triton_model_repo/ in step")
        for name, text in texts.items():
            (tmp / name).write_text(fill_template(text, values, where=f"{MODEL_NAME}/{name}"))
        for path in tmp.rglob("*"):
            if path.is_file() and "${" in path.read_text(errors="replace"):
                raise DFlashError(f"{MODEL_NAME}/{path.relative_to(tmp)}", "has an unfilled ${...}",
                                  "add it to the filled files in trtllm_dflash/serving/repo.py")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        tmp.rename(model_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return repo_dir


def link_mirror(repo: Path, dest: Path) -> Path:
    """``dest``: the folders of the model repository ``repo`` with a symbolic link to each of its files.

    Triton serves it exactly as ``repo``, while whatever the python backend writes beside model.py lands in
    ``dest``: its stub imports model.py with bytecode caching on (its embedded interpreter runs isolated, so
    PYTHONDONTWRITEBYTECODE never reaches it) and would put ``__pycache__`` into the deployment, which then no
    longer matches its manifest. model.py finds model.yaml, and through it the deployment, from its resolved path,
    so the links change nothing it reads."""
    repo = Path(repo).resolve()
    for dirpath, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        here = Path(dirpath)
        out = Path(dest) / here.relative_to(repo)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            if not name.endswith(".pyc"):
                os.symlink(here / name, out / name)
    return Path(dest)
