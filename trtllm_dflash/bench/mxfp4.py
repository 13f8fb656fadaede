# SPDX-License-Identifier: Apache-2.0
"""One gpt-oss MoE layer's routed experts (runtime/mxfp4_moe.py) on random MXFP4 weights: the kernel as it was
(variant mma, the old default tiles) against the gemv and swap variants at a few tile configs, CUDA-graph replay.

Per (model, tokens, routing, config): microseconds per call (median of graph replays), the distinct experts the
call touches, expert bytes touched = distinct experts x bytes per expert (packed blocks + scales + biases of
gate_up and down), achieved GB/s = those bytes / time, and the fraction of the copy bandwidth measured in the same
run (benchmarks/step_bench.ceilings). ``best`` gives the fastest config per (model, tokens, routing): the numbers
default_tiles' rule (GEMV up to GEMV_MAX_TOKENS tokens) and its tiles should follow.

Routing: "random" = each token's top-k of uniform scores (near the worst case, min(E, tokens x k) experts);
"concentrated" = every token of the call picks from the same 2 x top-k experts (a verify block whose tokens
share experts), so the distinct experts stay at 8 however many tokens.

  python -m trtllm_dflash.bench.mxfp4 --out /tmp/mxfp4_bench.json        # H100: ~1-2 min (mostly Triton compiles)
  python -m trtllm_dflash.bench.mxfp4 --smoke --out /tmp/mxfp4_smoke.json # CPU, Triton's interpreter, tiny shapes
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


SHAPES = {  # public openai/gpt-oss-* config.json: num_local_experts, hidden_size, intermediate_size, top-k
    "gpt-oss-20b": dict(experts=32, hidden=2880, inter=2880, top_k=4),
    "gpt-oss-120b": dict(experts=128, hidden=2880, inter=2880, top_k=4),
}
TINY = {"tiny": dict(experts=8, hidden=64, inter=96, top_k=2)}
# name -> TileConfig fields; "old" = the pre-gemv default (mma, BM by pairs per expert), "default" = default_tiles
CONFIGS = {
    "old": None,
    "default": None,
    "gemv_n32_k256": dict(variant="gemv", block_m=16, block_n=32, block_k=256),
    "gemv_n16_k256": dict(variant="gemv", block_m=16, block_n=16, block_k=256),
    "gemv_n32_k256_split1": dict(variant="gemv", block_m=16, block_n=32, block_k=256, split_k=1),
    "gemv_n32_k256_w8": dict(variant="gemv", block_m=16, block_n=32, block_k=256, num_warps=8),
    "gemv_n16_k256_split1": dict(variant="gemv", block_m=16, block_n=16, block_k=256, split_k=1),
    "gemv_n16_k128": dict(variant="gemv", block_m=16, block_n=16, block_k=128),
    "gemv_n32_k128": dict(variant="gemv", block_m=16, block_n=32, block_k=128),
    "gemv_n32_k128_split1": dict(variant="gemv", block_m=16, block_n=32, block_k=128, split_k=1),
    "gemv_n16_k128_split1": dict(variant="gemv", block_m=16, block_n=16, block_k=128, split_k=1),
    "gemv_n16_k256_w2": dict(variant="gemv", block_m=16, block_n=16, block_k=256, num_warps=2),
    "swap_n64_k128": dict(variant="swap", block_m=16, block_n=64, block_k=128),
    "swap_n128_k128_w8": dict(variant="swap", block_m=16, block_n=128, block_k=128, num_warps=8),
}
SMOKE_CONFIGS = {  # what the interpreter runs: no dot_scaled
    "old": dict(variant="mma", block_m=16, block_n=16, block_k=32, dot_scaled=False),
    "default": None,
    "gemv_n16_k32": dict(variant="gemv", block_m=16, block_n=16, block_k=32),
    "swap_n16_k32": dict(variant="swap", block_m=16, block_n=16, block_k=32, dot_scaled=False),
}


def old_tiles(mx, tokens: int, top_k: int, num_experts: int):
    """The default before the gemv variant (commit 870b581): mma, BM 16/32/64 by pairs per expert, dot_scaled."""
    per_expert = tokens * top_k / max(1, num_experts)
    return mx.TileConfig(block_m=16 if per_expert <= 16 else 32 if per_expert <= 48 else 64)


def make_experts(E: int, H: int, I: int, device, seed: int = 0) -> dict:
    """Random E2M1 bytes, E8M0 scales 2^-8..2^-6 (weights ~0.01-0.05), biases ~0.02 (as gpt_oss_step.py)."""
    g = torch.Generator(device).manual_seed(seed)
    u8 = lambda *s, lo=0, hi=256: torch.randint(lo, hi, s, dtype=torch.uint8, device=device, generator=g)  # noqa: E731
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"gu_blocks": u8(E, 2 * I, H // 32, 16), "gu_scales": u8(E, 2 * I, H // 32, lo=119, hi=122),
            "gu_bias": (0.02 * torch.randn(E, 2 * I, device=device, generator=g)).to(dt),
            "dn_blocks": u8(E, H, I // 32, 16), "dn_scales": u8(E, H, I // 32, lo=119, hi=122),
            "dn_bias": (0.02 * torch.randn(E, H, device=device, generator=g)).to(dt)}


def expert_bytes(w: dict) -> int:
    """HBM bytes of one expert: blocks + scales + biases of gate_up and down."""
    return sum(t[0].numel() * t.element_size() for t in w.values())


def routing(kind: str, N: int, E: int, k: int, device, seed: int):
    g = torch.Generator(device).manual_seed(seed)
    if kind == "random":
        ids = torch.rand(N, E, device=device, generator=g).topk(k, -1).indices
    else:  # every token's top-k among the same 2k experts
        pool = torch.randperm(E, device=device, generator=g)[:2 * k]
        ids = pool[torch.rand(N, 2 * k, device=device, generator=g).topk(k, -1).indices]
    return ids, torch.softmax(torch.randn(N, k, device=device, generator=g), -1)


def time_us(fn, iters: int, cuda: bool) -> float:
    """Median us of ``iters`` CUDA-graph replays after 3 warm-up replays (CUDA events); one eager call's wall
    clock on the CPU. gpt_oss_step.time_ms's loop, over step_bench.graphed's replay."""
    from trtllm_dflash.bench.gpt_oss_step import time_ms
    if not cuda:
        return time_ms(fn, 1, 0, False)[0] * 1e3
    from trtllm_dflash.bench.step import graphed
    return statistics.median(time_ms(graphed(fn), iters, 3, True)) * 1e3


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """--iters, --smoke and --out, as this bench and bench/mxfp4_probe.py take them."""
    p.add_argument("--iters", type=int, default=20, help="graph replays per point (the median is reported)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in Triton's interpreter")
    p.add_argument("--out", required=True)


def run_device(args) -> torch.device:
    """The device a run times on: --smoke picks Triton's interpreter on the CPU (set before any kernel module is
    imported: triton.jit reads it when it wraps them), else a CUDA GPU, or a one-line exit naming --smoke."""
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible; use --smoke for the CPU interpreter run")
    return torch.device("cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--tokens", default="1,4,10,40,64")
    p.add_argument("--routings", default="random,concentrated")
    p.add_argument("--configs", default=None, help=f"comma list of {', '.join(CONFIGS)} (default: all)")
    add_run_flags(p)
    args = p.parse_args(argv)
    device = run_device(args)
    cuda = device.type == "cuda"
    from trtllm_dflash.provenance import record
    from trtllm_dflash.runtime import mxfp4_moe as mx
    from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

    shapes = TINY if args.smoke else {m: SHAPES[m] for m in args.models.split(",")}
    table = SMOKE_CONFIGS if args.smoke else CONFIGS
    names = list(table) if args.configs is None else args.configs.split(",")
    tokens = [1, 3] if args.smoke else [int(t) for t in args.tokens.split(",")]
    t_start = time.perf_counter()
    if cuda:
        from trtllm_dflash.bench.step import ceilings
        ceil = ceilings()
    else:
        ceil = {"copy_bw_bytes_per_s": None}
    bw = ceil["copy_bw_bytes_per_s"]
    out = {"benchmark": "mxfp4_bench", "provenance": record([Path(sys.argv[0]).name, *(argv or sys.argv[1:])],
                                                            checkpoints={}),
           "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)", "ceilings": ceil,
           "configs": {n: table[n] for n in names}, "rows": []}
    for model, s in shapes.items():
        E, H, I, k = s["experts"], s["hidden"], s["inter"], s["top_k"]
        w = make_experts(E, H, I, device)
        per_expert = expert_bytes(w)
        for N in tokens:
            for kind in args.routings.split(","):
                ids, weights = routing(kind, N, E, k, device, seed=N)
                x = torch.randn(N, H, device=device).to(torch.bfloat16 if cuda else torch.float32)
                distinct = int(ids.unique().numel())
                ref = None
                for name in names:
                    if name == "old":
                        tiles = old_tiles(mx, N, k, E) if cuda else mx.TileConfig(**table["old"])
                    elif name == "default":
                        tiles = mx.default_tiles(N, k, E)
                    else:
                        tiles = mx.TileConfig(**table[name])
                        if tiles.variant == "gemv" and N > tiles.block_m:  # gemv holds an expert's pairs in one block
                            tiles = dataclasses.replace(tiles, block_m=1 << (N - 1).bit_length())
                    fn = lambda t=tiles, x=x, ids=ids, weights=weights, w=w, E=E: mx.fused_experts(  # noqa: E731
                        x, ids, weights, w["gu_blocks"], w["gu_scales"], w["gu_bias"], w["dn_blocks"], w["dn_scales"],
                        w["dn_bias"], first=0, num_experts=E, limit=7.0, alpha=SWIGLU_ALPHA, tiles=t)
                    row = {"model": model, "tokens": N, "routing": kind, "config": name, "distinct_experts": distinct,
                           "expert_bytes_touched": distinct * per_expert, "tiles": dataclasses.asdict(tiles)}
                    try:
                        y = fn()
                        if ref is None:
                            ref = y.float()
                        row["rel_diff_vs_first_config"] = round(((y.float() - ref).norm() / ref.norm()).item(), 5)
                        row["us"] = round(time_us(fn, args.iters, cuda), 2)
                    except Exception as err:  # noqa: BLE001  a config the compiler refuses is a row, not a crash
                        row["error"] = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
                        out["rows"].append(row)
                        print(f"{model} N={N:3d} {kind:12s} {name:22s} ERROR {row['error']}", flush=True)
                        continue
                    row["gb_per_s"] = round(row["expert_bytes_touched"] / row["us"] / 1e3, 1)
                    row["us_per_distinct_expert"] = round(row["us"] / distinct, 3)
                    if bw:
                        row["bandwidth_fraction"] = round(row["expert_bytes_touched"] / (row["us"] * 1e-6) / bw, 3)
                    out["rows"].append(row)
                    print(f"{model} N={N:3d} {kind:12s} {name:22s} {row['us']:9.1f} us  experts {distinct:3d}  "
                          f"{row['gb_per_s']:8.1f} GB/s" + (f" ({row['bandwidth_fraction']:.0%})" if bw else "") +
                          f"  diff {row['rel_diff_vs_first_config']}", flush=True)
        del w
        if cuda:
            torch.cuda.empty_cache()
    best = {}
    for r in out["rows"]:
        key = f"{r['model']}/N{r['tokens']}/{r['routing']}"
        if "us" in r and (key not in best or r["us"] < best[key]["us"]):
            best[key] = {"config": r["config"], "us": r["us"], "bandwidth_fraction": r.get("bandwidth_fraction")}
    for key, b in best.items():  # the old kernel and default_tiles' choice beside the fastest
        us = {r["config"]: r["us"] for r in out["rows"]
              if f"{r['model']}/N{r['tokens']}/{r['routing']}" == key and "us" in r}
        for name in ("old", "default"):
            if name in us:
                b[f"{name}_us"] = us[name]
        if "old" in us:
            b["best_speedup_over_old"] = round(us["old"] / b["us"], 3)
            if "default" in us:
                b["default_speedup_over_old"] = round(us["old"] / us["default"], 3)
    out["best"] = best
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(best, indent=1))
    print(f"wrote {args.out} ({out['total_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
