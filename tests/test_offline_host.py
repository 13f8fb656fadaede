# SPDX-License-Identifier: Apache-2.0
"""scripts/offline_host.sh on this machine: a file split into parts comes back whole and sha256-checked (a changed
part is refused), a wheel folder installs into its own site dir once, `env` puts it on PYTHONPATH, and `venv`
serves it to an isolated interpreter (python -I ignores PYTHONPATH) with the HIDE modules absent."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "offline_host.sh"
ENV = {**os.environ, "PYTHON": sys.executable}


def host(*args, check: bool = True, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**ENV, **env})
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def write_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A pure-python wheel pip installs without an index: the module, METADATA, WHEEL and RECORD."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 42\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{info}/RECORD", record)
    return path


def test_split_file_is_joined_and_checked(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(os.urandom(5 * 2**19))                 # 2.5 MB -> three parts of at most 1 MB
    box = tmp_path / "offline"
    host("add", box, src, 1)
    assert sorted(p.name for p in (box / "models").iterdir()) == [
        "SHA256SUMS", "model.gguf.part00", "model.gguf.part01", "model.gguf.part02"]
    out = host("install", box).stdout
    assert "1 file(s) checked" in out
    joined = hashlib.sha256((box / "models" / "model.gguf").read_bytes()).hexdigest()
    assert joined == hashlib.sha256(src.read_bytes()).hexdigest()

    # a part changed on the way: the joined file no longer matches and install says which list to trust
    (box / "models" / "model.gguf").unlink()
    part = box / "models" / "model.gguf.part01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    bad = host("install", box, check=False)
    assert bad.returncode != 0 and "does not match its sha256 in SHA256SUMS" in bad.stderr


def test_env_points_the_packaged_target_at_the_gguf_that_came_along(tmp_path):
    from trtllm_dflash.checkpoints.packaged import SMOLLM2_GGUF_ENV, SMOLLM2_GGUF_NAME
    box = tmp_path / "offline"
    (box / "site" / "train").mkdir(parents=True)
    assert SMOLLM2_GGUF_ENV not in host("env", box, "train").stdout   # no GGUF: nothing said about it
    src = tmp_path / SMOLLM2_GGUF_NAME
    src.write_bytes(os.urandom(2**20))
    host("add", box, src, 1)
    host("install", box)
    assert f"export {SMOLLM2_GGUF_ENV}={box / 'models' / SMOLLM2_GGUF_NAME}" in host("env", box, "train").stdout


def test_a_wheel_larger_than_part_mb_travels_in_parts_and_installs(tmp_path):
    big = write_wheel(tmp_path / "src", "bigpkg")
    with zipfile.ZipFile(big, "a", compression=zipfile.ZIP_STORED) as z:   # 1.5 MB that does not compress
        z.writestr("bigpkg/blob.bin", os.urandom(3 * 2**19))
    box = tmp_path / "offline"
    host("wheels", box, "big", big, PART_MB="1")
    folder = box / "wheels" / "big"
    assert sorted(p.name for p in folder.iterdir()) == ["SHA256SUMS", *(f"{big.name}.part0{i}" for i in range(2))]
    out = host("install", box).stdout
    assert "wheels/big: 1 file(s) checked" in out and "wheels/big: 1 installed" in out
    assert (box / "site" / "big" / "bigpkg" / "blob.bin").stat().st_size == 3 * 2**19


def test_a_wheel_built_here_joins_a_set_checked_and_installs(tmp_path):
    built = write_wheel(tmp_path / "build", "localpkg")
    box = tmp_path / "offline"
    host("wheel", box, "local", built)
    folder = box / "wheels" / "local"
    assert (folder / "SHA256SUMS").read_text() == f"{hashlib.sha256(built.read_bytes()).hexdigest()}  {built.name}\n"
    out = host("install", box).stdout
    assert "wheels/local: 1 file(s) checked" in out and (box / "site" / "local" / "localpkg" / "__init__.py").exists()
    bad = host("wheel", box, "local", tmp_path / "notes.txt", check=False)
    assert bad.returncode == 2 and "is not a .whl file" in bad.stderr


def test_a_missing_file_is_named(tmp_path):
    box = tmp_path / "offline"
    (box / "models").mkdir(parents=True)
    (box / "models" / "SHA256SUMS").write_text("0" * 64 + "  prompts.jsonl\n")
    bad = host("install", box, check=False)
    assert bad.returncode != 0 and "models/prompts.jsonl is missing" in bad.stderr


def test_wheel_set_installs_once_and_reaches_plain_and_isolated_pythons(tmp_path):
    box = tmp_path / "offline"
    write_wheel(box / "wheels" / "extra")
    assert "wheels/extra: 1 installed" in host("install", box).stdout
    assert "installed" not in host("install", box).stdout     # each wheel once
    exports = host("env", box, "extra").stdout
    run = subprocess.run(["bash", "-c", exports + f'\n"{sys.executable}" -c "import tinypkg; print(tinypkg.VALUE)"'],
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "42", run.stderr

    venv = tmp_path / "venv"
    python = host("venv", box, "extra", venv, HIDE="csv").stdout.strip()
    probe = "import tinypkg, sys\ntry:\n    import csv\nexcept ImportError:\n    print(tinypkg.VALUE, 'no csv')"
    run = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "42 no csv", run.stderr
    assert host("env", box, "missing", check=False).returncode != 0


# ---- the wheel sets: pip downloads them with --no-deps, so a requirement left out is missing on the GPU host ----
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "extra": ""}   # the GPU host's interpreter


def wheel_set(path: Path) -> tuple[dict[str, str], set[str]]:
    """(pinned name -> version, the names a `# host provides:` line says the GPU host's environment has)."""
    from packaging.utils import canonicalize_name
    pins, host_has = {}, set()
    for line in path.read_text().splitlines():
        if line.startswith("# host provides:"):
            host_has |= {canonicalize_name(n) for n in line.split(":", 1)[1].split()}
        elif line.split("#")[0].strip():
            name, version = line.split("#")[0].strip().split("==")
            pins[canonicalize_name(name)] = version
    return pins, host_has


def unlisted_requirements(pins: dict[str, str], host_has: set[str]) -> dict[str, list[str]]:
    """Requirements (for the GPU host's Python) of the pinned packages installed here that the set neither lists nor
    names as the host's: {requirement: [the packages that need it]}."""
    from importlib import metadata
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    missing: dict[str, list[str]] = {}
    for name in pins:
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:   # not installed here: nothing to read its requirements from
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate(MARKER_ENV):
                continue
            dep = canonicalize_name(req.name)
            if dep not in pins and dep not in host_has:
                missing.setdefault(dep, []).append(name)
    return missing


@pytest.mark.parametrize("name", ["train.txt", "triton.txt"])
def test_every_requirement_of_a_wheel_set_is_listed_or_on_the_host(name):
    # fastapi 0.165 imports opentelemetry at import time; the set once lacked it and dflash-openai could not
    # start on the GPU host
    pins, host_has = wheel_set(ROOT / "benchmarks" / "offline" / name)
    assert unlisted_requirements(pins, host_has) == {}


def test_an_unlisted_requirement_is_found():
    # pytest needs pluggy on every platform, colorama only on Windows (a marker the GPU host's Linux leaves out)
    found = unlisted_requirements({"pytest": "any"}, set())
    assert "pluggy" in found and "colorama" not in found
    assert "pluggy" not in unlisted_requirements({"pytest": "any"}, {"pluggy"})
