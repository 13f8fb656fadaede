# SPDX-License-Identifier: Apache-2.0
"""Where the MXFP4 gemv experts' time goes: the gate_up kernel of runtime/mxfp4_moe.py beside two kernels that do
only part of its work, with its grid, tiles and loads, on the same routed experts:

  stream   the gate and up weight tiles and scales of every chosen expert, loaded as the kernel loads them
           (``_gemv_load``, one step prefetched), folded with an integer xor: the memory side alone;
  decode   the same, and each tile decoded to float32 (``_gemv_decode``) and summed: + the integer decode;
  gate_up  the real kernel (decode + the FMAs with each token's row + SwiGLU), as fused_experts launches it;
  copy     torch's copy of as many contiguous bytes: what the HBM gives a plain stream.

If stream is far below copy, the load pattern (bytes in flight per SM, line use) is the limit; if decode is far
below stream, the integer decode is; gate_up below decode: the FMAs and the rest. Bytes = the distinct experts'
gate_up blocks + scales (the bias is a few KB). CUDA-graph replays, median (bench/mxfp4.py's timing).

  python -m trtllm_dflash.bench.mxfp4_probe --out /tmp/mxfp4_probe.json          # one GPU, ~1 min
  python -m trtllm_dflash.bench.mxfp4_probe --smoke --out /tmp/mxfp4_probe.json  # CPU, Triton's interpreter
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .mxfp4 import SHAPES, TINY, add_run_flags, make_experts, routing, run_device, time_us

PARTS = ("copy", "stream", "decode", "gate_up")


def part_fn(part: str, x, ids, weights, w, tiles, probe):
    """(a callable running one part on this call's routed experts: the gate_up half of fused_experts' gemv path,
    launched as mxfp4_moe.gemv_gate_up_grid lays it out; the K split it runs with; the tensor it writes)."""
    from trtllm_dflash.runtime import mxfp4_moe as mx
    from trtllm_dflash.runtime.kernels import num_sms
    from trtllm_dflash.runtime.kernels.arrival import tile_counters
    from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

    (N, k), (E, two_i, G, _), H = ids.shape, w["gu_blocks"].shape, x.shape[1]
    I, P, dev = two_i // 2, N * k, x.device
    grid, launch = mx.gemv_gate_up_grid(E, k, P, I, H, tiles, num_sms(dev))
    ids_flat = ids.reshape(-1).contiguous()
    gu_b, gu_s = w["gu_blocks"].view(E, two_i, G * 16), w["gu_scales"]
    if part == "copy":
        n_bytes = len(ids.unique()) * (gu_b[0].numel() + gu_s[0].numel())
        src = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        return (lambda: dst.copy_(src)), grid[2], dst
    if part in ("stream", "decode"):
        out = torch.zeros(grid[0] * grid[1] * grid[2], dtype=torch.int32, device=dev)   # unused slots write nothing
        return (lambda: probe[grid](ids_flat, gu_b, gu_s, out, P, E, H, I, gu_b.stride(0), gu_b.stride(1),
                                    gu_s.stride(0), gu_s.stride(1), grid[2], DECODE=part == "decode",
                                    ASM=dev.type == "cuda", **launch)), grid[2], out
    act = torch.empty(P, I, dtype=torch.float32, device=dev)   # as fused_experts' gemv path allocates it
    cnt = tile_counters(dev, grid[0] * grid[1])
    return (lambda: mx.gemv_gate_up(x, ids_flat, k, w["gu_blocks"], gu_s, w["gu_bias"], 0, 7.0, SWIGLU_ALPHA, act,
                                    cnt, grid, launch)), grid[2], act


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--tokens", default="1,4,10", help="tokens per call (gemv's range: decode and DFlash blocks)")
    p.add_argument("--block_n", type=int, default=32, help="the gemv tile's BLOCK_N (its default before tc)")
    p.add_argument("--block_k", type=int, default=256, help="the gemv tile's BLOCK_K (its default before tc)")
    add_run_flags(p)
    args = p.parse_args(argv)
    device = run_device(args)
    cuda = device.type == "cuda"
    import dataclasses

    from trtllm_dflash.bench.mxfp4_probe_kernels import probe_kernel as probe
    from trtllm_dflash.provenance import record
    from trtllm_dflash.runtime import mxfp4_moe as mx

    shapes = TINY if args.smoke else {m: SHAPES[m] for m in args.models.split(",")}
    tokens = [1, 3] if args.smoke else [int(t) for t in args.tokens.split(",")]
    ceil = {"copy_bw_bytes_per_s": None}
    if cuda:
        from trtllm_dflash.bench.step import ceilings
        ceil = ceilings()
    out = {"benchmark": "mxfp4_probe", "provenance": record([Path(sys.argv[0]).name, *(argv or sys.argv[1:])],
                                                             checkpoints={}),
           "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)", "ceilings": ceil,
           "rows": []}
    t0 = time.perf_counter()
    for model, s in shapes.items():
        E, H, I, k = s["experts"], s["hidden"], s["inter"], s["top_k"]
        w = make_experts(E, H, I, device)
        gu_bytes = w["gu_blocks"][0].numel() + w["gu_scales"][0].numel()
        for N in tokens:
            ids, weights = routing("random", N, E, k, device, seed=N)
            x = torch.randn(N, H, device=device).to(torch.bfloat16 if cuda else torch.float32)
            tiles = mx.TileConfig(variant="gemv", block_m=max(16, 1 << (N - 1).bit_length()), block_n=args.block_n,
                                  block_k=args.block_k, split_k=1)
            distinct = int(ids.unique().numel())
            row = {"model": model, "tokens": N, "distinct_experts": distinct, "gate_up_bytes": distinct * gu_bytes,
                   "tiles": dataclasses.asdict(tiles)}
            for part in PARTS:
                fn, row["split"], _ = part_fn(part, x, ids, weights, w, tiles, probe)
                fn()
                us = time_us(fn, args.iters, cuda)
                row[f"{part}_us"] = round(us, 2)
                row[f"{part}_gb_per_s"] = round(row["gate_up_bytes"] / us / 1e3, 1)
                if ceil["copy_bw_bytes_per_s"]:
                    row[f"{part}_bandwidth_fraction"] = round(row["gate_up_bytes"] / (us * 1e-6) / ceil["copy_bw_bytes_per_s"], 3)
            out["rows"].append(row)
            print(f"{model} N={N:3d} experts {distinct:3d} split {row['split']}: " + "  ".join(
                f"{part} {row[f'{part}_us']:8.1f} us ({row[f'{part}_gb_per_s']:7.1f} GB/s)" for part in PARTS), flush=True)
        del w
    out["total_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['total_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
