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
