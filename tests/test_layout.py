# SPDX-License-Identifier: Apache-2.0
"""The repository's shape (issue #36): measurement code lives in the package, benchmarks/ keeps recipes, docs and
committed results. Checked mechanically: no sys.path edits under benchmarks/, no imports between benchmarks/ and
tests/ in either direction (nor from the package), benchmarks/ at most 15% of the non-test lines, no text
about the environment the project was developed in outside committed results, and "backend" is a deployment's
runtime choice only (TensorRT-LLM's own fields keep their names)."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CODE = (".py", ".sh")
# Built from pieces so that this file does not match itself.
WORDING = re.compile("|".join([re.escape(".") + "car" + r"ry\b", "device" + r" calls?\b", r"\ble" + r"ase\b",
                               "device" + " time", "device" + " minutes", "64" + " MiB", "car" + r"ry=\["]))
# a manifest parsed in place (json + a read on one line), rather than opened through Deployment
READS_MANIFEST = re.compile(r"(json\.loads?\(|\.read_(text|bytes)\(|(?<!Deployment\.)open\().*manifest"
                            r"|manifest[^#]*(json\.loads?\(|\.read_(text|bytes)\()", re.I)
IMPORTS_TESTS = re.compile(r"^\s*(from|import)\s+tests\b|\btests\.(tiny|serving|runtime|gpu)\b", re.M)
IMPORTS_BENCHMARKS = re.compile(r"^\s*(from|import)\s+benchmarks\b|[\"']benchmarks[\"']\s*/\s*f?[\"'][^\"']*\.py"
                                r"|[\"']benchmarks/\w+\.py[\"']", re.M)


def files(folder: Path, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """Source files under folder (no caches, no committed results)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and RESULTS not in p.parents and (suffixes is None or p.suffix in suffixes))


def lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_benchmarks_hold_recipes_without_path_edits_or_test_imports():
    recipes = files(ROOT / "benchmarks")
    assert recipes, "benchmarks/ has no recipes"
    for p in recipes:
        if p.suffix in {".png", ".gz"}:
            continue
        text = p.read_text()
        assert "sys.path" not in text, f"{p.relative_to(ROOT)} edits sys.path: import the package instead"
        assert not IMPORTS_TESTS.search(text), f"{p.relative_to(ROOT)} imports tests: use trtllm_dflash.testing"


def test_every_recipe_parses():
    for p in files(ROOT / "benchmarks", (".sh",)) + files(ROOT / "scripts", (".sh",)):
        proc = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_tests_and_package_never_import_benchmarks():
    for p in files(ROOT / "tests", (".py",)) + files(ROOT / "trtllm_dflash", (".py",)):
        found = IMPORTS_BENCHMARKS.search(p.read_text())
        assert not found, f"{p.relative_to(ROOT)} reaches into benchmarks/ ({found.group(0)!r}): use trtllm_dflash.bench"
    for p in files(ROOT / "trtllm_dflash", (".py",)):
        found = IMPORTS_TESTS.search(p.read_text())
        assert not found, f"{p.relative_to(ROOT)} imports tests ({found.group(0)!r}): the package stands alone"


def test_benchmarks_are_at_most_15_percent_of_the_non_test_lines():
    bench = lines(files(ROOT / "benchmarks", CODE))
    total = bench + lines(files(ROOT / "trtllm_dflash", CODE)) + lines(files(ROOT / "scripts", CODE))
    assert bench <= 0.15 * total, f"benchmarks/ holds {bench} of {total} non-test lines ({bench / total:.0%})"


def test_no_text_about_the_development_environment():
    roots = [ROOT / "README.md", ROOT / ".gitignore", *(ROOT / d for d in ("trtllm_dflash", "tests", "benchmarks",
                                                                           "scripts"))]
    hits = []
    for root in roots:
        for p in [root] if root.is_file() else files(root):
            try:
                text = p.read_text()
            except UnicodeDecodeError:      # images, archives
                continue
            hits += [f"{p.relative_to(ROOT)}:{n}: {ln.strip()}" for n, ln in enumerate(text.splitlines(), 1)
                     if WORDING.search(ln)]
    assert not hits, "\n".join(hits)


def test_the_wording_check_finds_what_it_looks_for():
    for bad in ["put it in ." + "carry/p0", "one stage per device" + " call", "the le" + "ase ends",
                "~30 device" + "-minutes".replace("-", " "), "at most 64" + " MiB", "run(carry" + "=[x])"]:
        assert WORDING.search(bad), bad
    for fine in ["the 64-MiB budget", "kernels' GPU time", "released", "carry the scales"]:
        assert not WORDING.search(fine), fine


def test_backend_names_only_the_deployments_runtime():
    # TensorRT-LLM's options live in trtllm.py, not in a "backends" package; the torch runtime's MoE choice is a kernel
    named = [str(p.relative_to(ROOT)) for p in files(ROOT / "trtllm_dflash") + files(ROOT / "tests")
             if "backend" in p.stem or any("backend" in part for part in p.relative_to(ROOT).parts[:-1])]
    assert not named, named
    defined = []
    for p in files(ROOT / "trtllm_dflash" / "runtime", (".py",)):
        for node in ast.walk(ast.parse(p.read_text())):
            name = getattr(node, "name", None) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else (
                node.arg if isinstance(node, ast.arg) else None)
            if name and "backend" in name.lower():
                defined.append(f"{p.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not defined, "the runtime names kernels, not backends: " + ", ".join(defined)


def test_one_reader_of_a_deployments_manifest():
    # training/ keeps a corpus's own data/manifest.json (another file); a deployment's goes through Deployment
    paths = [p for folder in ("trtllm_dflash", "scripts", "benchmarks") for p in files(ROOT / folder, CODE)
             if p.name != "deployment.py" and "training" not in p.relative_to(ROOT).parts]
    hits = [f"{p.relative_to(ROOT)}:{n}: {ln.strip()}" for p in paths
            for n, ln in enumerate(p.read_text().splitlines(), 1) if READS_MANIFEST.search(ln)]
    assert not hits, "read it with Deployment.open:\n" + "\n".join(hits)
    assert READS_MANIFEST.search("""m = json.load(open(sys.argv[1] + "/manifest.json"))""")
    assert not READS_MANIFEST.search("m = Deployment.open(path).manifest")


def test_no_test_module_imports_triton_when_collected():
    # Triton reads TRITON_INTERPRET once, when first imported; the kernel tests set it when pytest imports them, so
    # a test module collected before them that imported Triton left every later interpreter test calling compiled
    # kernels ("Cannot call @triton.jit'd outside of the scope of a kernel": 113 failures in one full run).
    def imports_triton(node) -> bool:
        if isinstance(node, ast.Import):
            return any(a.name.split(".")[0] == "triton" for a in node.names)
        if isinstance(node, ast.ImportFrom):
            return (node.module or "").split(".")[0] == "triton"
        call = getattr(node, "value", None)
        return (isinstance(node, (ast.Expr, ast.Assign)) and isinstance(call, ast.Call)
                and getattr(call.func, "attr", "") == "importorskip" and bool(call.args)
                and str(getattr(call.args[0], "value", "")).split(".")[0] == "triton")
    hits = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in (ROOT / "tests").rglob("test_*.py")
            for node in ast.parse(p.read_text()).body if imports_triton(node)]
    assert not hits, "import Triton inside the tests that use it: " + ", ".join(hits)
    bad = ast.parse('import pytest\npytest.importorskip("triton")\n').body
    assert imports_triton(bad[1]) and not imports_triton(bad[0])
