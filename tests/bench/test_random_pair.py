# SPDX-License-Identifier: Apache-2.0
"""bench/random_pair.py: a known model's shapes with random weights on disk, sharded as the Hub's checkpoints."""
from __future__ import annotations

import json
import zlib

import pytest
import torch
from safetensors.torch import load_file

from trtllm_dflash.bench import random_pair
from trtllm_dflash.bench.step import target_config
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.errors import DFlashError


def test_sharded_target_index_covers_every_tensor_and_loads(tmp_path):
    cfg = target_config("qwen3-8b", smoke=True)
    out = random_pair.write_target(cfg, tmp_path / "target", torch.float32, "cpu", shard_bytes=200_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[-1].endswith(f"-of-{len(files):05d}.safetensors")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(out / f)))
    assert set(tensors) == set(index["weight_map"]) == set(random_pair.tensor_shapes(cfg))
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in tensors.values())
    assert hf.read_config(out)["num_hidden_layers"] == cfg["num_hidden_layers"]
    # the same draw as bench.tp's in-memory shards: a tensor's own crc32 seed
    name = "model.layers.0.self_attn.q_proj.weight"
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    assert torch.equal(tensors[name], torch.empty(tensors[name].shape).normal_(0, 0.02, generator=g))
    assert torch.equal(tensors["model.norm.weight"], torch.ones(cfg["hidden_size"]))


def test_cli_writes_a_pair_dflash_build_accepts_and_refuses_to_overwrite(tmp_path, capsys):
    from trtllm_dflash import build
    assert random_pair.main(["--model", "qwen3-8b", "--smoke", "--dtype", "float32", "--device", "cpu",
                             "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter", "target"]   # nothing partial left beside
    assert json.loads((tmp_path / "drafter" / "config.json").read_text())["dflash_trained"] is False
    assert build.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"), "--tp_size", "2",
                       "--gpu", "cpu", "--backend", "torch", "--max_seq_len", "256", "--out", str(tmp_path / "d")]) == 0
    with pytest.raises(DFlashError, match="--out"):
        random_pair.main(["--model", "qwen3-8b", "--smoke", "--device", "cpu", "--out", str(tmp_path)])


def test_unknown_model_is_one_line_naming_the_known_ones(tmp_path):
    with pytest.raises(DFlashError, match="not a known model.*qwen3-8b"):
        random_pair.write_random_pair("nope", tmp_path)
