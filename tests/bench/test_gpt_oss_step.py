# SPDX-License-Identifier: Apache-2.0
"""gpt_oss_step's tile sweep plan and its summary, and the drafter timed apart in the CPU smoke (the timing itself
needs CUDA: tests/gpu and the GPU run)."""
from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():
    # before runtime.mxfp4_moe is first imported (here, at collection): triton.jit picks the interpreter when it
    # decorates the kernels, and the kernel tests that run later in this process need it
    os.environ["TRITON_INTERPRET"] = "1"

from trtllm_dflash.bench import gpt_oss_step  # noqa: E402
from trtllm_dflash.bench.gpt_oss_step import (  # noqa: E402
    GEMV_SPLITS, ONE_TOKEN_GEMV, SWEEP_SHAPES, best_variants, sweep_tiles)
from trtllm_dflash.runtime import mxfp4_moe  # noqa: E402


def test_a_dflash_block_is_timed_under_every_variant_and_a_prefill_under_mma_only():
    """120b's shapes: 128 experts, top 4. A block of 10 goes to gemv by default_tiles' rule; the sweep times tc
    and mma beside it (tc and gemv can take up to GEMV_BLOCK_M tokens), one tile per shape, each a valid
    TileConfig; tc's first shape also with the automatic K split, gemv's first two with mma_from 2 (the hybrid),
    its BLOCK_K 128 shapes also split GEMV_SPLITS ways; one token's default gemv tile also under ONE_TOKEN_GEMV's
    changes."""
    for tokens, want in ((1, {"tc", "gemv", "mma"}), (10, {"tc", "gemv", "mma"}),
                         (mxfp4_moe.GEMV_BLOCK_M, {"tc", "gemv", "mma"}), (640, {"mma"})):
        tiles = sweep_tiles(tokens, 4, 128)
        base = mxfp4_moe.default_tiles(tokens, 4, 128)
        # one token: gemv's default tile also under each single change of ONE_TOKEN_GEMV
        one = [dataclasses.replace(base, **c) for c in ONE_TOKEN_GEMV] if tokens == 1 else []
        assert all(t in tiles for t in one)
        assert all(t.num_stages == 4 for t in tiles if t not in one)
        assert all(t.down_block_k is None for t in tiles if t.variant != "gemv")
        tiles = [t for t in tiles if t not in one]
        assert {t.variant for t in tiles} == want, tokens
        assert len(set(tiles)) == len(tiles)
        for t in tiles:
            t.check()
            assert t.variant not in ("gemv", "tc") or t.block_m >= tokens
            assert t.variant != "gemv" or t.split_k == 1 or (t.split_k in GEMV_SPLITS and t.block_k == 128)
        for v in want:
            shapes = [(t.block_n, t.block_k, t.num_warps) for t in tiles
                      if t.variant == v and t.split_k != None and not t.mma_from]  # noqa: E711
            assert sorted(set(shapes)) == sorted(SWEEP_SHAPES[v]) or v == "mma"
        if "gemv" in want:
            split = sorted((t.block_n, t.split_k) for t in tiles if t.variant == "gemv" and t.split_k > 1)
            assert split == sorted((bn, s) for bn, bk, _ in SWEEP_SHAPES["gemv"] if bk == 128 for s in GEMV_SPLITS)
        if "tc" in want:
            assert [t.split_k for t in tiles if t.variant == "tc"].count(None) == 1
            assert [(t.block_n, t.block_k) for t in tiles if t.mma_from == 2] == [s[:2] for s in SWEEP_SHAPES["gemv"][:2]]
    default = mxfp4_moe.default_tiles(10, 4, 128)
    assert (default.variant, default.mma_from) == ("gemv", 0) and any(t == default for t in sweep_tiles(10, 4, 128))


def test_the_decode_switch_doubles_mma_tiles_only():
    tiles = sweep_tiles(10, 4, 128, sweep_decode=True)
    assert len([t for t in tiles if t.variant == "mma"]) == 2 * len(SWEEP_SHAPES["mma"])
    gemv = [t for t in tiles if t.variant == "gemv" and not t.mma_from and t.split_k == 1]
    assert len(gemv) == len(SWEEP_SHAPES["gemv"])


