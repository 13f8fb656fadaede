# SPDX-License-Identifier: Apache-2.0
"""What Triton's python-backend stub imports, measured on the real stub: its interpreter is isolated, so the
numpy check must ask that interpreter, not this process (the H100 soak died on a numpy 2 that PYTHONPATH
was meant to hide)."""
from __future__ import annotations

import json
import subprocess
import time

import numpy
import pytest

from tests.serving.conftest import TEST_ENV, free_port, terminate
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import triton_env

PROBE_MODEL = '''
import json, os, sys
import numpy


class TritonPythonModel:
    def initialize(self, args):
        try:
            import fake_only_on_pythonpath
            seen = True
        except ImportError:
            seen = False
        json.dump({"numpy_file": numpy.__file__, "numpy_version": numpy.__version__, "isolated": sys.flags.isolated,
                   "pythonpath_module_seen": seen}, open(os.environ["PROBE_OUT"], "w"))

    def execute(self, requests):
        return []
'''

CONFIG = '''name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def fake_numpy_2(root):
    """A numpy 2.0.0 that only PYTHONPATH can find (a package and its dist-info)."""
    (root / "numpy").mkdir(parents=True)
    (root / "numpy" / "__init__.py").write_text('__version__ = "2.0.0"\n')
    (root / "numpy-2.0.0.dist-info").mkdir()
    (root / "numpy-2.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 2.0.0\n")
    (root / "fake_only_on_pythonpath.py").write_text("")
    return root


@pytest.mark.slow
def test_the_stub_ignores_pythonpath_and_the_check_asks_what_it_imports(tmp_path):
    binary = triton_env.find_tritonserver()
    if binary.source != "nvidia-pytriton":
        pytest.skip("NGC's tritonserver on PATH: its stub is not the one this check is about")
    repo = tmp_path / "repo"
    (repo / "probe" / "1").mkdir(parents=True)
    (repo / "probe" / "config.pbtxt").write_text(CONFIG)
    (repo / "probe" / "1" / "model.py").write_text(PROBE_MODEL)
    out = tmp_path / "probe.json"
    env = {**TEST_ENV, **binary.env, "PYTHONPATH": str(fake_numpy_2(tmp_path / "pp")), "PROBE_OUT": str(out)}
    cmd = [binary.path, "--model-repository", str(repo), "--http-address", "127.0.0.1", "--http-port",
           str(free_port()), "--grpc-address", "127.0.0.1", "--grpc-port", str(free_port()), "--allow-metrics", "false"]
    if binary.backend_dir:
        cmd += ["--backend-directory", binary.backend_dir]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.2)    # the file is written in one call; let it close
        seen = json.loads(out.read_text())
    finally:
        terminate(proc, 30)
    # The stub's interpreter is isolated: PYTHONPATH's numpy 2.0.0 and module are invisible to it ...
    assert seen["isolated"] == 1 and not seen["pythonpath_module_seen"]
    assert seen["numpy_version"] == numpy.__version__ and seen["numpy_version"].startswith("1.")
    # ... so a check that read this process's metadata under that PYTHONPATH would refuse a server that works,
    # and (the H100 case) pass one whose stub loads numpy 2. The check asks the stub's interpreter instead.
    probe = subprocess.run([triton_env.stub_python(), "-c", "import importlib.metadata as m; print(m.version('numpy'))"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "2.0.0"
    triton_env.check_stub_numpy(triton_env.stub_python())      # no error: the stub's numpy is 1.x


def test_the_check_refuses_numpy_2_in_the_stubs_environment(tmp_path):
    # A venv-shaped interpreter whose own site-packages holds numpy 2 (what the GPU host's venv had).
    site = fake_numpy_2(tmp_path / "site")
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\nexec {triton_env.sys.executable} -c 'import sys; sys.path.insert(0, \"{site}\"); "
                      "exec(sys.argv[-1])' \"$@\"\n")
    python.chmod(0o755)
    with pytest.raises(DFlashError) as err:
        triton_env.check_stub_numpy(str(python))
    assert "numpy: 2.0.0" in str(err.value) and "install 'numpy<2' into the environment of" in str(err.value)
