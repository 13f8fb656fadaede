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
