# SPDX-License-Identifier: Apache-2.0
"""Step latency of the torch runtime on gpt-oss shapes with random weights (one GPU, no checkpoint).

Times the two steps the engine runs (engine.runner.step_tensors), over a static KV cache holding ``--ctx`` tokens
per request, CUDA graphs on (eager rows too with ``--eager``):
  ar      block 1: target forward of 1 token per request + lm_head + argmax;
  dflash  block B (8 = the 20b drafter, 10 = the 120b drafter): drafter pass over [last, mask x (B-1)] + lm_head
          argmax (B-1 drafts), target verify of B tokens + lm_head, acceptance, context K/V of the block.
Weights are random, so acceptance means nothing here: the JSON gives per-step latency and, per batch,
``break_even_tokens`` = dflash_ms / ar_ms, the mean tokens a DFlash step must commit to beat AR decoding.

Experts (``--experts``): "triton" keeps them MXFP4 (random blocks/scales made on the GPU) and runs the fused
kernels of runtime/mxfp4_moe.py; "dequant" is the bf16 path. ``--compare_dequant`` re-times every row with
the same experts dequantised to bf16 (fits for gpt-oss-20b on 80 GB, not for 120b: ``--compare_layers`` then
times one MoE layer both ways). Per row: the roofline = bytes that must cross HBM in that step (non-expert
weights incl. lm_head, the distinct experts the step's tokens routed to, KV read) over the copy bandwidth
measured in the same run, and the distinct experts touched.

Routing (``--routing uniform,skewed``): the experts get the ids of a stated routing trace (bench/routing_trace.py)
in place of the random router's, each routing timed in full: uniform is near the worst case for the distinct
experts a block touches; skewed draws experts from a per-layer Zipf popularity (``--routing_zipf``) and lets each
top-k slot of a block position repeat the previous position's expert (``--routing_reuse``). The summary carries
the uniform numbers under the goals' names and the skewed ones with a ``_skewed`` suffix.

``--compare flashinfer`` times layer 0's experts on flashinfer-python's fused MoE (MXFP4 weights x bf16, Hopper;
bench/flashinfer_moe.py) next to ours, ``--compare triton_kernels`` on the Triton MoE kernels vLLM runs gpt-oss on
(bench/triton_kernels_moe.py); same bytes and routing traces, at every row's shape (a missing library stops the
run before anything is built).

Shapes: the public openai/gpt-oss-20b / -120b configs (hidden 2880, 64/8 heads of 64, top-4, intermediate
2880, vocab 201088, window 128, YaRN; 24 layers x 32 experts / 36 layers x 128 experts) and the z-lab
DFlash drafters (8 layers, 7680 MLP, q/k/v/o biases; block 8 for 20b, 10 for 120b).

  python -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-20b --blocks 8 --compare_dequant --profile    # H100
  python -m trtllm_dflash.bench.gpt_oss_step --target gpt-oss-120b --blocks 10 --compare_layers 1 --profile # H200
  python -m trtllm_dflash.bench.gpt_oss_step --tiny --device cpu --routing uniform,skewed --profile  # CPU smoke
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch


from trtllm_dflash.bench import flashinfer_moe
from trtllm_dflash.bench import step as step_bench
from trtllm_dflash.bench.routing_trace import Routing, TraceRouter
from trtllm_dflash.bench.step import ceilings, graphed

from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.models.dflash import DFlashDrafter, DrafterConfig
from trtllm_dflash.runtime import triton_kernels_moe
from trtllm_dflash.runtime.models import gpt_oss
from trtllm_dflash.runtime.models.gpt_oss import GptOssConfig, GptOssTarget, _grouped_mm
from trtllm_dflash.runtime.models.layers import Rotary
from trtllm_dflash.runtime.kernels import TORCH, Kernels
from trtllm_dflash.runtime.sampling import accept

GPT_OSS_20B = {  # https://huggingface.co/openai/gpt-oss-20b config.json (shape fields)
    "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
    "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128, "max_position_embeddings": 131072,
    "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "truncate": False, "original_max_position_embeddings": 4096},
    "attention_bias": True, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0}
GPT_OSS_20B_DRAFTER = {  # z-lab/gpt-oss-20b-DFlash config.json (block_size raised to 10 so one drafter runs both)
    "architectures": ["DFlashDraftModel"], "model_type": "gpt_oss", "attention_bias": True, "block_size": 10,
    "dflash_config": {"mask_token_id": 200000, "target_layer_ids": [1, 6, 11, 16, 21]}, "head_dim": 64,
    "hidden_size": 2880, "intermediate_size": 7680, "max_position_embeddings": 131072, "num_attention_heads": 64,
    "num_hidden_layers": 8, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 150000, "vocab_size": 201088}
GPT_OSS_120B = {**GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128}  # openai/gpt-oss-120b config.json
GPT_OSS_120B_DRAFTER = {**GPT_OSS_20B_DRAFTER,  # z-lab/gpt-oss-120b-DFlash: 8 layers, block 10
                        "dflash_config": {"mask_token_id": 200000, "target_layer_ids": [1, 9, 17, 25, 33]}}
TARGETS = {"gpt-oss-20b": (GPT_OSS_20B, GPT_OSS_20B_DRAFTER), "gpt-oss-120b": (GPT_OSS_120B, GPT_OSS_120B_DRAFTER)}
MXFP4 = {"quantization_config": {"quant_method": "mxfp4"}}
TINY = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 96, "sliding_window": 8}
TINY_DRAFTER = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 96,
                "dflash_config": {"mask_token_id": 95, "target_layer_ids": [0, 2, 3]}}


def random_weights(model: torch.nn.Module, device, dtype, seed: int, full: torch.nn.Module | None = None,
                   rank: int = 0) -> torch.nn.Module:
    """Meta-device module -> random weights allocated once, directly in ``dtype`` on ``device``; packed MXFP4
    experts get random E2M1 bytes and E8M0 scales 2^-8..2^-6 (weights of ~0.01-0.05, like the 0.02 normals).

    Each tensor has its own seed, from its name, so tensor-parallel ranks agree without talking: ``full`` is the
    same module at TP 1 (meta); a tensor whose shape differs from it is this rank's shard and is seeded with
    ``rank`` too (the ranks' shards together are one random full model), a replicated one is identical everywhere."""
    packed = {n for n, p in model.named_parameters() if p.dtype == torch.uint8}
    full_shapes = {n: p.shape for n, p in (full if full is not None else model).named_parameters()}
    model = model.to(dtype).to_empty(device=device)  # meta -> meta cast is free (and leaves uint8 alone)
    with torch.no_grad():
        for name, p in model.named_parameters():
            part = rank if p.shape != full_shapes[name] else 0
            g = torch.Generator(device).manual_seed(zlib.crc32(f"{seed}:{name}:{part}".encode()))
            if name in packed:
                lo, hi = (119, 122) if name.endswith("_scales") else (0, 256)
                p.copy_(torch.randint(lo, hi, p.shape, dtype=torch.uint8, device=device, generator=g))
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


def build(target_name: str, tiny: bool, device, dtype, max_positions: int, backend: str, tp: TPGroup = TPGroup(),
          ep_size: int = 1, kernels: Kernels = TORCH):
    """Target and drafter of this rank (``tp``, ``ep_size``: its shards only) with random weights (random_weights),
    built with ``kernels`` (Kernels.choose)."""
    tc, dc = TARGETS[target_name]
    tcfg = GptOssConfig.from_hf({**tc, **TINY} if tiny else tc)
    dcfg = DrafterConfig.from_hf({**dc, **TINY_DRAFTER} if tiny else dc)

    def meta(group: TPGroup, ep: int):
        with torch.device("meta"):
            return (GptOssTarget(tcfg, group, max_positions, dcfg.target_layer_ids, ep_size=ep, moe_kernel=backend,
                                 kernels=kernels),
                    DFlashDrafter(dcfg, tcfg.hidden_size, group, max_positions, kernels))

    (target, drafter), (full_t, full_d) = meta(tp, ep_size), meta(TPGroup(), 1)
    target = random_weights(target, device, dtype, 0, full_t, tp.rank)
    gpt_oss.after_load(target)   # --experts triton_kernels: the library's copy of these weights
    drafter = random_weights(drafter, device, dtype, 1, full_d, tp.rank)
    # RoPE tables are buffers, not weights: rebuild them for real (to_empty left them uninitialised)
    target.rotary = Rotary(tcfg.rope, tcfg.head_dim, max_positions, tcfg.max_position_embeddings).to(device)
    drafter.rotary = Rotary(dcfg.rope, dcfg.head_dim, max_positions, dcfg.max_position_embeddings).to(device)
    return target.eval(), drafter.eval()


def nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def expert_bytes(experts) -> int:
    """HBM bytes of one expert of this module (packed blocks + scales + biases, or bf16 weights + biases)."""
    return nbytes(experts.parameters()) // experts.num_local


class ByteModel:
    """Bytes that must cross this rank's HBM in one step: every non-expert weight (its shard) the step uses once
    (lm_head twice in a DFlash step: drafts and verify), the distinct experts of this rank its tokens routed to
    (their shards), and the KV (its heads) it reads."""

    def __init__(self, target, drafter, ctx: int):
        self.target, self.drafter, self.ctx = target, drafter, ctx
        dense = [p for n, p in target.named_parameters() if ".experts." not in n and not n.startswith("embed_tokens")]
        self.dense = nbytes(dense)
        self.lm_head = nbytes([target.lm_head.weight])
        self.drafter_bytes = nbytes(drafter.parameters())
        _, H, D = target.kv_shape()  # this rank's KV heads
        self.kv_token = 2 * H * D * target.lm_head.weight.element_size()
        L, H, D = drafter.kv_shape()
        self.drafter_kv_token = 2 * L * H * D * target.lm_head.weight.element_size()

    def step(self, n: int, B: int, distinct_experts: int) -> int:
        c, kv_len = self.target.config, self.ctx + B
        kv = sum(min(kv_len, c.sliding_window) if t == "sliding_attention" else kv_len for t in c.layer_types)
        b = self.dense + distinct_experts * expert_bytes(self.target.layers[0].mlp.experts) + n * kv * self.kv_token
        if B > 1:
            b += self.drafter_bytes + self.lm_head + n * kv_len * self.drafter_kv_token
        return b


def distinct_experts(steps, n: int, B: int) -> int:
    """Sum over layers of the distinct experts of this rank (all of them at TP 1) that the step's target tokens
    were sent to (one eager step; hooks on the experts' input, so a routing trace's ids are what is counted)."""
    seen = []

    def count(experts, args):
        ids = args[1].unique()
        seen.append(((ids >= experts.first) & (ids < experts.first + experts.num_local)).sum().item())

    hooks = [layer.mlp.experts.register_forward_pre_hook(count) for layer in steps.target.layers]
    try:
        steps.run(n, B)
    finally:
        for h in hooks:
            h.remove()
    return sum(seen)


class Steps:
    """The engine's device work for one step (engine.runner.step_tensors), at a fixed context length ``ctx``."""

    def __init__(self, target, drafter, max_batch: int, ctx: int, device, dtype):
        self.target, self.drafter, self.ctx, self.device = target, drafter, ctx, device
        L, H, D = target.kv_shape()
        self.cache = KVCache(L, max_batch, H, ctx + 16, D, dtype, device)
        L, H, D = drafter.kv_shape()
        self.draft_cache = KVCache(L, max_batch, H, ctx + 16, D, dtype, device)
        g = torch.Generator(device).manual_seed(2)
        self.last = torch.randint(0, target.config.vocab_size, (max_batch,), device=device, generator=g)
        self.start = torch.full((max_batch,), ctx, dtype=torch.long, device=device)
        self.mask_id = drafter.config.mask_token_id
        self.router: TraceRouter | None = None  # set: the experts get a routing trace's ids, not the router's

    @torch.inference_mode()
    def run(self, n: int, B: int) -> torch.Tensor:
        if self.router is not None:
            self.router.use(n, B)
        rows, start, last = slice(0, n), self.start[:n], self.last[:n]
        pos = start[:, None] + torch.arange(B, device=self.device)                       # [n, B]
        kv_len = self.ctx + B
        if B == 1:
            h, _ = self.target(last[:, None], pos, self.cache, rows, kv_len)
            return self.target.logits(h).argmax(-1)                                      # [n, 1]
        draft = self.draft(n, B, pos)                                                    # [n, B-1]
        h, feats = self.target(torch.cat([last[:, None], draft], 1), pos, self.cache, rows, kv_len)
        t = self.target.logits(h).argmax(-1)                                             # [n, B]
        a = accept(draft, t)                                                             # [n]
        self.drafter.append_context(feats, pos, self.draft_cache, rows)
        return t.gather(1, a[:, None])

    @torch.inference_mode()
    def draft(self, n: int, B: int, pos: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter's share of a DFlash step, also timed alone: its pass over [last, mask x (B-1)] and the
        drafts' lm_head argmax (its context write after the verify is not in it). ``pos``: run()'s positions."""
        rows, start, last = slice(0, n), self.start[:n], self.last[:n]
        if pos is None:
            pos = start[:, None] + torch.arange(B, device=self.device)                   # [n, B]
        ids = torch.cat([last[:, None], torch.full((n, B - 1), self.mask_id, device=self.device)], 1)
        hd = self.drafter(self.target.embed(ids), pos, start, self.draft_cache, rows, self.ctx + B)
        return self.target.logits(hd[:, 1:]).argmax(-1)                                  # [n, B-1]


def time_ms(fn, iters: int, warmup: int, cuda: bool) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if cuda:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            fn()
            t1.record()
            t1.synchronize()
            out.append(t0.elapsed_time(t1))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def check_grouped_mm(target, device) -> float:
    """The bf16 MoE's grouped GEMM against one matmul per expert, at real shapes (relative error)."""
    w = target.layers[0].mlp.experts.gate_up_proj                                       # [E, H, 2I]
    g = torch.Generator(device).manual_seed(3)
    counts = torch.randint(0, 9, (w.shape[0],), generator=g, device=device)
    offs = counts.cumsum(0).to(torch.int32)
    a = torch.randn(int(offs[-1]), w.shape[1], generator=g, device=device).to(w.dtype)
    got = _grouped_mm(a, w, offs).float()
    ref = torch.cat([a[lo:hi].float() @ w[e].float() for e, (lo, hi) in
                     enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
    return ((got - ref).norm() / ref.norm()).item()


def moe_inputs(target, N: int, device, seed: int = 4):
    c, g = target.config, torch.Generator(device).manual_seed(seed)
    x = (torch.randn(N, c.hidden_size, device=device, generator=g)).bfloat16()
    ids = torch.rand(N, c.num_experts, device=device, generator=g).topk(c.experts_per_token, -1).indices
    w = torch.softmax(torch.randn(N, c.experts_per_token, device=device, generator=g), -1)
    return x, ids, w


def check_kernel(target, device, sizes=(1, 40, 640)) -> dict:
    """Layer 0's MXFP4 kernels against its bf16-dequantised Experts at real shapes (norm-relative error)."""
    mx = target.layers[0].mlp.experts
    ref = mx.dequantized(torch.bfloat16)
    out = {}
    with torch.inference_mode():
        for N in sizes:
            x, ids, w = moe_inputs(target, N, device)
            a, b = mx(x, ids, w).double(), ref(x, ids, w).double()
            out[f"N{N}"] = round(((a - b).norm() / b.norm()).item(), 5)
    del ref
    return out


def moe_layer_times(target, device, token_counts, iters: int) -> list[dict]:
    """One MoE layer's experts, MXFP4 kernels vs the same experts dequantised to bf16, CUDA-graphed."""
    mx = target.layers[0].mlp.experts
    ref = mx.dequantized(torch.bfloat16)
    rows = []
    with torch.inference_mode():
        for N in token_counts:
            x, ids, w = moe_inputs(target, N, device)
            r = {"tokens": N, "distinct_experts": ids.unique().numel()}
            for name, mod in (("mxfp4_ms", mx), ("bf16_dequant_ms", ref)):
                r[name] = round(statistics.median(time_ms(graphed(lambda m=mod: m(x, ids, w)), iters, 3, True)), 4)
                torch.cuda.empty_cache()
            r["speedup"] = round(r["bf16_dequant_ms"] / r["mxfp4_ms"], 3)
            rows.append(r)
            print(f"moe layer N={N:4d}: mxfp4 {r['mxfp4_ms']:.4f} ms  bf16 {r['bf16_dequant_ms']:.4f} ms", flush=True)
    del ref
    torch.cuda.empty_cache()
    return rows


def moe_layer_vs_library(target, name: str, lib, routings, shapes, iters: int, ceil: dict | None) -> list[dict]:
    """Layer 0's experts on our MXFP4 kernels and on a library's MoE (LIBRARIES[name]: FlashInfer's fused MoE or
    the triton_kernels vLLM runs), the same MXFP4 bytes and each routing's trace for layer 0 at every (batch,
    block) shape, CUDA-graphed. Per row: both times, the bandwidth fraction each reaches on the bytes of the
    distinct experts (each its own bytes per expert), and the norm-relative difference of their outputs (both
    round to bf16: ~1e-2 when they agree, O(1) when not)."""
    mx = target.layers[0].mlp.experts
    try:
        theirs = library(name).experts(mx, lib)
    except Exception as err:  # noqa: BLE001  the library refusing our layout is a result; the step rows stay
        print(f"{name} setup failed: {err}", flush=True)
        return [{"error": f"setup: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"}]
    c, dev = target.config, mx.gate_up_proj_blocks.device
    bw, ours_bytes = (ceil or {}).get("copy_bw_bytes_per_s"), expert_bytes(mx)
    rows = []
    with torch.inference_mode():
        for routing in routings:
            for n, B in shapes:
                ids = routing.trace(1, n, B, c.num_experts, c.experts_per_token)[0].to(dev)
                x, _, w = moe_inputs(target, n * B, dev)
                r = {"routing": routing.name, "batch": n, "block_size": B, "tokens": n * B,
                     "distinct_experts": ids.unique().numel()}
                try:
                    ref = mx(x, ids, w).double()
                    r["rel_diff"] = round(((theirs(x, ids, w).double() - ref).norm() / ref.norm()).item(), 5)
                    for key, fn in (("ours_ms", mx), (f"{name}_ms", theirs)):
                        r[key] = round(statistics.median(time_ms(graphed(lambda f=fn: f(x, ids, w)), iters, 3, True)), 4)
                        torch.cuda.empty_cache()
                except Exception as err:  # noqa: BLE001  a row that fails is reported, never hidden
                    r["error"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
                    rows.append(r)
                    continue
                if bw:
                    for who, size in (("ours", ours_bytes), (name, theirs.bytes_per_expert)):
                        r[f"{who}_bandwidth_fraction"] = round(r["distinct_experts"] * size / (r[f"{who}_ms"] * 1e-3) / bw, 3)
                r[f"{name}_bytes_per_expert"], r["ours_bytes_per_expert"] = theirs.bytes_per_expert, ours_bytes
                r[f"{name}_over_ours"] = round(r[f"{name}_ms"] / r["ours_ms"], 3)
                rows.append(r)
                print(f"moe layer {routing.name:7s} n={n:3d} B={B:2d}: ours {r['ours_ms']:.4f} ms  {name} "
                      f"{r[f'{name}_ms']:.4f} ms  rel diff {r['rel_diff']:.2e}", flush=True)
    return rows


@dataclasses.dataclass(frozen=True)
class Library:
    """A library ``--compare`` times one MoE layer on: load() -> its handle (SystemExit or ValueError when it is
    missing), check_device(dev) (ValueError off its GPUs) and experts(our experts, handle) -> the callable."""
    load: object
    check_device: object
    experts: object


_TK = "--compare triton_kernels"
LIBRARIES = {"flashinfer": Library(flashinfer_moe.load, flashinfer_moe.check_device, flashinfer_moe.FlashInferExperts),
             **{name: Library(lambda: triton_kernels_moe.load(_TK), lambda dev: triton_kernels_moe.check_device(dev, _TK),
                              functools.partial(triton_kernels_moe.MatmulOgsExperts, strided=strided, field=_TK))
                for name, strided in (("triton_kernels", False), ("triton_kernels_strided", True))}}


def library(name: str) -> Library:
    """LIBRARIES[name], or for 'triton_kernels:SPEC' (also _strided) the library under the opt-flag constraints
    SPEC names (triton_kernels_moe.Flags.parse: 'fc2.block_k=256+scale_warps=4'); SystemExit when unknown."""
    base, colon, spec = name.partition(":")
    if base not in LIBRARIES or (colon and not base.startswith("triton_kernels")):
        raise SystemExit(f"--compare: unknown library {name!r}; choose from {', '.join(LIBRARIES)} (triton_kernels "
                         "and triton_kernels_strided take ':fc1.FLAG=N+fc2.FLAG=N+scale_warps=N')")
    if not colon:
        return LIBRARIES[base]
    try:
        flags = triton_kernels_moe.Flags.parse(spec)
    except ValueError as err:
        raise SystemExit(f"--compare {name}: {err}") from None
    return dataclasses.replace(LIBRARIES[base], experts=functools.partial(LIBRARIES[base].experts, flags=flags))


# tile shapes each variant is timed under: (block_n, block_k, num_warps)
SWEEP_SHAPES = {"mma": ((64, 128, 4), (128, 128, 8), (64, 256, 8), (128, 64, 4)),
                "gemv": ((32, 256, 4), (64, 128, 4), (32, 128, 4), (64, 256, 8)),
                "tc": ((64, 128, 4), (32, 128, 4), (64, 64, 4), (64, 256, 8))}
PAIR_VARIANTS = ("tc", "gemv")   # the variants that hold an expert's pairs in one row block (tokens <= GEMV_BLOCK_M)
# gemv's BLOCK_K 128 shapes also with K split 2 and 4 ways: on the decode GEMM, wider tiles split over K beat the
# unsplit narrow ones at gpt-oss's shapes (benchmarks/results/gemm_split_h200/); the one-token experts' 360
# programs on 132 SMs have the same imbalance
GEMV_SPLITS = (2, 4)
# one token (an AR step at batch 1): default_tiles' gemv tile with one launch parameter changed at a time, the down
# kernel's K step among them (in the step, gate_up and down preferred different K steps: mxfp4_moe.default_tiles)
ONE_TOKEN_GEMV = (dict(down_block_k=128), dict(down_block_k=512), dict(num_stages=2), dict(num_stages=3),
                  dict(num_stages=6), dict(num_warps=2), dict(num_warps=8), dict(block_n=16), dict(block_n=64))


def sweep_tiles(tokens: int, top_k: int, num_experts: int, sweep_decode: bool = False) -> list:
    """The TileConfigs tile_sweep times for a call of ``tokens``: default_tiles' variant under SWEEP_SHAPES, and
    where the pair-block variants can take the call (tokens <= GEMV_BLOCK_M) every one of tc / gemv / mma, so a
    DFlash block's size shows which variant should take it (default_tiles sends it to mma above GEMV_MAX_TOKENS).
    tc and gemv tiles run without a K split except tc's first shape, which is timed with the automatic split too,
    and gemv's BLOCK_K 128 shapes, also timed split GEMV_SPLITS ways; at one token, gemv's default tile also under
    each change of ONE_TOKEN_GEMV. The other variants take the block's K step for both kernels."""
    from trtllm_dflash.runtime import mxfp4_moe
    base = mxfp4_moe.default_tiles(tokens, top_k, num_experts)
    variants = [base.variant]
    if tokens <= mxfp4_moe.GEMV_BLOCK_M:
        variants += [v for v in (*PAIR_VARIANTS, "mma") if v != base.variant]
    out = []
    for variant in variants:
        pairs = variant in PAIR_VARIANTS
        t0 = base if variant == base.variant else dataclasses.replace(
            base, variant=variant, block_m=mxfp4_moe.GEMV_BLOCK_M if pairs else 16, down_block_k=None)
        t0 = dataclasses.replace(t0, split_k=1 if pairs else None, mma_from=0)
        for ds in ((True, False) if sweep_decode and not pairs else (t0.dot_scaled,)):
            for bn, bk, warps in SWEEP_SHAPES[variant]:
                out.append(dataclasses.replace(t0, block_n=bn, block_k=bk, num_warps=warps, dot_scaled=ds))
        if variant == "tc":
            bn, bk, warps = SWEEP_SHAPES["tc"][0]
            out.append(dataclasses.replace(t0, block_n=bn, block_k=bk, num_warps=warps, split_k=None))
        if variant == "gemv":   # experts given 2+ pairs on tc's tensor-core step, the others on gemv's FMA loops
            for bn, bk, warps in SWEEP_SHAPES["gemv"][:2]:
                out.append(dataclasses.replace(t0, block_n=bn, block_k=bk, num_warps=warps, mma_from=2))
            for bn, bk, warps in SWEEP_SHAPES["gemv"]:
                if bk == 128:
                    out += [dataclasses.replace(t0, block_n=bn, block_k=bk, num_warps=warps, split_k=split)
                            for split in GEMV_SPLITS]
            if tokens == 1:
                out += [dataclasses.replace(t0, **change) for change in ONE_TOKEN_GEMV]
    return list(dict.fromkeys(out))   # the default's own tile may repeat one above


def best_variants(rows: list[dict]) -> list[dict]:
    """Per routing and token count, the fastest timed tile of each variant (gemv with mma_from 2 as gemv_mma2), and
    their times over each other's."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if "ms" not in r:
            continue
        key = (r.get("routing", "uniform"), r["tokens"])
        entry = best.setdefault(key, {"routing": key[0], "tokens": key[1], "distinct_experts": r.get("distinct_experts")})
        variant = r["variant"] + (f"_mma{r['mma_from']}" if r.get("mma_from") else "")   # gemv_mma2: the hybrid
        if r["ms"] < entry.get(f"{variant}_ms", float("inf")):
            entry[f"{variant}_ms"] = r["ms"]
            entry[f"{variant}_tiles"] = {k: r.get(k) for k in ("block_m", "block_n", "block_k", "down_block_k",
                                                               "num_warps", "num_stages", "dot_scaled", "split_k")}
    for entry in best.values():
        for a, b in (("gemv", "mma"), ("tc", "mma"), ("tc", "gemv"), ("gemv_mma2", "gemv"), ("gemv_mma2", "tc")):
            if f"{a}_ms" in entry and f"{b}_ms" in entry:
                entry[f"{a}_over_{b}"] = round(entry[f"{a}_ms"] / entry[f"{b}_ms"], 3)
    return list(best.values())


def tile_sweep(target, device, token_counts, iters: int, routings=(Routing(),), sweep_decode: bool = False) -> list[dict]:
    """Layer 0's fused experts under the tiles sweep_tiles names, for each routing (layer 0 of its trace for one
    request of ``tokens`` positions: a DFlash block's tokens share experts under skewed routing)."""
    from trtllm_dflash.runtime import mxfp4_moe
    mx = target.layers[0].mlp.experts
    c = target.config
    rows = []
    for routing in routings:
        for N in token_counts:
            x, _, w = moe_inputs(target, N, device)
            ids = routing.trace(1, 1, N, c.num_experts, c.experts_per_token)[0].to(device)
            distinct = ids.unique().numel()
            for t in sweep_tiles(N, ids.shape[1], mx.num_local, sweep_decode):
                fn = lambda t=t: mxfp4_moe.fused_experts(  # noqa: E731
                    x, ids, w, mx.gate_up_proj_blocks, mx.gate_up_proj_scales, mx.gate_up_proj_bias,
                    mx.down_proj_blocks, mx.down_proj_scales, mx.down_proj_bias, first=0, num_experts=mx.num_experts,
                    limit=mx.limit, alpha=1.702, tiles=t)
                row = {"routing": routing.name, "tokens": N, "distinct_experts": distinct, **dataclasses.asdict(t)}
                try:
                    ms = statistics.median(time_ms(graphed(fn), iters, 3, True))
                except Exception as err:  # noqa: BLE001  a tile the compiler refuses is a row, not a crash
                    rows.append({**row, "error": str(err).splitlines()[0][:200]})
                    continue
                rows.append({**row, "ms": round(ms, 4)})
                print(f"tiles {routing.name} N={N:4d} ({distinct} experts) {t}: {ms:.4f} ms", flush=True)
    return rows


# runtime/mxfp4_moe.py's kernels: their GPU time per step is the experts' cost (profile_top)
EXPERT_KERNELS = ("_route_kernel", "_gate_up_kernel", "_swiglu_kernel", "_down_kernel", "_combine_kernel",
                  "_gemv_gate_up_kernel", "_gemv_down_kernel",
                  # --experts triton_kernels: its matmuls and the routing kernels routing_from_bitmatrix launches
                  "_matmul_ogs", "_p_matmul_ogs", "_sum_bitmatrix", "_combined_routing", "_reduce_grouped",
                  "_pack_routing_kernel")
EXPERTS_MARK = "gpt_oss_step.experts"  # the CPU profile's marker around each experts module call


def profile_top(fn, target, cuda: bool, steps: int = 3, top: int = 12) -> dict:
    """Device time per step by kernel (torch profiler over graph replays); expert_kernels_*: the MXFP4 expert
    kernels' share (EXPERT_KERNELS; the torch k-sum after an unsplit down kernel is not among them).

    On the CPU (the smoke run) the "kernels" are the step's torch ops and the experts' share is the time inside
    the target's experts modules (marked by hooks), so the same summary fields come out end to end."""
    from torch.profiler import ProfilerActivity, profile, record_function
    fn()
    if cuda:
        torch.cuda.synchronize()
    marks, hooks = [], []
    if not cuda:
        def enter(module, args):
            marks.append(record_function(EXPERTS_MARK))
            marks[-1].__enter__()

        def leave(module, args, out):
            marks.pop().__exit__(None, None, None)
        for layer in target.layers:
            hooks += [layer.mlp.experts.register_forward_pre_hook(enter),
                      layer.mlp.experts.register_forward_hook(leave)]
    try:
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                fn()
            if cuda:
                torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    if cuda:
        evts = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        own = lambda e: e.self_device_time_total  # noqa: E731
        experts = [e for e in evts if e.key.startswith(EXPERT_KERNELS)]
        experts_us = sum(own(e) for e in experts)
    else:
        evts = [e for e in prof.key_averages() if e.key != EXPERTS_MARK and e.key.startswith("aten::")]
        own = lambda e: e.self_cpu_time_total  # noqa: E731
        experts = [e for e in prof.key_averages() if e.key == EXPERTS_MARK]
        experts_us = sum(e.cpu_time_total for e in experts)  # inclusive: the ops the experts ran
    total = sum(own(e) for e in evts)
    best = sorted(evts, key=lambda e: -own(e))[:top]
    # CPU: an op that calls others (aten::linear -> aten::addmm) is no kernel of its own; count the leaves
    launched = sum(e.count for e in evts) if cuda else sum(
        1 for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children)
    return {"kernels_per_step": launched / steps, "device_ms_per_step": round(total / 1e3 / steps, 4),
            "unit": "CUDA kernels" if cuda else "CPU torch ops",
            "expert_kernels_per_step": sum(e.count for e in experts) / steps,
            "expert_kernels_ms": round(experts_us / 1e3 / steps, 4),
            "top": [{"name": e.key[:100], "count": e.count // steps, "ms": round(own(e) / 1e3 / steps, 4),
                     "share": round(own(e) / max(total, 1), 3)} for e in best]}


# z-lab/gpt-oss-120b-DFlash model card, block 10: mean acceptance length tau (the projection below uses them)
ZLAB_120B_TAU = {"humaneval": 4.4, "mt-bench": 3.7, "gsm8k": 5.3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--target", choices=sorted(TARGETS), default="gpt-oss-20b", help="shapes of the target and drafter")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test), not the real ones")
    p.add_argument("--experts", choices=("triton", "triton_kernels", "dequant"), default=None,
                   help="our MXFP4 kernels, ours at 1 token and the triton_kernels library from 2 (RuntimeConfig."
                        "mxfp4_moe; needs it importable, sm90+), or bf16 experts (default: triton on CUDA, dequant "
                        "on CPU)")
    p.add_argument("--batch_sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--blocks", default="8,10", help="DFlash block sizes (the AR step is always timed)")
    p.add_argument("--ctx", type=int, default=1024, help="tokens already in each request's KV cache")
    p.add_argument("--iters", type=int, default=30, help="timed steps per point (the median is reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eager", action="store_true", help="CUDA: also time without CUDA graphs")
    p.add_argument("--compare_dequant", action="store_true",
                   help="re-time every row with the experts dequantised to bf16 (needs 4x the expert memory)")
    p.add_argument("--compare_layers", type=int, default=0,
                   help="time one MoE layer MXFP4 vs bf16 at the rows' token counts (when the full bf16 model does not fit)")
    p.add_argument("--compare", default="",
                   help="comma list of libraries to time one MoE layer on next to our MXFP4 kernels, same experts and "
                        "routing traces, at the rows' token counts (Hopper): flashinfer (flashinfer-python's fused "
                        "MoE), triton_kernels (the Triton MoE kernels vLLM runs gpt-oss on, in their Hopper "
                        "layouts), triton_kernels_strided (the same kernels on views of our weights); either takes "
                        "opt-flag constraints after a colon, e.g. triton_kernels:fc2.block_k=256+fc2.num_stages=4")
    p.add_argument("--compare_only", action="store_true",
                   help="with --compare: time only the one MoE layer, not the steps")
    p.add_argument("--tile_sweep", action="store_true", help="time the kernels under a few tile shapes")
    p.add_argument("--profile", action="store_true", help="top kernels of the b=1 AR and DFlash steps")
    p.add_argument("--routing", default="uniform",
                   help="comma list of routing traces the experts get, each timed in full: uniform (every token's "
                        "top-k uniform: the worst case) and/or skewed (--routing_zipf, --routing_reuse)")
    p.add_argument("--routing_zipf", type=float, default=1.0,
                   help="skewed: per-layer expert popularity ~ (rank + 1) ** -zipf (0 = equally popular)")
    p.add_argument("--routing_reuse", type=float, default=0.5,
                   help="skewed: probability that each top-k slot of a DFlash block position repeats the previous "
                        "position's expert")
    p.add_argument("--routing_seed", type=int, default=0, help="seed of the routing traces")
    p.add_argument("--attention_kernel", choices=("auto", "triton", "torch"), default="auto",
                   help="RuntimeConfig.kernels for target and drafter (auto: the Triton decode kernels on "
                        "CUDA, as the engine runs them)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpt_oss_step_<target>_<gpu>.json)")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible; use --tiny --device cpu for the smoke test")
    backend = args.experts or ("triton" if cuda else "dequant")
    if backend != "dequant" and not cuda:
        raise SystemExit(f"--experts {backend} runs on CUDA only; use --experts dequant on the CPU")
    dtype = torch.bfloat16 if cuda else torch.float32
    batches = [int(b) for b in args.batch_sizes.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    names = list(dict.fromkeys(r.strip() for r in args.routing.split(",")))
    try:
        routings = [Routing.parse(name, args.routing_zipf, args.routing_reuse, args.routing_seed) for name in names]
    except ValueError as err:
        raise SystemExit(f"gpt_oss_step: {err}") from None
    compare = {c: library(c) for c in args.compare.split(",") if c}
    if args.compare_only and not compare:
        raise SystemExit("--compare_only times the libraries of --compare: name at least one")
    handles = {}
    for lib, lib_spec in compare.items():
        try:   # before the model is built: a missing library costs nothing
            handles[lib] = lib_spec.load()
            if backend != "triton":
                raise SystemExit(f"--compare {lib} compares against the MXFP4 kernels: run it with --experts triton "
                                 "on a CUDA GPU")
            lib_spec.check_device(device)
        except ValueError as err:
            raise SystemExit(str(err)) from None
    t0 = time.perf_counter()
    ceil = device_ceilings(cuda, args.tiny)
    kernels = Kernels.choose(args.attention_kernel, False, device, dtype)
    target, drafter = build(args.target, args.tiny, device, dtype, args.ctx + 16, backend, kernels=kernels)
    kernel = "triton" if kernels.triton else "torch"
    steps = Steps(target, drafter, max(batches), args.ctx, device, dtype)
    bytes_model = ByteModel(target, drafter, args.ctx)
    bytes_per_expert = expert_bytes(target.layers[0].mlp.experts)  # the backend's (--compare_dequant swaps them)
    build_s = time.perf_counter() - t0
    gpu = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    record = {"benchmark": "gpt_oss_step", "provenance": record_provenance(argv),
              "device": gpu, "dtype": str(dtype).removeprefix("torch."), "experts": backend,
              "attention_kernel": kernel,
              "shapes": {"target": "tiny" if args.tiny else f"openai/{args.target}",
                         "drafter": "tiny" if args.tiny else f"z-lab/{args.target}-DFlash", "ctx": args.ctx},
              "build_s": round(build_s, 2), "iters": args.iters, "ceilings": ceil,
              "routing": {r.name: r.params() for r in routings},
              "routing_note": "the experts get a routing trace's ids (bench/routing_trace.py), not the random router's: "
                              "uniform is near the worst case min(E, tokens x top-k) distinct experts per layer; skewed "
                              "states its Zipf exponent and per-slot reuse across block positions (assumptions, not "
                              "measured gpt-oss routing)", "results": []}
    if cuda:
        record["weights_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
        record["target_weight_gb"] = round(nbytes(target.parameters()) / 1e9, 2)
        if backend != "dequant":
            record["kernel_vs_bf16_dequant_rel_err"] = check_kernel(target, device)
        else:
            try:
                record["grouped_mm_rel_err"] = check_grouped_mm(target, device)  # bf16: expect ~1e-3
            except RuntimeError as err:
                record["grouped_mm_error"] = str(err).splitlines()[0]
    if cuda and args.tile_sweep and backend == "triton":
        record["tile_sweep"] = tile_sweep(target, device, [1, blocks[0], 64 * blocks[0]], args.iters, routings)
        record["tile_sweep_best"] = best_variants(record["tile_sweep"])

    def timed_rows(label: str, routing: str) -> None:
        modes = (["eager"] if not cuda or args.eager else []) + (["graph"] if cuda else [])
        for n in batches:
            for B in [1, *blocks]:
                touched = distinct_experts(steps, n, B)
                for mode in modes:
                    fn = lambda n=n, B=B: steps.run(n, B)  # noqa: E731
                    row = {"experts": label, "routing": routing, "step": "ar" if B == 1 else "dflash",
                           "block_size": B, "batch": n, "mode": mode, "distinct_experts": touched}
                    try:
                        ms = time_ms(graphed(fn) if mode == "graph" else fn, args.iters, args.warmup, cuda)
                    except RuntimeError as err:  # reported, never hidden: a failed graph capture keeps its eager row
                        row["error"] = str(err).splitlines()[0]
                        record["results"].append(row)
                        continue
                    finally:
                        if cuda:  # each graph's memory pool goes back before the next shape is captured
                            torch.cuda.empty_cache()
                    row.update(median_ms=round(statistics.median(ms), 3), min_ms=round(min(ms), 3),
                               max_ms=round(max(ms), 3))
                    if ceil is not None:
                        row["hbm_bytes"] = bytes_model.step(n, B, touched)
                        row["roofline_ms"] = round(1e3 * row["hbm_bytes"] / ceil["copy_bw_bytes_per_s"], 4)
                        row["roofline_fraction"] = round(row["roofline_ms"] / row["median_ms"], 3)
                    record["results"].append(row)
                    print(f"{label:7s} {routing:7s} {row['step']:6s} B={B:2d} n={n:3d} {mode:5s} {row['median_ms']:9.3f} ms "
                          f"experts {touched:5d}" + (f"  roofline {row['roofline_ms']:.3f} ms ({row['roofline_fraction']:.0%})"
                                                     if "roofline_ms" in row else ""), flush=True)

    def each_routing(label: str) -> None:
        """The rows (and with --profile the b=1 profiles) of every routing, the experts getting its trace."""
        for routing in routings:
            steps.router = TraceRouter(routing, target, device).attach()
            try:
                timed_rows(label, routing.name)
                if args.profile and label == backend:
                    for B in (1, blocks[0]):
                        fn = lambda B=B: steps.run(1, B)  # noqa: E731
                        prof = profile_top(graphed(fn) if cuda else fn, target, cuda)
                        record[profile_key(backend, "ar" if B == 1 else "dflash", routing.name)] = prof
                        print(f"profile {routing.name} B={B}: " + "; ".join(
                            f"{t['name'][:50]} x{t['count']} {t['ms']:.3f}ms" for t in prof["top"][:6]), flush=True)
                        if cuda:
                            torch.cuda.empty_cache()
            finally:
                steps.router.detach()
                steps.router = None

    if not args.compare_only:
        each_routing(backend)
        # the drafter apart (deliverable: the verify's own non-expert cost is the DFlash step's minus this)
        fn = lambda: steps.draft(1, blocks[0])  # noqa: E731
        record["drafter_b1_ms"] = round(statistics.median(
            time_ms(graphed(fn) if cuda else fn, args.iters, args.warmup, cuda)), 4)
    if cuda and args.compare_layers and backend != "dequant":
        counts = sorted({n * B for n in batches for B in [1, *blocks]})
        record["moe_layer_mxfp4_vs_bf16"] = moe_layer_times(target, device, counts, args.iters)
    for lib in compare:
        record[f"moe_layer_vs_{lib}"] = moe_layer_vs_library(
            target, lib, handles[lib], routings, [(n, B) for n in batches for B in [1, *blocks]], args.iters, ceil)
    if args.compare_dequant and backend != "dequant":
        for layer in target.layers:  # the same experts, now bf16: the reference path, timed in the same run
            layer.mlp.experts = layer.mlp.experts.dequantized(dtype)
            torch.cuda.empty_cache()
        each_routing("dequant")
    for row in record["results"]:
        same = lambda r: (r["experts"], r["routing"], r["batch"], r["mode"]) == (  # noqa: E731
            row["experts"], row["routing"], row["batch"], row["mode"])
        ar = next((r for r in record["results"] if r["step"] == "ar" and same(r) and "median_ms" in r), None)
        if row["step"] == "dflash" and ar is not None and "median_ms" in row:
            row["break_even_tokens"] = round(row["median_ms"] / ar["median_ms"], 3)
    record["summary"] = full_summary(record, backend, blocks[0], [r.name for r in routings], bytes_per_expert)
    for lib in compare:
        if record["summary"] and record.get(f"moe_layer_vs_{lib}"):
            record["summary"][f"moe_layer_vs_{lib}_b1"] = [
                {k: r.get(k) for k in ("routing", "block_size", "ours_ms", f"{lib}_ms", f"{lib}_over_ours",
                                       "ours_bandwidth_fraction", f"{lib}_bandwidth_fraction", "rel_diff", "error")}
                for r in record[f"moe_layer_vs_{lib}"] if r.get("batch", 1) == 1]
    if cuda:
        record["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    record["total_s"] = round(time.perf_counter() - t0, 1)
    name = "tiny" if args.tiny else gpu.lower().replace("nvidia ", "").replace(" ", "_")
    out = Path(args.out or Path("benchmarks") / "results" / f"gpt_oss_step_{args.target}_{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["summary"], indent=1))
    print(f"wrote {out} ({record['total_s']} s)")
    return 0


# the fields the goals read, and the ones a reader needs next to them (per routing)
GOAL_KEYS = ("ar_b1_step_ms", "ar_b1_roofline_fraction", "break_even_tokens_b1", "ar_b1_expert_bandwidth_fraction",
             "dflash_b1_expert_bandwidth_fraction")


def device_ceilings(cuda: bool, tiny: bool) -> dict | None:
    """The copy bandwidth the roofline divides by: measured on the GPU (not for tiny shapes, which are no HBM
    test); on a CPU-only host the CPU's own, so the smoke run fills every roofline field end to end."""
    if cuda:
        return None if tiny else ceilings()
    return ceilings(smoke=True) if step_bench.DEV.type == "cpu" else None


def profile_key(backend: str, step: str, routing: str) -> str:
    return f"profile_{backend}_{step}_b1" + ("" if routing == "uniform" else f"_{routing}")


def timing_mode(rows: list[dict]) -> str:
    """CUDA graphs where they were timed (the engine's mode), else eager (the CPU)."""
    return "graph" if any(r["mode"] == "graph" and "median_ms" in r for r in rows) else "eager"


def full_summary(record: dict, backend: str, block: int, routings: list[str], bytes_per_expert: int) -> dict:
    """The headline routing's fields (uniform when it ran, else the first) at the top level under the names the
    goals read (GOAL_KEYS); every other routing's numbers again with a ``_<routing>`` suffix; under ``routings``
    each routing's parameters, b=1 fields and per-batch step times, break-even tokens and distinct experts."""
    per = {}
    for name in routings:
        s = summarize(record["results"], backend, block, record.get("moe_layer_mxfp4_vs_bf16"), name)
        if s:
            s.update(expert_summary(record, backend, name, bytes_per_expert))
        per[name] = s
    head = "uniform" if "uniform" in routings else routings[0]
    if not per[head]:
        return {}
    out = {"gpu": record["device"], "routing": head, **per[head], **non_expert_split(record, head)}
    for name in routings:
        if name != head:
            out.update({f"{k}_{name}": v for k, v in per[name].items() if isinstance(v, (int, float))})
    out["routings"] = {name: {"params": record["routing"][name],
                              **{k: v for k, v in per[name].items() if not k.endswith("_note")}} for name in routings}
    return out


def non_expert_split(record: dict, routing: str) -> dict:
    """With --profile: the b=1 steps' GPU time outside the expert kernels, and the DFlash step's split into the
    drafter (timed alone) and the verify: ``verify_over_ar_non_expert_b1`` compares the verify's non-expert work
    (attention, router, norms, GEMMs, lm_head) with AR's."""
    out = {}
    for step in ("ar", "dflash"):
        prof = record.get(profile_key(record["experts"], step, routing))
        if prof and prof.get("expert_kernels_ms") is not None:
            out[f"{step}_b1_non_expert_ms"] = round(prof["device_ms_per_step"] - prof["expert_kernels_ms"], 4)
    if "drafter_b1_ms" in record:
        out["dflash_b1_drafter_ms"] = record["drafter_b1_ms"]
        if {"ar_b1_non_expert_ms", "dflash_b1_non_expert_ms"} <= out.keys():
            verify = out["dflash_b1_non_expert_ms"] - record["drafter_b1_ms"]
            out["dflash_b1_verify_non_expert_ms"] = round(verify, 4)
            out["verify_over_ar_non_expert_b1"] = round(verify / out["ar_b1_non_expert_ms"], 3)
    return out


def summarize(rows: list[dict], backend: str, block: int, layer_rows, routing: str = "uniform") -> dict:
    rows = [r for r in rows if r["routing"] == routing]
    mode = timing_mode(rows)

    def pick(experts, step, n, B):
        return next((r for r in rows if (r["experts"], r["step"], r["batch"], r["block_size"]) == (experts, step, n, B)
                     and r["mode"] == mode and "median_ms" in r), None)
    ar, df = pick(backend, "ar", 1, 1), pick(backend, "dflash", 1, block)
    if ar is None or df is None:
        return {}
    s = {"experts": backend, "block_size": block, "mode": mode, "ar_b1_step_ms": ar["median_ms"],
         "dflash_b1_step_ms": df["median_ms"],
         "ar_b1_roofline_fraction": ar.get("roofline_fraction"), "dflash_b1_roofline_fraction": df.get("roofline_fraction"),
         "ar_b1_roofline_ms": ar.get("roofline_ms"), "dflash_b1_roofline_ms": df.get("roofline_ms"),
         "break_even_tokens_b1": df["break_even_tokens"]}
    ref = pick("dequant", "ar", 1, 1)
    s["speedup_vs_bf16_dequant_ar_b1"] = round(ref["median_ms"] / ar["median_ms"], 3) if ref and backend != "dequant" else None
    refd = pick("dequant", "dflash", 1, block)
    s["speedup_vs_bf16_dequant_dflash_b1"] = round(refd["median_ms"] / df["median_ms"], 3) if refd and backend != "dequant" else None
    if s["speedup_vs_bf16_dequant_ar_b1"] is None and layer_rows:
        s["bf16_dequant_note"] = ("the bf16-dequantised model does not fit this GPU; moe_layer_mxfp4_vs_bf16 compares "
                                  "one MoE layer both ways")
        s["moe_layer_speedup_vs_bf16_1_token"] = layer_rows[0]["speedup"]
    # a projection, not a measurement: z-lab's published tau (block 10, gpt-oss-120b) x AR step / DFlash step
    s["projection_end_to_end_speedup_b1"] = {
        k: round(tau * ar["median_ms"] / df["median_ms"], 2) for k, tau in ZLAB_120B_TAU.items()}
    s["projection_note"] = ("PROJECTION: published z-lab gpt-oss-120b-DFlash acceptance (block 10) x measured AR step / "
                            "DFlash step at batch 1; random weights here, so no acceptance was measured")
    for n in sorted({r["batch"] for r in rows}):
        a, d = pick(backend, "ar", n, 1), pick(backend, "dflash", n, block)
        if a and d:
            s[f"b{n}"] = {"ar_ms": a["median_ms"], "dflash_ms": d["median_ms"], "break_even_tokens": d["break_even_tokens"],
                          "ar_roofline_fraction": a.get("roofline_fraction"), "dflash_roofline_fraction": d.get("roofline_fraction"),
                          "ar_distinct_experts": a["distinct_experts"], "dflash_distinct_experts": d["distinct_experts"]}
    return s


def expert_summary(record: dict, backend: str, routing: str, bytes_per_expert: int) -> dict:
    """Per b=1 step (AR, DFlash): expert bytes touched = distinct experts (summed over layers) x bytes per expert;
    with --profile, the kernels per step, the expert kernels' time, the bandwidth fraction it achieves on those
    bytes, and us per distinct expert (AR vs DFlash: equal when the experts' cost follows the distinct experts,
    not the tokens)."""
    s, bw = {}, (record.get("ceilings") or {}).get("copy_bw_bytes_per_s")
    rows = [r for r in record["results"] if r["routing"] == routing]
    mode = timing_mode(rows)
    for step in ("ar", "dflash"):
        row = next((r for r in rows if (r["experts"], r["step"], r["batch"], r["mode"]) ==
                    (backend, step, 1, mode) and "median_ms" in r), None)
        if row is None:
            continue
        touched = row["distinct_experts"] * bytes_per_expert
        s[f"{step}_b1_distinct_experts"] = row["distinct_experts"]
        s[f"{step}_b1_expert_bytes_touched"] = touched
        prof = record.get(profile_key(backend, step, routing))
        if prof:
            s[f"{step}_b1_kernels_per_step"] = prof["kernels_per_step"]
        if prof and prof.get("expert_kernels_ms"):
            ms = prof["expert_kernels_ms"]
            s[f"{step}_b1_expert_kernels_ms"] = ms
            s[f"{step}_b1_expert_kernels_per_step"] = prof["expert_kernels_per_step"]
            s[f"{step}_b1_us_per_distinct_expert"] = round(1e3 * ms / row["distinct_experts"], 3)
            if bw:
                s[f"{step}_b1_expert_bandwidth_fraction"] = round(touched / (ms * 1e-3) / bw, 3)
    return s


def record_provenance(argv) -> dict:
    from trtllm_dflash.provenance import record
    return record([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])], checkpoints={})


if __name__ == "__main__":
    sys.exit(main())
