# SPDX-License-Identifier: Apache-2.0
"""Every path, module and console command the README names exists: a repository path (`benchmarks/x.py`, a
results folder, `serving/http_guard.py` inside the package), a bare file name in backticks, `python -m MODULE`,
and each `dflash-*` command, which must be a [project.scripts] entry whose function exists."""
from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# path-like words (a/b, a/b.py, a/); a word after '.', '-', '<' or a letter is part of something else (a URL, a flag)
PATHLIKE = re.compile(r"(?<![\w/.\-<:])((?:[\w.\-]+/)+[\w.\-]*)")
BARE_FILE = re.compile(r"`([\w.\-]+\.(?:py|sh|json|jsonl|yaml|yml|png|md|txt|csv|toml))`")
MODULE = re.compile(r"python3? -m (trtllm_dflash(?:\.\w+)*)")
# a whole dflash-* word: `dflash-admin-key` (a header name) is no command dflash-admin
COMMAND = re.compile(r"(?<![\w\-/.])(dflash-[a-z_]+)(?![\w\-])")
# files the README names that live in a checkpoint or a deployment, not in this repository
NOT_OURS = {"hf_quant_config.json"}


def tracked() -> set[str]:
    """Every tracked file and folder (as 'a/b/c' and 'a/b/'-less 'a/b'), from git: untracked output never counts."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
    paths = set()
    for f in out.splitlines():
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return paths


def missing(text: str, paths: set[str], scripts: dict[str, str]) -> list[str]:
    """What the README text names that does not exist, one line each."""
    names = {p.rsplit("/", 1)[-1] for p in paths}          # every tracked file and folder name
    out = []
    for word in sorted(set(PATHLIKE.findall(text))):
        word = word.rstrip(".")
        first = word.split("/")[0]
        # out/smollm2, FP8/NVFP4, application/json, 3/8: not a path into this repository
        if first not in names or not re.search("[A-Za-z]", first):
            continue
        key = word.rstrip("/")
        if not any(p == key or p.endswith("/" + key) for p in paths):
            out.append(f"path {word}: no such file or folder in the repository")
    for name in sorted(set(BARE_FILE.findall(text)) - NOT_OURS):
        if name not in names:
            out.append(f"file {name}: no tracked file has that name")
    for module in sorted(set(MODULE.findall(text))):
        rel = module.replace(".", "/")
        if f"{rel}.py" not in paths and f"{rel}/__init__.py" not in paths:
            out.append(f"module {module}: no such module")
    for cmd in sorted(set(COMMAND.findall(text))):
        if cmd not in scripts:
            out.append(f"command {cmd}: not a console script in pyproject.toml [project.scripts]")
    for cmd, target in sorted(scripts.items()):
        module, func = target.split(":")
        source = ROOT / (module.replace(".", "/") + ".py")
        defined = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
        if func not in defined:
            out.append(f"command {cmd}: {target} has no function {func}")
    return out


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_path_module_and_command_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    paths = tracked()
    assert not missing(text, paths, _scripts()), "\n".join(missing(text, paths, _scripts()))
    # and the check looks at something: the README names many repository paths and every console command
    assert len([w for w in PATHLIKE.findall(text) if w.split("/")[0] in {"benchmarks", "scripts", "tests"}]) > 20
    assert set(COMMAND.findall(text)) == set(_scripts())


def test_a_missing_path_module_or_command_is_reported():
    text = ("`benchmarks/aiperf_openai.sh` runs it; see tests/serving/no_such_test.py, `serving/http_guard.py`, "
            "`no_such_plot.png`, out/smollm2 (made by the user), `python -m trtllm_dflash.nothing`, "
            "`dflash-nothing --help`, `dflash-serve DIR`, the `dflash-admin-key` header.")
    got = missing(text, tracked(), {**_scripts(), "dflash-broken": "trtllm_dflash.cli:no_such_main"})
    assert got == ["path benchmarks/aiperf_openai.sh: no such file or folder in the repository",
                   "path tests/serving/no_such_test.py: no such file or folder in the repository",
                   "file no_such_plot.png: no tracked file has that name",
                   "module trtllm_dflash.nothing: no such module",
                   "command dflash-nothing: not a console script in pyproject.toml [project.scripts]",
                   "command dflash-broken: trtllm_dflash.cli:no_such_main has no function no_such_main"]
