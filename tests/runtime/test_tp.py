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
from tests.runtime.compare import job_failure
from trtllm_dflash.runtime import distributed
from trtllm_dflash.runtime.shard import shard_dim, slice_for_rank

HERE = Path(__file__).parent


def mpiexec() -> str:
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    assert found, "mpiexec not found: pip install 'trtllm-dflash[mpi]' (mpi4py + mpich)"
    return found


def test_the_steps_travel_over_the_host_group(monkeypatch):
    """Rank 0's SchedulerOutput goes over TPGroup.host (gloo: host memory and sockets), not the default group, whose
    NCCL broadcast of an object queues behind the step the GPU runs and makes the other ranks wait on their GPU."""
    seen = []
    monkeypatch.setattr(distributed.dist, "broadcast_object_list",
                        lambda box, src, group=None: seen.append((src, group)))
    host = object()
    distributed.TPGroup(0, 2, host=host).broadcast_object("step")
    assert seen == [(0, host)]
    assert distributed.TPGroup(0, 1).broadcast_object("step") == "step" and len(seen) == 1   # one process: no call


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
    assert proc.returncode == 0, job_failure(proc)
    # seen once in about 20 CI runs: mpiexec exited 0 and rank 0 wrote nothing; the ranks' output says why next time
    assert out.is_file(), (f"mpiexec exited 0 without {out.name}; the ranks' stdout:\n{proc.stdout[-3000:]}\n"
                           f"stderr:\n{proc.stderr[-3000:]}")
    assert json.loads(out.read_text())["dflash"] == expected


