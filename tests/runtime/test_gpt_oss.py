# SPDX-License-Identifier: Apache-2.0
"""gpt-oss in the torch runtime, against transformers' GptOssForCausalLM in float32: logits and features
(prefill, verify over the static cache, sequences longer than the sliding window), MXFP4 dequantisation
and MXFP4 checkpoints, gpt-oss drafter configs, lossless DFlash, TP=2 / EP=2 under mpiexec, the GPU
benchmark's CPU path, and the gpt-oss dflash-build presets checked field by field."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.runtime.compare import job_failure, rel
from tests.runtime.oracle import PeriodicOracle
from tests.runtime.test_tp import mpiexec
from trtllm_dflash.testing import VOCAB, write_gpt_oss_drafter, write_tiny_gpt_oss
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.model_config import target_config
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime import shard
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.weights import load_drafter, load_target
from trtllm_dflash.model_config import DrafterConfig
from trtllm_dflash.runtime.models.mxfp4 import dequantize

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
CPU, F32 = torch.device("cpu"), torch.float32


@pytest.fixture(scope="module")
def root():
    # Private, not under pytest's basetemp: concurrent pytest sessions prune old basetemp dirs, which once
    # deleted these checkpoints under the running mpiexec ranks.
    path = Path(tempfile.mkdtemp(prefix="test_gpt_oss-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(root):
    """{name: target dir}: bf16-layout and MXFP4 checkpoints (heads 4 / kv 2), and an 8/8-head MXFP4 one for TP
    whose intermediate 96 = 3 MXFP4 groups cannot split over 2 ranks (sliced after dequantising)."""
    return {"plain": write_tiny_gpt_oss(root / "plain"),
            "mxfp4": write_tiny_gpt_oss(root / "mxfp4", mxfp4=True, seed=1),
            "tp": write_tiny_gpt_oss(root / "tp", heads=8, kv_heads=8, intermediate=96, mxfp4=True, seed=2)}


@pytest.fixture(scope="module")
def drafters(tiny, root):
    return {name: write_gpt_oss_drafter(tiny[name], root / f"drafter_{name}") for name in ("plain", "tp")}


def _reference(path: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path if path.name == "hf" else path.parent / "hf", dtype=F32).eval()


# ---- MXFP4 ------------------------------------------------------------------------------------------
def test_mxfp4_dequant_equals_transformers_bit_for_bit():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 255, (3, 10, 4), dtype=torch.uint8, generator=g)  # every finite E8M0 scale
    for dtype in (torch.bfloat16, F32):
        ours = dequantize(blocks, scales, dtype)
        assert ours.shape == (3, 128, 10) and torch.equal(ours, convert_moe_packed_tensors(blocks, scales, dtype=dtype))


# ---- target vs transformers ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["plain", "mxfp4"])
def test_logits_and_features_match_transformers(tiny, name):
    ref = _reference(tiny[name])
    T = 40  # 5x the sliding window
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    capture = (0, 2, 1)  # not the last layer: transformers' last hidden_states entry is after the final norm
    ours = load_target(tiny[name], target_config(hf.read_config(tiny[name])), TPGroup(), CPU, F32, 128, capture)
    L, H, D = ours.kv_shape()
    cache = KVCache(L, 2, H, 128, D, F32, CPU)
    pos = torch.arange(T).expand(2, T)
    with torch.no_grad():
        h, feats = ours(ids, pos, cache, torch.tensor([0, 1]), None)  # prefill
    assert rel(ours.logits(h), out.logits) < 1e-4
    assert rel(feats, torch.cat([out.hidden_states[i + 1] for i in capture], -1)) < 1e-4  # z-lab: layer i output

    # verify path: prefill 25 tokens, then the next 15 as one block over the cache; kv_len 64 reaches past the
    # written rows (as a CUDA-graph bucket does): masks by absolute position must hide them
    cache.k.normal_(), cache.v.normal_()
    with torch.no_grad():
        ours(ids[:, :25], pos[:, :25], cache, torch.tensor([0, 1]), None)
        h2, _ = ours(ids[:, 25:], pos[:, 25:], cache, slice(0, 2), 64)
        steps = [ours(ids[:, t:t + 1], pos[:, t:t + 1], cache, slice(0, 2), t + 1)[0] for t in range(25, 30)]
    assert rel(ours.logits(h2), out.logits[:, 25:]) < 1e-4
    assert rel(ours.logits(torch.cat(steps, 1)), out.logits[:, 25:30]) < 1e-4  # one-token AR steps


def test_sinks_and_window_change_the_output(tiny):
    """Guards against a test that passes because sinks/windows do nothing at these sizes."""
    ours = load_target(tiny["plain"], target_config(hf.read_config(tiny["plain"])), TPGroup(), CPU, F32, 128)
    L, H, D = ours.kv_shape()
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(40)[None]

    def logits():
        with torch.no_grad():
            return ours.logits(ours(ids, pos, KVCache(L, 1, H, 128, D, F32, CPU), torch.tensor([0]), None)[0])

    base = logits()
    sinks = [layer.self_attn.sinks.data.clone() for layer in ours.layers]
    for layer in ours.layers:
        layer.self_attn.sinks.data.fill_(-1e4)
    assert rel(logits(), base) > 1e-2
    for layer, s in zip(ours.layers, sinks):
        layer.self_attn.sinks.data.copy_(s)
    ours.config = dataclasses.replace(ours.config, sliding_window=10_000)
    assert rel(logits(), base) > 1e-2


# ---- drafter ---------------------------------------------------------------------------------------
ZLAB_20B_DRAFTER = {  # z-lab/gpt-oss-20b-DFlash config.json as shipped (2026-04-20)
    "architectures": ["DFlashDraftModel"], "attention_bias": True, "attention_dropout": 0.0, "block_size": 8,
    "bos_token_id": 199998, "dflash_config": {"mask_token_id": 200000, "target_layer_ids": [1, 6, 11, 16, 21]},
    "dtype": "bfloat16", "eos_token_id": 200002, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 7680,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_hidden_layers": 8,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 150000, "vocab_size": 201088}


@pytest.mark.parametrize("block,ids", [(8, [1, 6, 11, 16, 21]), (10, [1, 9, 17, 25, 33])])
def test_zlab_gpt_oss_drafter_config_fields(block, ids):
    d = DrafterConfig.from_hf({**ZLAB_20B_DRAFTER, "block_size": block,
                               "dflash_config": {"mask_token_id": 200000, "target_layer_ids": ids}})
    assert (d.block_size, d.mask_token_id, d.target_layer_ids) == (block, 200000, tuple(ids))
    assert (d.num_layers, d.hidden_size, d.intermediate_size, d.num_heads, d.num_kv_heads, d.head_dim) == \
        (8, 2880, 7680, 64, 8, 64)
    assert d.attention_bias and d.layer_causal == (False,) * 8 and d.layer_window == (None,) * 8
    # what transformers' GptOssConfig (and so the reference and TensorRT-LLM) make of it: the target's YaRN
    assert d.rope == {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 4096, "rope_theta": 150000}


def test_gpt_oss_drafter_matches_dflash_reference(tiny, drafters):
    """q/k/v/o biases and YaRN against the z-lab reference package's drafter."""
    dflash_model = pytest.importorskip("dflash.model", reason="the `dflash` reference package is not installed")
    import transformers
    raw = json.loads((drafters["plain"] / "config.json").read_text())
    ours_cfg = DrafterConfig.from_hf(raw)
    ref_cfg = transformers.Qwen3Config(**{k: v for k, v in raw.items() if k not in ("model_type", "rope_theta")},
                                       rope_parameters=ours_cfg.rope)
    ref = dflash_model.DFlashDraftModel(ref_cfg).float().eval()
    ref.load_state_dict(load_file(str(drafters["plain"] / "model.safetensors")), strict=True)
    g = torch.Generator().manual_seed(3)
    ctx, B = 23, ours_cfg.block_size
    feats = torch.randn(1, ctx, 3 * 64, generator=g)
    noise = torch.randn(1, B, 64, generator=g)
    pos = torch.arange(ctx + B)[None]
    with torch.no_grad():
        want = ref(position_ids=pos, noise_embedding=noise, target_hidden=feats)
        m = load_drafter(drafters["plain"], DrafterConfig.from_hf(hf.read_config(drafters["plain"])), 64,
                         TPGroup(), CPU, F32, 256)
        L, H, D = m.kv_shape()
        cache = KVCache(L, 1, H, 256, D, F32, CPU)
        m.append_context(feats, pos[:, :ctx], cache, slice(0, 1))
        got = m(noise, pos[:, ctx:], torch.tensor([ctx]), cache, slice(0, 1), ctx + B)  # kv_len covers the block
    assert rel(got, want) < 1e-5


