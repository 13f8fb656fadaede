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
@pytest.mark.parametrize("pair_name", ["tiny_pair", "tiny_qwen3_pair"])
def test_tp2_under_mpiexec_equals_tp1(request, tmp_path, pair_name):
    target, drafter = request.getfixturevalue(pair_name)
    expected = tp_run.run(target, drafter, 1)
    out = tmp_path / "tp2.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent)}
    cmd = [mpiexec(), "-n", "2", sys.executable, str(HERE / "tp_run.py"), str(target), str(drafter), str(out), "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["dflash"] == expected


@pytest.mark.mpi
def test_generate_both_modes_under_mpiexec(tmp_path, smollm2_dir):
    """`mpirun -n N dflash-generate --mode both`: AR, then DFlash, in one set of ranks. The second mode's engine
    joins the group the first one kept (MPI's rendezvous is once per process); it exited 1 after the AR half."""
    from tests.tiny import write_tiny_pair_with_tokenizer

    target, drafter = write_tiny_pair_with_tokenizer(tmp_path / "pair", smollm2_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent)}
    cmd = [mpiexec(), "-n", "2", sys.executable, "-c", "import sys; from trtllm_dflash.cli import generate_main; "
           "sys.exit(generate_main())", "--target", str(target), "--drafter", str(drafter), "--tp_size", "2",
           "--mode", "both", "--max_new_tokens", "8", "--prompt", "Hello", "--max_seq_len", "256"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DFlash tokens identical to autoregressive: yes" in proc.stdout and "summary:" in proc.stdout
    # neither --block_size nor --draft_policy was given: the reason is tensor parallelism
    assert "(fixed: tensor parallelism: adaptive measures step costs on rank 0 alone)" in proc.stderr


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
