# SPDX-License-Identifier: Apache-2.0
"""Step latency of the torch runtime on gpt-oss-20b shapes with random bf16 weights (one GPU, no checkpoint).

Times the two steps the engine runs (engine._step_tensors), over a static KV cache holding ``--ctx`` tokens
per request:
  ar      block 1: target forward of 1 token per request + lm_head + argmax;
  dflash  block B (8 = the 20b drafter, 10 = the 120b drafter): drafter pass over [last, mask x (B-1)] + lm_head
          argmax (B-1 drafts), target verify of B tokens + lm_head, acceptance, context K/V of the block.
Weights are random, so acceptance means nothing here: the JSON gives per-step latency and, per batch,
``break_even_tokens`` = dflash_ms / ar_ms, the mean tokens a DFlash step must commit to beat AR decoding.

Shapes: the public openai/gpt-oss-20b config (24 layers, hidden 2880, 64/8 heads of 64, 32 experts top-4,
intermediate 2880, vocab 201088, window 128, YaRN) and z-lab/gpt-oss-20b-DFlash (8 layers, 7680 MLP,
q/k/v/o biases). bf16 weights are built directly on the GPU: 39 GiB target + 1.5 GiB drafter.

  python benchmarks/gpt_oss_step.py                      # H100 80 GB: about 2 minutes
  python benchmarks/gpt_oss_step.py --tiny --device cpu  # the CPU smoke path the tests run
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from step_bench import graphed  # noqa: E402
from trtllm_dflash.versions import installed  # noqa: E402

from trtllm_dflash.runtime.distributed import TPGroup  # noqa: E402
from trtllm_dflash.runtime.kv_cache import KVCache  # noqa: E402
from trtllm_dflash.runtime.models.dflash import DFlashDrafter, DrafterConfig  # noqa: E402
from trtllm_dflash.runtime.models.gpt_oss import GptOssConfig, GptOssTarget, _grouped_mm  # noqa: E402
from trtllm_dflash.runtime.models.layers import Rotary  # noqa: E402
from trtllm_dflash.runtime.sampling import accept  # noqa: E402

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
TINY = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 96, "sliding_window": 8}
TINY_DRAFTER = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 96,
                "dflash_config": {"mask_token_id": 95, "target_layer_ids": [0, 2, 3]}}


def random_weights(model: torch.nn.Module, device, dtype, seed: int) -> torch.nn.Module:
    """Meta-device module -> random weights allocated once, directly in ``dtype`` on ``device``."""
    model = model.to(dtype).to_empty(device=device)  # meta -> meta cast is free: no float32 copy is ever made
    g = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


def build(tiny: bool, device, dtype, max_positions: int):
    tcfg = GptOssConfig.from_hf({**GPT_OSS_20B, **TINY} if tiny else GPT_OSS_20B)
    dcfg = DrafterConfig.from_hf({**GPT_OSS_20B_DRAFTER, **TINY_DRAFTER} if tiny else GPT_OSS_20B_DRAFTER)
    tp = TPGroup()
    with torch.device("meta"):
        target = GptOssTarget(tcfg, tp, max_positions, dcfg.target_layer_ids)
        drafter = DFlashDrafter(dcfg, tcfg.hidden_size, tp, max_positions)
    target, drafter = random_weights(target, device, dtype, 0), random_weights(drafter, device, dtype, 1)
    # RoPE tables are buffers, not weights: rebuild them for real (to_empty left them uninitialised)
    target.rotary = Rotary(tcfg.rope, tcfg.head_dim, max_positions, tcfg.max_position_embeddings).to(device)
    drafter.rotary = Rotary(dcfg.rope, dcfg.head_dim, max_positions, dcfg.max_position_embeddings).to(device)
    return target.eval(), drafter.eval()


class Steps:
    """The engine's device work for one step (engine._step_tensors), at a fixed context length ``ctx``."""

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

    @torch.inference_mode()
    def run(self, n: int, B: int) -> torch.Tensor:
        rows, start, last = slice(0, n), self.start[:n], self.last[:n]
        pos = start[:, None] + torch.arange(B, device=self.device)                       # [n, B]
        kv_len = self.ctx + B
        if B == 1:
            h, _ = self.target(last[:, None], pos, self.cache, rows, kv_len)
            return self.target.logits(h).argmax(-1)                                      # [n, 1]
        ids = torch.cat([last[:, None], torch.full((n, B - 1), self.mask_id, device=self.device)], 1)
        hd = self.drafter(self.target.embed(ids), pos, start, self.draft_cache, rows, kv_len)
        draft = self.target.logits(hd[:, 1:]).argmax(-1)                                 # [n, B-1]
        h, feats = self.target(torch.cat([last[:, None], draft], 1), pos, self.cache, rows, kv_len)
        t = self.target.logits(h).argmax(-1)                                             # [n, B]
        a = accept(draft, t)                                                             # [n]
        self.drafter.append_context(feats, pos, self.draft_cache, rows)
        return t.gather(1, a[:, None])


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
    """The MoE's grouped GEMM against one matmul per expert, at real shapes (relative error)."""
    w = target.layers[0].mlp.experts.gate_up_proj                                       # [E, H, 2I]
    g = torch.Generator(device).manual_seed(3)
    counts = torch.randint(0, 9, (w.shape[0],), generator=g, device=device)
    offs = counts.cumsum(0).to(torch.int32)
    a = torch.randn(int(offs[-1]), w.shape[1], generator=g, device=device).to(w.dtype)
    got = _grouped_mm(a, w, offs).float()
    ref = torch.cat([a[lo:hi].float() @ w[e].float() for e, (lo, hi) in
                     enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
    return ((got - ref).norm() / ref.norm()).item()


def versions() -> dict:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "trtllm_dflash": installed("trtllm_dflash")["trtllm_dflash"], "git": sha or None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test), not gpt-oss-20b")
    p.add_argument("--batch_sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--blocks", default="8,10", help="DFlash block sizes (the AR step is always timed)")
    p.add_argument("--ctx", type=int, default=1024, help="tokens already in each request's KV cache")
    p.add_argument("--iters", type=int, default=30, help="timed steps per point (the median is reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no_graphs", action="store_true", help="CUDA only: skip the CUDA-graph timings")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpt_oss_20b_step_<gpu>.json)")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible; use --tiny --device cpu for the smoke test")
    dtype = torch.bfloat16 if cuda else torch.float32
    batches = [int(b) for b in args.batch_sizes.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    t0 = time.perf_counter()
    target, drafter = build(args.tiny, device, dtype, args.ctx + 16)
    steps = Steps(target, drafter, max(batches), args.ctx, device, dtype)
    build_s = time.perf_counter() - t0
    gpu = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    record = {"benchmark": "gpt_oss_step", "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "device": gpu, "dtype": str(dtype).removeprefix("torch."), "versions": versions(),
              "shapes": {"target": "tiny" if args.tiny else "openai/gpt-oss-20b",
                         "drafter": "tiny" if args.tiny else "z-lab/gpt-oss-20b-DFlash", "ctx": args.ctx},
              "build_s": round(build_s, 2), "iters": args.iters, "results": []}
    if cuda:
        try:
            record["grouped_mm_rel_err"] = check_grouped_mm(target, device)  # bf16: expect ~1e-3
        except RuntimeError as err:  # recorded, and every timed row below will carry the same error
            record["grouped_mm_error"] = str(err).splitlines()[0]
        record["weights_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
    modes = ["eager"] + (["graph"] if cuda and not args.no_graphs else [])
    for n in batches:
        for B in [1, *blocks]:
            for mode in modes:
                fn = lambda n=n, B=B: steps.run(n, B)  # noqa: E731
                row = {"step": "ar" if B == 1 else "dflash", "block_size": B, "batch": n, "mode": mode}
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
                record["results"].append(row)
                print(f"{row['step']:6s} B={B:2d} n={n:3d} {mode:5s} {row['median_ms']:9.3f} ms", flush=True)
    for row in record["results"]:
        ar = next((r for r in record["results"] if r["step"] == "ar" and r["batch"] == row["batch"]
                   and r["mode"] == row["mode"] and "median_ms" in r), None)
        if row["step"] == "dflash" and ar is not None and "median_ms" in row:
            row["break_even_tokens"] = round(row["median_ms"] / ar["median_ms"], 3)
    if cuda:
        record["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    record["total_s"] = round(time.perf_counter() - t0, 1)
    name = "tiny" if args.tiny else gpu.lower().replace("nvidia ", "").replace(" ", "_")
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"gpt_oss_20b_step_{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out} ({record['total_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