# ---- decoding --------------------------------------------------------------------------------------
def test_dflash_greedy_equals_ar_and_transformers(tiny, drafters):
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(2, VOCAB - 2, (k,), generator=g).tolist() for k in (3, 17, 30)]  # 30 > the window
    cfg, sp = dict(max_seq_len=128, max_batch_size=2), SamplingParams(max_new_tokens=20, ignore_eos=True)
    ar = Engine.from_dirs(tiny["plain"], None, RuntimeConfig(block_size=1, **cfg))
    df = Engine.from_dirs(tiny["plain"], drafters["plain"], RuntimeConfig(**cfg))
    out_ar, out_df = ar.generate(ps, sp), df.generate(ps, sp)
    hf = _reference(tiny["plain"])
    for p, a, d in zip(ps, out_ar, out_df):
        # greedy = every output token is transformers' argmax given the prefix: one teacher-forced forward
        with torch.no_grad():
            want = hf(torch.tensor([p + a.output_ids[:-1]])).logits[0, len(p) - 1:].argmax(-1)
        assert a.output_ids == want.tolist()
        assert d.output_ids == a.output_ids

    # multi-token acceptance, rejection mid-block and overwritten rejected rows, across the sliding window
    PeriodicOracle.truth = {tuple(p): r.output_ids for p, r in zip(ps, out_ar)}
    oracle = PeriodicOracle.from_dirs(tiny["plain"], drafters["plain"], RuntimeConfig(**cfg))
    for p, r in zip(ps, oracle.generate(ps, sp)):
        assert r.output_ids == PeriodicOracle.truth[tuple(p)] and max(r.stats.acceptance_lengths) == 5


