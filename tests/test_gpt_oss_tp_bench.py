# SPDX-License-Identifier: Apache-2.0
"""trtllm_dflash/bench/gpt_oss_tp.py on the CPU under a real mpiexec (gloo): the same code the 2x H200 run takes, at the
tiny shapes: tokens at TP 2 (EP 2 and EP 1) == TP 1, every step row, the collectives one step issues, the
distinct experts each rank serves, and a results file that names what produced it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_tp import mpiexec

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.mpi
def test_gpt_oss_tp_benchmark_smoke_under_mpiexec(tmp_path):
    out = tmp_path / "tp.json"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "trtllm_dflash.bench.gpt_oss_tp", "--tiny", "--device", "cpu",
           "--iters", "2", "--warmup", "1", "--ctx", "32", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads(out.read_text())
    assert res["complete"] and res["tp_size"] == 2 and res["git_sha"] == res["provenance"]["git_sha"]
    assert {"tiny_target", "tiny_drafter"} <= set(res["provenance"]["checkpoints"])
    assert res["kernels"] == {"setting": "auto", "triton": False, "sampling": False}   # auto on the CPU: torch
    # RuntimeConfig's default (auto) runs NCCL / gloo where there is no peer memory to map
    assert res["allreduce_strategy"] == "auto" and res["allreduce_oneshot"] is False

    tokens = res["tokens"]["dequant"]
    assert tokens["tp1_same_on_every_rank"] and len(tokens["tp1"]) == 3
    for layout in ("tp2_ep2", "tp2_ep1"):
        assert tokens[layout]["equal_tp1"], (layout, tokens[layout]["first_difference"])

    rows = {(r["layout"], r["step"], r["batch"]): r for r in res["results"]}
    assert set(rows) == {(lay, s, n) for lay in ("tp2_ep2", "tp2_ep1", "tp1") for s in ("ar", "dflash") for n in (1, 64)}
    shapes = res["shapes"]
    target_layers, drafter_layers, local = shapes["target_layers"], shapes["drafter_layers"], shapes["experts"] // 2
    for (layout, step, n), r in rows.items():
        assert r["median_ms"] > 0 and len(r["median_ms_per_rank"]) == (1 if layout == "tp1" else 2)
        # one all-reduce after attention and one after the MoE/MLP per layer; lm_head all-gathers (drafts, verify)
        reduces = 0 if layout == "tp1" else 2 * target_layers + (2 * drafter_layers if step == "dflash" else 0)
        gathers = 0 if layout == "tp1" else 1 + (step == "dflash")
        assert (r["all_reduce"], r["all_gather"]) == (reduces, gathers), (layout, step, n)
        experts = r["distinct_experts_per_rank"]
        if layout == "tp2_ep2":  # each rank serves its half of the experts in each layer
            assert all(1 <= e <= target_layers * local for e in experts) and sum(experts) >= target_layers
        if layout == "tp2_ep1":  # both ranks hold a slice of every expert: they serve the same ones
            assert experts[0] == experts[1]
    s = res["summary"]
    for layout in ("tp2_ep2", "tp2_ep1"):
        assert s[layout]["tokens_equal_tp1"] is True
        assert {"ar_b1_ms", "dflash_b1_ms", "ar_b64_ms", "dflash_b64_ms", "ar_b1_roofline_fraction",
                "dflash_b64_speedup_vs_tp1"} <= set(s[layout])
        assert s[layout]["all_reduces_per_ar_step"] == 2 * target_layers


def test_gpt_oss_tp_benchmark_refuses_a_single_rank(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.gpt_oss_tp", "--tiny", "--device", "cpu",
                           "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0 and "mpirun -n 2" in proc.stderr and not (tmp_path / "x.json").exists()


def test_triton_kernels_experts_need_ep_size_1(monkeypatch, tmp_path):
    from trtllm_dflash.bench import gpt_oss_tp
    monkeypatch.setattr(gpt_oss_tp, "launcher_rank_and_size", lambda: (0, 2))
    with pytest.raises(SystemExit, match="^--experts triton_kernels runs whole experts on each rank"):
        gpt_oss_tp.main(["--tiny", "--device", "cpu", "--experts", "triton_kernels", "--ep_sizes", "2,1",
                         "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="^--experts triton_kernels runs on CUDA only"):
        gpt_oss_tp.main(["--tiny", "--device", "cpu", "--experts", "triton_kernels", "--ep_sizes", "1",
                         "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_step_layouts_are_built_with_the_engine_kernels(monkeypatch):
    """bench_config builds every layout's modules with the Kernels main() chose (the Triton decode kernels on CUDA by
    default), not the torch path a bare build() defaults to: a TP row and its TP 1 reference run the same kernels."""
    import argparse

    import torch

    from trtllm_dflash.bench import gpt_oss_tp
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.kernels import Kernels

    class Built(Exception):
        pass

    seen = []

    def build(*args, **kw):
        seen.append(kw.get("kernels", args[8] if len(args) > 8 else None))
        raise Built

    monkeypatch.setattr(gpt_oss_tp, "build", build)
    args = argparse.Namespace(target="gpt-oss-120b", tiny=True, ctx=32)
    chosen = Kernels(triton=True, sampling=True)
    for label, group, ep in (("tp2_ep2", TPGroup(0, 2), 2), ("tp1", TPGroup(), 1)):
        with pytest.raises(Built):
            gpt_oss_tp.bench_config(args, label, group, ep, torch.device("cpu"), torch.float32, "dequant", None,
                                    None, chosen)
    assert seen == [chosen, chosen]


def test_a_fused_all_reduce_counts_as_an_all_reduce_and_apart():
    """The one-shot all-reduce's add_rms_norm kernel is an all-reduce too: a step whose all-reduces are all fused
    must not read as a step with none (it did: the counter wrapped TPGroup.all_reduce alone)."""
    import torch

    from trtllm_dflash.bench.gpt_oss_tp import count_collectives
    from trtllm_dflash.runtime.distributed import TPGroup

    class Fused:   # stands for allreduce.OneShotAllReduce: only the method the fused path calls
        def add_rms_norm(self, x, residual, weight, eps, bias=None, weight_first=False):
            return x + residual, x + residual

    x, res = torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(2, 8, dtype=torch.bfloat16)
    tp = TPGroup(rank=0, size=2, small_all_reduce=Fused())
    counts = count_collectives(tp, lambda: [tp.small_all_reduce.add_rms_norm(x, res, None, 1e-6) for _ in range(3)])
    assert counts == {"all_reduce": 3, "all_reduce_bytes": 3 * 32, "all_gather": 0, "all_gather_bytes": 0,
                      "fused_add_norm": 3}
    assert not vars(tp.small_all_reduce) and {"all_reduce", "all_gather_last"}.isdisjoint(vars(tp))  # unwrapped
    assert count_collectives(TPGroup(small_all_reduce=Fused()), lambda: None)["all_reduce"] == 0   # TP 1
