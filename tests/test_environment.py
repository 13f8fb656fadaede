# SPDX-License-Identifier: Apache-2.0
"""The installed dependency set works together (issue #19: `import datasets` failed with pyarrow 26 beside the
numpy < 2 that nvidia-pytriton's python backend needs)."""
from __future__ import annotations

import importlib.metadata


def test_numpy_1_and_datasets_work_together():
    import numpy

    assert int(numpy.__version__.split(".")[0]) < 2        # nvidia-pytriton's BYTES tensors need numpy 1.x
    import datasets                                         # dflash (dev) imports it; pyarrow must load

    ds = datasets.Dataset.from_dict({"prompt": ["a", "bb"]})    # pyarrow table + datasets' fingerprint (dill)
    assert ds.map(lambda row: {"n": len(row["prompt"])})["n"] == [1, 2]
    assert int(importlib.metadata.version("pyarrow").split(".")[0]) < 26


def test_triton_is_there_for_the_cpu_kernel_tests():
    """The Triton kernels run by default on every GPU; CI checks them in Triton's interpreter on the CPU. Without
    the `triton` package (the CPU torch wheel does not bring it) those tests skip, and CI never runs them."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = ("import torch, triton, triton.language as tl\n"
            "@triton.jit\n"
            "def add(x, y, out, n: tl.constexpr):\n"
            "    i = tl.arange(0, n)\n"
            "    tl.store(out + i, tl.load(x + i) + tl.load(y + i))\n"
            "x = torch.arange(8.0); out = torch.empty(8)\n"
            "add[(1,)](x, x, out, 8)\n"
            "assert out.tolist() == (2 * x).tolist(); print(triton.__version__)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:] + "\n(scripts/setup_env.sh installs triton)"