def test_an_mxfp4_scale_beyond_what_the_kernels_decode_is_refused_on_load(tiny):
    """E8M0 scale bytes above models/mxfp4.MAX_SCALE (2^65; 255 is E8M0's NaN), kept packed for the MXFP4 kernels,
    are a corrupt checkpoint: one line naming the tensor, before any weight reaches a kernel."""
    from trtllm_dflash.errors import DFlashError
    from trtllm_dflash.runtime.distributed import TPGroup
    from trtllm_dflash.runtime.models import gpt_oss, mxfp4, target_family
    cfg = target_config(json.loads((tiny["mxfp4"] / "config.json").read_text()))
    with torch.device("meta"):   # the experts kept packed, as on a GPU (the check runs before any kernel)
        model = target_family(cfg).build(cfg, TPGroup(0, 1), 64, (), device=torch.device("cuda"), mxfp4_moe="triton")
    assert type(model.layers[0].mlp.experts).__name__ == "Mxfp4Experts"
    sd = load_file(str(tiny["mxfp4"] / "model.safetensors"))
    name = next(n for n in sd if n.endswith("down_proj_scales"))
    sd[name][0, 0, 0] = mxfp4.MAX_SCALE + 1
    with pytest.raises(DFlashError, match="down_proj_scales.*above 192"):
        gpt_oss.checkpoint_to_module(dict(sd), model, "cpu", torch.float32)
    sd[name][0, 0, 0] = mxfp4.MAX_SCALE
    gpt_oss.checkpoint_to_module(dict(sd), model, "cpu", torch.float32)   # the largest decoded scale loads


# ---- parallelism -----------------------------------------------------------------------------------
def test_shard_rules_for_gpt_oss_tensors():
    assert shard.shard_dim("model.layers.0.self_attn.sinks") == 0
    assert shard.shard_dim("model.layers.0.self_attn.o_proj.bias") is None  # row-parallel bias: added once
    assert shard.shard_dim("model.layers.0.mlp.router.weight") is None
    assert shard.shard_dim("model.layers.0.mlp.experts.down_proj_blocks") == "experts"
    assert shard.expert_layout(8, 5, 4) == (1, 2, 1)  # ep rank fastest, as TensorRT-LLM's Mapping
    gate_up = torch.arange(4 * 3 * 8).view(4, 3, 8)  # [E, H, 2I], gate/up interleaved
    parts = {(r, ep): shard.slice_for_rank("layers.0.mlp.experts.gate_up_proj", gate_up, 2, r, ep_size=ep)
             for r in range(2) for ep in (1, 2)}
    assert torch.equal(torch.cat([parts[0, 1], parts[1, 1]], 2), gate_up)  # tp 2: intermediate halves, pairs kept
    assert torch.equal(torch.cat([parts[0, 2], parts[1, 2]], 0), gate_up)  # ep 2: expert halves
    groups = torch.zeros(4, 5, 3, 16, dtype=torch.uint8)  # 3 MXFP4 groups cannot split in 2: read whole
    assert shard.slice_for_rank("m.layers.0.mlp.experts.down_proj_blocks", groups, 2, 1).shape == (4, 5, 3, 16)


