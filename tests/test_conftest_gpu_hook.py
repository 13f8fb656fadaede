# SPDX-License-Identifier: Apache-2.0
"""The conftest hook skips `gpu`-marked tests where CUDA is missing and leaves them alone where it is."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of the hook")
def test_gpu_marked_tests_are_skipped_without_cuda(tmp_path):
    probe = ROOT / "tests" / "gpu" / f"test_probe_{tmp_path.name}.py"
    probe.write_text("import pytest\n\n@pytest.mark.gpu\ndef test_needs_cuda():\n    raise AssertionError('ran')\n\n"
                     "def test_plain():\n    pass\n")
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(probe)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert "1 passed, 1 skipped" in out.stdout, out.stdout + out.stderr
    assert "needs CUDA" in out.stdout


def test_exhaustive_cases_skip_by_default_and_run_when_asked(tmp_path):
    """The cases outside the default subset: skipped with the way to run them, run with --exhaustive (or its old
    name --kernels_all) or TRTLLM_DFLASH_EXHAUSTIVE=1."""
    import os

    probe = ROOT / "tests" / f"test_probe_kernels_{tmp_path.name}.py"
    probe.write_text("import pytest\n\n@pytest.mark.exhaustive\ndef test_further_case():\n    pass\n\n"
                     "def test_plain():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "TRTLLM_DFLASH_EXHAUSTIVE"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(probe)]
    try:
        runs = [subprocess.run(cmd + extra, cwd=ROOT, env={**env, **more}, capture_output=True, text=True, timeout=120)
                for extra, more in (([], {}), (["--kernels_all"], {}), ([], {"TRTLLM_DFLASH_EXHAUSTIVE": "1"}))]
    finally:
        probe.unlink()
    assert "1 passed, 1 skipped" in runs[0].stdout and "pytest --exhaustive" in runs[0].stdout, runs[0].stdout
    assert all("2 passed" in r.stdout for r in runs[1:]), [r.stdout for r in runs[1:]]