def _kernel_counts(tmp_path, pair, tp: int, settings: list[str]) -> tuple[dict, list[dict]]:
    """(TP 1's counts, every TP rank's) from tp_kernel_counts_run.py under a real mpiexec."""
    target, drafter = pair
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent), "TRITON_INTERPRET": "1"}
    cmd = [mpiexec(), "-n", str(tp), sys.executable, str(HERE / "tp_kernel_counts_run.py"), str(target), str(drafter),
           str(tmp_path), str(tp), ",".join(settings)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, job_failure(proc)
    return (json.loads((tmp_path / "tp1.json").read_text()),
            [json.loads((tmp_path / f"tp{tp}_rank{r}.json").read_text()) for r in range(tp)])


def kernel_count_differences(ref: dict, ranks: list[dict]) -> list[str]:
    """Where a TP rank's step differs from TP 1's plus the collectives: per decoder layer the same kernels and two
    all-reduces (after o_proj and after the MLP); outside the layers the same kernels and the vocab-parallel
    lm_head's all-gathers (drafts and verify) plus the broadcast of rank 0's drafts."""
    from tests.runtime.layer_counts import OUTSIDE, collectives_only, kernels_only
    problems = []
    for r, got in enumerate(ranks):
        for step, places in ref.items():
            mine = got.get(step, {})
            for where in sorted(set(places) | set(mine)):
                want = {"all_gather_last": 2, "broadcast": 1} if step == "dflash" else {"all_gather_last": 1}
                want = want if where == OUTSIDE else {"all_reduce": 2}
                a, b = places.get(where, {}), mine.get(where, {})
                if kernels_only(b) != kernels_only(a):
                    problems.append(f"rank {r} {step} {where}: kernels {kernels_only(b)} != TP 1's {kernels_only(a)}")
                if collectives_only(b) != want:
                    problems.append(f"rank {r} {step} {where}: collectives {collectives_only(b)} != {want}")
    return problems


@pytest.fixture(scope="module")
def tiny_gpt_oss_pair(tmp_path_factory):
    """A tiny MXFP4 gpt-oss target (its experts dequantised on the CPU) and its drafter."""
    from trtllm_dflash.testing import write_gpt_oss_drafter, write_tiny_gpt_oss
    root = Path(tmp_path_factory.mktemp("gpt_oss_tp_counts"))
    target = write_tiny_gpt_oss(root / "target", mxfp4=True, seed=1)
    return target, write_gpt_oss_drafter(target, root / "drafter")


@pytest.mark.mpi
@pytest.mark.slow   # ~45 s on 2 cores: two ranks run the Triton kernels in the interpreter
# gpt-oss adds the attention with sinks and the sliding window, its norms and the router's top-k kernel; its experts
# are dequantised on the CPU (the MXFP4 expert kernels run on CUDA only), counted as torch grouped GEMMs on both sides.
@pytest.mark.parametrize("pair_name, tp, torch_in_layer", [
    ("tiny_qwen3_pair", 2, set()),
    pytest.param("tiny_qwen3_pair", 4, set(), marks=pytest.mark.exhaustive),
    pytest.param("tiny_gpt_oss_pair", 2, {"torch:linear", "torch:grouped_mm"}, marks=pytest.mark.exhaustive)])
def test_tp_ranks_launch_the_kernels_of_tp1_plus_the_collectives(request, tmp_path, pair_name, tp, torch_in_layer):
    """One DFlash step and one AR step on the Triton kernels (interpreter): per decoder layer of target and drafter,
    every rank launches exactly TP 1's kernels (attention, rope + cache write, GEMMs, norms) plus two all-reduces;
    outside the layers (lm_head, sampling) TP 1's kernels plus the all-gathers and the drafts' broadcast; and every
    rank commits TP 1's tokens. At 4 ranks the KV heads are replicated (2 KV heads)."""
    from tests.runtime.layer_counts import kernels_only
    ref, ranks = _kernel_counts(tmp_path, request.getfixturevalue(pair_name), tp, ["triton"] * tp)
    # the sampling kernels run on every rank without a broadcast of rank 0's samples: each commits TP 1's tokens
    assert [r["tokens"] for r in ranks] == [ref["tokens"]] * tp and len(ref["tokens"]["dflash"][0][0]) > 1
    ref, ranks = ref["counts"], [r["counts"] for r in ranks]
    layers = sorted(w for w in ref["dflash"] if w.startswith(("target.", "drafter.")))
    assert layers == ["drafter.0", "drafter.1", "target.0", "target.1", "target.2", "target.3"]
    for step, places in ref.items():   # the reference itself is the kernel path: attention and sampling in Triton
        for where, counts in places.items():
            torch_ops = {k for k in kernels_only(counts) if k.startswith("torch:")}
            assert torch_ops <= (torch_in_layer if where in layers else set()), (step, where, counts)
            if where in layers:
                assert counts.get("_attend_kernel") == 1, (step, where, counts)
        assert places["step"]["_vocab_argmax"] == places["step"]["_finish"] == 1
    assert kernel_count_differences(ref, ranks) == []


@pytest.mark.mpi
@pytest.mark.exhaustive   # ~45 s: the comparison above can fail
def test_kernel_counts_catch_ranks_on_the_torch_path(tmp_path, tiny_qwen3_pair):
    """Ranks built on the torch path (attention, cuBLAS, sampling) fail the comparison, layer by layer."""
    ref, ranks = _kernel_counts(tmp_path, tiny_qwen3_pair, 2, ["torch", "torch"])
    problems = kernel_count_differences(ref["counts"], [r["counts"] for r in ranks])
    assert any("rank 1 dflash target.0: kernels" in p for p in problems), problems
    assert any("rank 0 ar step: kernels" in p for p in problems), problems


def test_kv_heads_are_replicated_when_ranks_outnumber_them():
    import torch

    from trtllm_dflash.checkpoints.validate import check_heads
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


# Rank 0 sends one step, then its process ends without a word; rank 1 waits in the host group for the next one.
_DIES = """
import os, sys, time, torch
from trtllm_dflash.runtime.distributed import init_tp
tp = init_tp(2, torch.device("cpu"))
if tp.rank == 0:
    tp.broadcast_object("step 1")
    time.sleep(0.5)
    os._exit(3)
assert tp.broadcast_object(None) == "step 1"
t0 = time.monotonic()
try:
    tp.broadcast_object(None)
except RuntimeError as err:
    print(f"waited {time.monotonic() - t0:.1f} s: {err}", flush=True)
    # leave as the package's ranks do (errors.leave_job, without its barrier: the peer is gone): the interpreter's
    # teardown can abort on gloo's threads ("terminate called without an active exception", exit -6)
    os._exit(0)
print("the wait ended without an error", file=sys.stderr, flush=True)
os._exit(1)
"""


def test_a_rank_that_dies_ends_the_others_wait_for_the_next_step(tmp_path):
    """The host group waits for an idle server's next step for days, so rank 0's death must end the wait itself:
    its closed sockets do, at once."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "dies.py"
    script.write_text(_DIES)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[0].returncode == 3, outs[0]
    assert procs[1].returncode == 0, outs[1]
    waited = float(outs[1][0].split()[1])
    assert waited < 30, outs[1][0]