@pytest.mark.mpi
def test_tp2_and_ep2_under_mpiexec_equal_tp1(tiny, drafters, tmp_path):
    from tests.runtime import gpt_oss_tp_run
    target, drafter = tiny["tp"], drafters["tp"]
    expected = gpt_oss_tp_run.run(target, drafter, 1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for ep in (1, 2):
        out = tmp_path / f"tp2_ep{ep}.json"
        cmd = [mpiexec(), "-n", "2", sys.executable, str(HERE / "gpt_oss_tp_run.py"), str(target), str(drafter),
               str(out), "2", str(ep)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, job_failure(proc)
        assert json.loads(out.read_text())["tokens"] == expected, f"tp 2, ep {ep}"


@pytest.mark.mpi
def test_tp4_over_2_kv_heads_replicates_them_and_equals_tp1(tiny, drafters, tmp_path):
    """4 ranks, 4 query heads (one each, with its sink), 2 KV heads: each rank holds a replica of its group's KV
    head (gpt-oss-120b has 8 KV heads, so TP 16 lays out the same way); tokens are TP 1's."""
    from tests.runtime import gpt_oss_tp_run
    target, drafter = tiny["plain"], drafters["plain"]
    expected = gpt_oss_tp_run.run(target, drafter, 1)
    out = tmp_path / "tp4.json"
    cmd = [mpiexec(), "-n", "4", sys.executable, str(HERE / "gpt_oss_tp_run.py"), str(target), str(drafter),
           str(out), "4", "1"]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, job_failure(proc)
    assert json.loads(out.read_text())["tokens"] == expected


# ---- GPU benchmark script, CPU path ----------------------------------------------------------------
def test_gpu_benchmark_runs_on_cpu_with_a_tiny_config(tmp_path):
    """The benchmark's smoke setting end to end: both routings, the profile, every summary field the goals read
    (numbers here, CPU meaningless but computed the GPU run's way)."""
    from trtllm_dflash.bench.gpt_oss_step import GOAL_KEYS
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.bench.gpt_oss_step", "--tiny", "--device", "cpu",
                           "--batch_sizes", "1,2", "--iters", "2", "--warmup", "1", "--ctx", "32", "--profile",
                           "--routing", "uniform,skewed", "--routing_zipf", "1.5", "--routing_reuse", "0.7",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert {"device", "provenance", "shapes", "results"} <= set(res) and res["experts"] == "dequant"
    assert {"command", "git", "versions"} <= set(res["provenance"])
    assert res["routing"]["skewed"] == {"name": "skewed", "zipf": 1.5, "reuse": 0.7, "seed": 0}
    kinds = {(r["routing"], r["step"], r["block_size"], r["batch"]) for r in res["results"]}
    assert kinds == {(g, s, b, n) for g in ("uniform", "skewed") for s, b in (("ar", 1), ("dflash", 8), ("dflash", 10))
                     for n in (1, 2)}
    assert all(r["median_ms"] > 0 for r in res["results"])
    # the experts' input hooks saw the target's tokens: 1..min(E, tokens x top-k) distinct experts per layer, 4 layers
    assert all(4 <= r["distinct_experts"] <= 4 * min(4, r["batch"] * r["block_size"] * 2) for r in res["results"])
    s = res["summary"]
    assert s["gpu"] == res["device"] and s["routing"] == "uniform" and s["mode"] == "eager"
    for key in [*GOAL_KEYS, *(k + "_skewed" for k in GOAL_KEYS), "ar_b1_kernels_per_step", "dflash_b1_kernels_per_step",
                "ar_b1_kernels_per_step_skewed", "dflash_b1_kernels_per_step_skewed"]:
        assert isinstance(s[key], (int, float)) and s[key] > 0, key
    for routing in ("uniform", "skewed"):
        per = s["routings"][routing]
        assert per["params"] == res["routing"][routing]
        for n in (1, 2):
            b = per[f"b{n}"]
            assert b["break_even_tokens"] == pytest.approx(b["dflash_ms"] / b["ar_ms"], rel=2e-3)
            assert b["ar_distinct_experts"] <= b["dflash_distinct_experts"]
    assert s["break_even_tokens_b1_skewed"] == s["routings"]["skewed"]["break_even_tokens_b1"]


# ---- dflash-build presets --------------------------------------------------------------------------
# NVIDIA's gpt-oss-120b H200 configs (NVIDIA/TensorRT-LLM examples/configs/database/openai/gpt-oss-120b/H200) with
# the DFlash fields of TensorRT-LLM 1.4.0rc1's DFlashDecodingConfig, and the GPU-dependent values per preset.
# Differences on purpose: trust_remote_code is false (gpt-oss is native in transformers and TensorRT-LLM and
# has no auto_map), dtype auto is explicit, speculative_model is the deployment's own drafter/ folder.
RESEARCH_120B = {
    "tensor_parallel_size": 8, "moe_expert_parallel_size": 8, "enable_attention_dp": False, "max_batch_size": 64,
    "max_num_tokens": 16384, "max_seq_len": 32768, "trust_remote_code": False, "attn_backend": "TRTLLM",
    "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False},
    "cuda_graph_config": {"enable_padding": True, "max_batch_size": 64}, "moe_config": {"backend": "TRITON"},
    "dtype": "auto",
    "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "target_layer_ids": [1, 9, 17, 25, 33],
                           "mask_token_id": 200000, "attention_backend": "FA4"}}
PRESETS = {
    "gpt-oss-120b_h200_tp8": {**RESEARCH_120B, "speculative_config": {**RESEARCH_120B["speculative_config"],
                                                                       "draft_len_schedule": {1: 7, 15: 7, 31: 5, 64: 3}}},
    # Blackwell: TRTLLM MoE and drafter attention; ep 4 = NVIDIA's B300 spec-dec config (tp8 ep4)
    "gpt-oss-120b_b300_tp8": {**RESEARCH_120B, "moe_expert_parallel_size": 4, "moe_config": {"backend": "TRTLLM"},
                              "speculative_config": {**RESEARCH_120B["speculative_config"], "attention_backend": "TRTLLM"}},
    # NVIDIA's B200 gpt-oss-120b spec-dec config itself (the B300 preset follows it)
    "gpt-oss-120b_b200_tp8": {**RESEARCH_120B, "moe_expert_parallel_size": 4, "moe_config": {"backend": "TRTLLM"},
                              "speculative_config": {**RESEARCH_120B["speculative_config"], "attention_backend": "TRTLLM"}},
    # one H100: block 8 drafter (max_draft_len 7 = the most), target_layer_ids of the 24-layer 20b
    "gpt-oss-20b_h100_tp1": {**RESEARCH_120B, "tensor_parallel_size": 1, "moe_expert_parallel_size": 1,
                             "max_batch_size": 32, "max_num_tokens": 8192, "max_seq_len": 16384,
                             "cuda_graph_config": {"enable_padding": True, "max_batch_size": 32},
                             "speculative_config": {**RESEARCH_120B["speculative_config"],
                                                    "target_layer_ids": [1, 6, 11, 16, 21]}},
}


@pytest.mark.parametrize("preset", PRESETS)
def test_gpt_oss_presets_field_by_field(preset, tmp_path, monkeypatch):
    from trtllm_dflash import build
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg, dry_run, _ = build.config_from_args(["--config", str(ROOT / "build_configs" / f"{preset}.yaml"),
                                              "--out", str(tmp_path / "d"), "--dry_run"])
    opts = yaml.safe_load(build.trtllm.dump_options(build.make_plan(cfg, dry_run=dry_run).options))
    assert opts["speculative_config"].pop("speculative_model") == str(tmp_path / "d" / "drafter")
    want = PRESETS[preset]
    assert set(opts) == set(want)
    for key in want:
        assert opts[key] == want[key], key