def test_best_variants_keeps_each_variants_fastest_tile_per_routing_and_size():
    def row(routing, tokens, variant, bn, ms, **extra):
        return {"routing": routing, "tokens": tokens, "distinct_experts": 34, "variant": variant, "block_m": 16,
                "block_n": bn, "block_k": 128, "num_warps": 4, "dot_scaled": True, "ms": ms, **extra}
    rows = [row("uniform", 10, "mma", 64, 0.60), row("uniform", 10, "mma", 128, 0.76),
            row("uniform", 10, "gemv", 32, 0.45), row("uniform", 10, "gemv", 64, 0.50),
            row("skewed", 10, "mma", 64, 0.30), row("skewed", 10, "gemv", 32, 0.40),
            row("skewed", 10, "tc", 64, 0.20), row("skewed", 10, "tc", 32, 0.24),
            row("skewed", 10, "gemv", 32, 0.25, mma_from=2),
            {"routing": "skewed", "tokens": 10, "variant": "gemv", "error": "out of resources"},
            row("uniform", 640, "mma", 64, 2.8)]
    best = {(b["routing"], b["tokens"]): b for b in best_variants(rows)}
    assert best[("uniform", 10)]["gemv_ms"] == 0.45 and best[("uniform", 10)]["mma_ms"] == 0.60
    assert best[("uniform", 10)]["gemv_over_mma"] == 0.75 and best[("uniform", 10)]["gemv_tiles"]["block_n"] == 32
    assert best[("skewed", 10)]["gemv_over_mma"] == 1.333
    assert best[("skewed", 10)]["tc_ms"] == 0.20 and best[("skewed", 10)]["tc_over_gemv"] == 0.5
    assert best[("skewed", 10)]["tc_over_mma"] == 0.667 and "tc_ms" not in best[("uniform", 10)]
    assert best[("skewed", 10)]["gemv_ms"] == 0.40 and best[("skewed", 10)]["gemv_mma2_over_gemv"] == 0.625
    assert "gemv_over_mma" not in best[("uniform", 640)] and best[("uniform", 640)]["mma_ms"] == 2.8


def test_the_verify_non_expert_work_is_the_dflash_steps_minus_its_experts_and_the_drafter():
    """Deliverable 2 of the gpt-oss issue, from the profiles and the drafter timed alone: DFlash non-expert 5.0 ms,
    drafter 1.5 -> verify 3.5 against AR's 2.0: 1.75x."""
    record = {"experts": "triton", "drafter_b1_ms": 1.5,
              "profile_triton_ar_b1": {"device_ms_per_step": 3.5, "expert_kernels_ms": 1.5},
              "profile_triton_dflash_b1": {"device_ms_per_step": 15.0, "expert_kernels_ms": 10.0},
              "profile_triton_dflash_b1_skewed": {"device_ms_per_step": 9.0, "expert_kernels_ms": 4.0}}
    assert gpt_oss_step.non_expert_split(record, "uniform") == {
        "ar_b1_non_expert_ms": 2.0, "dflash_b1_non_expert_ms": 5.0, "dflash_b1_drafter_ms": 1.5,
        "dflash_b1_verify_non_expert_ms": 3.5, "verify_over_ar_non_expert_b1": 1.75}
    # skewed has no AR profile here: no ratio, never a made-up one
    assert gpt_oss_step.non_expert_split(record, "skewed") == {"dflash_b1_non_expert_ms": 5.0,
                                                               "dflash_b1_drafter_ms": 1.5}
    assert gpt_oss_step.non_expert_split({"experts": "triton"}, "uniform") == {}


def test_the_cpu_smoke_times_the_drafter_apart(tmp_path):
    import json
    out = tmp_path / "step.json"
    assert gpt_oss_step.main(["--tiny", "--device", "cpu", "--batch_sizes", "1", "--blocks", "10", "--iters", "1",
                              "--warmup", "0", "--profile", "--out", str(out)]) == 0
    s = json.loads(out.read_text())["summary"]
    assert s["dflash_b1_drafter_ms"] > 0 and s["dflash_b1_verify_non_expert_ms"] == round(
        s["dflash_b1_non_expert_ms"] - s["dflash_b1_drafter_ms"], 4)
