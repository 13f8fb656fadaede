# SPDX-License-Identifier: Apache-2.0
"""The exported drafter in shards small enough for a copy that bounds a file's size (training/bundle.py drafter):
split by bytes, so a deeper drafter takes more shards instead of larger ones, and the shards load as the file."""
from __future__ import annotations

import shutil

import pytest
import torch

from trtllm_dflash.checkpoints import hf, resolve
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training.bundle import MAX_BYTES, pack_drafter
from trtllm_dflash.training.grow import grow


@pytest.mark.parametrize("layers, shards", [(3, 2), (5, 3)])
def test_drafter_shards_stay_under_the_limit_and_load_as_the_file(tmp_path, layers, shards):
    run = tmp_path / "run"
    shipped = resolve.shipped_drafter_dir("smollm2-135m-dflash")
    if layers == 3:
        shutil.copytree(shipped, run / "drafter")
    else:   # the shipped drafter grown to 5 layers: ~39 MB, over two shards of the limit
        grow("smollm2-135m-dflash", run / "drafter", layers)
    files = pack_drafter(run, tmp_path / "out")
    parts = [f for f in files if f.suffix == ".safetensors"]
    assert len(parts) == shards and all(f.stat().st_size <= MAX_BYTES + 100_000 for f in parts)
    (tmp_path / "out" / "config.json").write_bytes((run / "drafter" / "config.json").read_bytes())
    got, want = hf.load_state_dict(tmp_path / "out"), hf.load_state_dict(run / "drafter")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_tensor_over_the_limit_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(resolve.shipped_drafter_dir("smollm2-135m-dflash"), run / "drafter")
    with pytest.raises(DFlashError, match=r"drafter/model.safetensors: .* bytes, over the 1,000,000"):
        pack_drafter(run, tmp_path / "out", max_bytes=1_000_000)
