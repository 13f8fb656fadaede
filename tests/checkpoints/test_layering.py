# SPDX-License-Identifier: Apache-2.0
"""Imports point one way: runtime/ may use checkpoints/ and model_config, never the other way round (issue 36).
Read from the source with ast, so an import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
from pathlib import Path

import trtllm_dflash

PACKAGE = Path(trtllm_dflash.__file__).parent


def imported_modules(source: str, package: str) -> set[str]:
    """Every module that ``source`` (a module of ``package``, e.g. "trtllm_dflash.checkpoints") imports, as an
    absolute name; ``from X import name`` also gives X.name, since name may be a submodule."""
    parts = package.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def offenders(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in paths:
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        hits = sorted(m for m in imported_modules(path.read_text(), package) if m.startswith(forbidden))
        if hits:
            bad[str(path.relative_to(PACKAGE))] = hits
    return bad


def test_imported_modules_sees_relative_and_function_level_imports():
    # the checker must see what the rule is about, or the tests below would pass for nothing
    source = ("from ..runtime import models\nfrom .. import runtime\n\n"
              "def f():\n    from ..runtime.shard import check\n    import trtllm_dflash.runtime.engine\n")
    seen = imported_modules(source, "trtllm_dflash.checkpoints")
    assert {"trtllm_dflash.runtime.models", "trtllm_dflash.runtime", "trtllm_dflash.runtime.shard",
            "trtllm_dflash.runtime.engine"} <= seen
    assert imported_modules("from .hf import read_config\n", "trtllm_dflash.checkpoints") == {
        "trtllm_dflash.checkpoints.hf", "trtllm_dflash.checkpoints.hf.read_config"}


def test_checkpoints_do_not_import_the_runtime():
    paths = sorted((PACKAGE / "checkpoints").rglob("*.py"))
    assert len(paths) > 5
    assert offenders(paths, ("trtllm_dflash.runtime",)) == {}


def test_model_config_stands_below_checkpoints_and_runtime():
    # checkpoints/ validates a pair with it before any weight is read or torch is imported
    forbidden = ("trtllm_dflash.runtime", "trtllm_dflash.checkpoints", "torch")
    assert offenders([PACKAGE / "model_config.py"], forbidden) == {}
