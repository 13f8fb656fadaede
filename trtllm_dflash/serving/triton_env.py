# SPDX-License-Identifier: Apache-2.0
"""Which ``tritonserver`` runs the repository, and what it needs around it.

NGC's binary when ``tritonserver`` is on PATH (its backends are where it expects them); otherwise the
real Triton shipped inside the ``nvidia-pytriton`` wheel (0.7.0 bundles Triton 2.51 under
``pytriton/tritonserver``), set up like this: the python-backend stub for this interpreter placed next to
``libtriton_python.so`` in a backend directory of our own, the wheel's libraries and this interpreter's libpython on LD_LIBRARY_PATH, and
this interpreter's bin directory first on PATH (the stub runs model.py in the python found there).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoints.packaged import cache_root
from ..errors import DFlashError


@dataclass(frozen=True)
class TritonBinary:
    path: str
    source: str                          # "PATH" (e.g. NGC) or "nvidia-pytriton"
    backend_dir: str | None = None       # --backend-directory; None = the binary's own
    env: dict = field(default_factory=dict)   # variables to set for the server process


def find_tritonserver() -> TritonBinary:
    """NGC's ``tritonserver`` when on PATH, else the one in ``nvidia-pytriton`` (set up on first use)."""
    exe = shutil.which("tritonserver")
    if exe:
        return TritonBinary(exe, "PATH")
    return pytriton_binary()


def pytriton_binary() -> TritonBinary:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError("tritonserver", "is not on PATH and nvidia-pytriton is not installed",
                          "pip install 'trtllm-dflash[triton]', or run in NGC's tritonserver image")
    check_stub_numpy(stub_python())
    site = Path(spec.submodule_search_locations[0]).resolve().parent
    ts = site / "pytriton" / "tritonserver"
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = ts / "python_backend_stubs" / py / "triton_python_backend_stub"
    if not stub.is_file():
        raise DFlashError("python", f"{py} has no python-backend stub in nvidia-pytriton", "use Python 3.10-3.12")
    version = importlib.metadata.version("nvidia-pytriton")
    backend_dir = cache_root() / f"triton_backends-pytriton{version}-py{py}"
    _install_backend(backend_dir / "python",
                     [ts / "backends" / "python" / "libtriton_python.so",
                      ts / "backends" / "python" / "triton_python_backend_utils.py", stub])
    libs = [str(site / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR")]
    if os.environ.get("LD_LIBRARY_PATH"):
        libs.append(os.environ["LD_LIBRARY_PATH"])
    env = {"LD_LIBRARY_PATH": ":".join(libs),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return TritonBinary(str(ts / "bin" / "tritonserver"), "nvidia-pytriton", str(backend_dir), env)


def stub_python() -> str:
    """The interpreter the python-backend stub will run: the first ``python3`` on the PATH we give the server,
    i.e. this interpreter's bin directory (a venv's own ``python3``, so its pyvenv.cfg and site-packages)."""
    candidate = Path(sys.executable).parent / "python3"
    return str(candidate) if candidate.is_file() else sys.executable


def check_stub_numpy(python: str) -> None:
    """Refuse numpy >= 2 where the stub would import it. The 2.51 stub is built with a pybind11 that predates
    numpy 2's array layout: with numpy 2 it reads a BYTES tensor (every prompt) as garbage and dies. Its
    embedded interpreter runs isolated (ignores PYTHONPATH, adds the working directory): asking this process's
    numpy, or a PYTHONPATH that puts numpy 1 first, says nothing about it, so ask the same interpreter, isolated."""
    probe = subprocess.run([python, "-I", "-c", "import numpy; print(numpy.__version__); print(numpy.__file__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise DFlashError("numpy", f"cannot be imported by {python} run isolated, as Triton's python-backend stub "
                          f"runs it: {probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'no output'}",
                          f"install 'numpy<2' into the environment of {python} (PYTHONPATH does not reach the stub)")
    version, where = probe.stdout.split()[:2]
    if int(version.split(".")[0]) >= 2:
        raise DFlashError("numpy", f"{version} ({where}) is what Triton 2.51's python-backend stub imports, and it "
                          "misreads every prompt with numpy 2 (PYTHONPATH does not reach the stub: it runs isolated)",
                          f"install 'numpy<2' into the environment of {python}")


def _install_backend(dest: Path, files: list[Path]) -> None:
    """Copy the python backend once (per pytriton and python version); copy-then-rename per file, so a
    server starting at the same time never sees half a file."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in files:
        target = dest / src.name
        if target.is_file() and target.stat().st_size == src.stat().st_size:
            continue
        tmp = dest / f".{src.name}.{os.getpid()}"
        shutil.copy2(src, tmp)
        os.replace(tmp, target)
