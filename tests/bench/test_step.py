# SPDX-License-Identifier: Apache-2.0
"""The step and load benchmarks build their models with the kernels their engines' RuntimeConfig chooses: the
Engine refuses a model built with other kernels, so a benchmark that built them with the defaults failed on the GPU
(where RuntimeConfig.kernels resolves to the Triton kernels) before timing anything."""
import pytest
import torch

from trtllm_dflash.bench import load, step
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import TORCH, Kernels

# batch-invariant bf16 on the CPU resolves to kernels other than the default ones, as the Triton kernels do on a GPU
CFG = dict(kernels="torch", batch_invariant=True, max_batch_size=2, max_seq_len=64)
KERNELS = Kernels.choose("torch", True, "cpu", torch.bfloat16)


def test_the_chosen_kernels_are_not_the_defaults():
    assert KERNELS != TORCH


def test_step_bench_pair_runs_under_its_engines(tmp_path, monkeypatch):
    # the step benchmark runs float32 on the CPU, where only the Triton kernels (in the interpreter) differ from
    # the defaults; no kernel runs here, the engine only compares what the models were built with
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = dict(CFG, kernels="triton", batch_invariant=False)
    kernels = Kernels.choose("triton", False, step.DEV, step.BF16)
    assert kernels != TORCH
    _, target, drafter, _, _ = step.build_pair("smollm2-135m", 64, tmp_path, smoke=True, kernels=kernels)
    Engine(target, drafter, None, RuntimeConfig(**cfg), TPGroup(), set())
    Engine(target, None, None, RuntimeConfig(block_size=1, **cfg), TPGroup(), set())


def test_load_bench_pair_runs_under_its_engines():
    tcfg, dcfg = load.pair_configs(smoke=True)
    target, drafter = load.build(tcfg, dcfg, 64, torch.device("cpu"), torch.bfloat16, KERNELS)
    Engine(target, drafter, None, RuntimeConfig(**CFG), TPGroup(), set())


def test_the_default_kernels_flag_is_a_setting_the_engine_resolves():
    # the flag's default once came from a deprecated field whose default is None: every run without the flag died
    # in Kernels.choose before timing anything
    args = step.parser().parse_args(["--out", "x.json"])
    assert args.kernels == RuntimeConfig.kernels
    Kernels.choose(args.kernels, True, "cpu", torch.bfloat16)
    assert step.parser().parse_args(["--out", "x", "--attention_kernel", "torch"]).kernels == "torch"


def test_idle_gaps_sum_the_idle_time_between_kernels_by_pair():
    """bench.step.idle_gaps on a made-up timeline: a kernel inside another's span leaves no gap, and each gap goes
    to the pair (the kernel whose end it follows, the kernel that ends it), per step, the largest first."""
    from types import SimpleNamespace as NS

    from trtllm_dflash.bench import step as S
    kind = NS(name="CUDA" if S.DEV.type == "cuda" else "CPU")

    def ev(name, start, end):
        return NS(name=name, device_type=kind, time_range=NS(start=start, end=end))
    timeline = [ev("gemm", 0, 10), ev("inner", 2, 5), ev("norm", 12, 13), ev("gemm", 13, 20),   # step 1
                ev("sample", 50, 52),                                                            # host late
                ev("gemm", 60, 70), ev("norm", 72, 73), ev("sample", 100, 101)]                  # step 2
    gaps = S.idle_gaps(NS(events=lambda: timeline), steps=2)
    # gemm -> sample 30 us once (20 -> 50), norm -> sample 27 (73 -> 100), sample -> gemm 8, gemm -> norm 2 + 2
    assert [(g["before"], g["after"], g["us_per_step"], g["count_per_step"]) for g in gaps] == [
        ("gemm", "sample", 15.0, 0.5), ("norm", "sample", 13.5, 0.5), ("sample", "gemm", 4.0, 0.5),
        ("gemm", "norm", 2.0, 1.0)]
    busy = 10 + 1 + 7 + 2 + 10 + 1 + 1   # the union of the kernels' spans over 0 .. 101 us
    assert sum(g["us_per_step"] for g in gaps) == (101 - busy) / 2
