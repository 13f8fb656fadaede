# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism on CPU: ranks started by a real mpiexec (gloo) give the same tokens as one process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime import tp_run
from trtllm_dflash.runtime.shard import shard_dim, slice_for_rank

HERE = Path(__file__).parent


def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    assert found, "mpiexec not found: pip install 'trtllm-dflash[mpi]' (mpi4py + mpich)"
    return found


@pytest.mark.mpi
# 4 ranks over the tiny pairs' 2 KV heads: each holds a replica of one. One of each pair and each size by default.
@pytest.mark.parametrize("pair_name, tp", [("tiny_pair", 2), ("tiny_qwen3_pair", 4),
                                           pytest.param("tiny_pair", 4, marks=pytest.mark.exhaustive),
                                           pytest.param("tiny_qwen3_pair", 2, marks=pytest.mark.exhaustive)])
def test_tp_under_mpiexec_equals_tp1(request, tmp_path, pair_name, tp):
    """N ranks give TP 1's tokens (greedy and seeded sampling); at 4 ranks over 2 KV heads each rank holds one query
    head and a replica of its group's KV head, as TensorRT-LLM and vLLM lay it out."""
    target, drafter = request.getfixturevalue(pair_name)
    assert json.loads((target / "config.json").read_text())["num_key_value_heads"] == 2
    expected = tp_run.run(target, drafter, 1)
    out = tmp_path / f"tp{tp}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent)}
    cmd = [mpiexec(), "-n", str(tp), sys.executable, str(HERE / "tp_run.py"), str(target), str(drafter), str(out),
           str(tp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["dflash"] == expected


def test_kv_heads_are_replicated_when_ranks_outnumber_them():
    import torch

    from trtllm_dflash.model_config import check_heads
    from trtllm_dflash.runtime.shard import kv_heads_per_rank

    k = torch.arange(2 * 3 * 5).view(2 * 3, 5).float()       # 2 KV heads of head_dim 3, hidden 5
    parts = [slice_for_rank("model.layers.0.self_attn.k_proj.weight", k, 4, r, num_kv_heads=2) for r in range(4)]
    assert [torch.equal(p, k[:3]) for p in parts] == [True, True, False, False]     # ranks 0, 1 share head 0
    assert [torch.equal(p, k[3:]) for p in parts] == [False, False, True, True]
    bias = torch.arange(6).float()
    assert torch.equal(slice_for_rank("layers.1.self_attn.v_proj.bias", bias, 8, 7, num_kv_heads=2), bias[3:])
    # as many or fewer ranks than KV heads: split as before
    assert torch.equal(slice_for_rank("model.layers.0.self_attn.k_proj.weight", k, 2, 1, num_kv_heads=2), k[3:])
    assert kv_heads_per_rank(2, 4) == 1 and kv_heads_per_rank(8, 4) == 2
    assert check_heads(64, 8, 16) is None and check_heads(64, 8, 8) is None
    assert "neither divides num_key_value_heads (8)" in check_heads(48, 8, 12)
    assert "does not divide num_attention_heads (9)" in check_heads(9, 3, 2)


def test_shard_rules_cover_every_layer_kind():
    import torch
    assert shard_dim("model.layers.3.self_attn.q_proj.weight") == 0
    assert shard_dim("layers.0.self_attn.k_proj.bias") == 0
    assert shard_dim("model.layers.3.mlp.down_proj.weight") == 1
    assert shard_dim("model.layers.3.self_attn.q_norm.weight") is None
    assert shard_dim("fc.weight") is None and shard_dim("hidden_norm.weight") is None
    assert shard_dim("lm_head.weight") == "vocab"
    w = torch.arange(10 * 3).view(10, 3).float()
    parts = [slice_for_rank("lm_head.weight", w, 4, r) for r in range(4)]
    assert all(p.shape == (3, 3) for p in parts)  # 10 rows over 4 ranks: 3 each, the last padded with zeros
    assert torch.equal(torch.cat(parts)[:10], w) and not parts[3][1:].any()


def test_rank_tensors_reads_a_ranks_slices_from_safetensors_and_pickle_alike(tmp_path):
    import torch

    from trtllm_dflash.checkpoints import hf
    from trtllm_dflash.runtime.shard import rank_tensors

    g = torch.Generator().manual_seed(0)
    sd = {"layers.0.self_attn.q_proj.weight": torch.randn(4, 3, generator=g),   # column: rows split
          "layers.0.self_attn.o_proj.weight": torch.randn(3, 4, generator=g),   # row: columns split
          "layers.0.input_layernorm.weight": torch.randn(3, generator=g)}       # replicated
    hf.save_state_dict(sd, tmp_path / "st")
    (tmp_path / "pt").mkdir()
    torch.save(sd, tmp_path / "pt" / "pytorch_model.bin")
    want = {n: slice_for_rank(n, t, 2, 1) for n, t in sd.items()}
    assert want["layers.0.self_attn.q_proj.weight"].shape == (2, 3)
    assert want["layers.0.self_attn.o_proj.weight"].shape == (3, 2)
    for got in (rank_tensors(tmp_path / "st", 2, 1), rank_tensors(tmp_path / "pt", 2, 1, allow_pickle=True)):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[n], want[n]) for n in want)
    # a build's rank file holds both models' slices: the prefix picks one, and the checkpoint is not read
    presharded = {"target.a": sd["layers.0.input_layernorm.weight"], "drafter.a": torch.zeros(1)}
    got = rank_tensors(tmp_path / "missing", 2, 1, presharded=presharded, prefix="target.")
    assert list(got) == ["a"] and got["a"] is presharded["target.a"]
