# SPDX-License-Identifier: Apache-2.0
"""The decode-path Triton GEMMs (runtime/kernels/gemm.py) against what they replace, one GPU.

    python -m trtllm_dflash.bench.gemm --out gemm_h100.json
    python -m trtllm_dflash.bench.gemm --smoke --out /tmp/gemm_smoke.json   # tiny shapes, CPU, Triton's interpreter

For each model's (--models, public configs) qkv_proj (plain), o_proj and down_proj (with the residual add in the
epilogue), gate_up_proj (with SiLU(gate) * up in the epilogue) and lm_head (plain; TargetHead.logits routes it as the
others) at M rows (--M): cuBLAS F.linear alone and with its torch epilogue
(the residual add; the compiled silu_mul), against the Triton kernel's default launch (plain_config's tile and K split
for a plain projection, pick_config's for the gated one), pick_config's tile unsplit and a few other tile configs.
Every variant is captured in a CUDA graph (as the runtime replays decode steps) and the replay timed with CUDA
events, median of --reps. Each replay runs the GEMM over copies of the weight
totalling >= 256 MB, so weights stream from HBM rather than from the 50 MB L2; times are per GEMM.
Bandwidth = bytes that must move (weight + x + out, + residual) / time, and its fraction of the copy bandwidth
measured in the same run. In the runtime the unfused residual add rides in the next add + RMSNorm kernel, so for
qkv / o_proj / down the baseline that counts is cuBLAS alone; for gate_up it is cuBLAS + silu_mul.
``triton_invariant`` is the batch-invariant mode's tile (invariant_config: pick_config's own tile up to
INVARIANT_DECODE_ROWS rows, so absent there, and the compute tile above, so ``--M 1,16,64,256,1024`` times it at 256
and 1,024 rows against the default tile; the row's ``invariant_config``, the printed ``triton_invariant[tile]`` and
``best`` name it). The summary's ``best`` is the fastest config per shape,
``default`` the default launch's: where best beats default clearly, the default should be changed; where cuBLAS beats
the best Triton config at some M, GEMM_MAX_ROWS (or a per-shape rule) should route that M to cuBLAS. A config that fails
to compile is recorded under "errors".

``--compile_only 90`` needs no GPU: it compiles the kernel for sm_90 with Triton's own compiler and ptxas at every
shape and config above, the batch-invariant tile included (specialized as a launch would be: 16-byte-aligned
pointers, ints divisible by 16 marked so) and reports shared memory, registers and spills (cuobjdump), whether the
loads are pipelined (cp.async) and whether tl.dot became wgmma; a config over the 227 KB of shared memory a block
may use on an H100 is an error (it would fail at launch).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


COLD_BYTES = 256 * 1024**2   # weight bytes cycled per timed replay (> L2)
SMOKE_SHAPES = {"tiny": {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2,
                         "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 80}}


def gemms(cfg: dict) -> list[tuple[str, int, int, str]]:
    """(name, K, N output columns, epilogue) of a decoder layer's GEMMs at tp 1, and the lm_head; for a DFlash
    drafter's config (``dflash_config``) its fc over the target's hidden states instead (the head is the target's)."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim", hidden // cfg["num_attention_heads"])
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    layer = [("qkv_proj", hidden, (heads + 2 * kv) * d, "none"), ("o_proj", heads * d, hidden, "residual"),
             ("gate_up_proj", hidden, inter, "silu_mul"), ("down_proj", inter, hidden, "residual")]
    if "dflash_config" in cfg:
        return [("fc", len(cfg["dflash_config"]["target_layer_ids"]) * hidden, hidden, "none"), *layer]
    return [*layer, ("lm_head", hidden, cfg["vocab_size"], "none")]


def model_shapes(models: str) -> dict[str, dict]:
    """--models: target names (bench/step.py's), each optionally as NAME:drafter for its DFlash drafter's GEMMs."""
    from trtllm_dflash.bench.step import drafter_config, target_config
    out = {}
    for m in models.split(","):
        name, _, part = m.partition(":")
        if part not in ("", "drafter"):
            raise SystemExit(f"--models {m}: write NAME or NAME:drafter")
        out[m] = drafter_config(name) if part else target_config(name)
    return out


def candidates(G, M: int, smoke: bool) -> list:
    """Tile configs tried besides pick_config's: FMA (GEMV) tiles at M = 1, tl.dot tiles of BLOCK_N 16..64."""
    C = G.Config
    if smoke:
        return [C(1, 16, 16), C(16, 16, 32, 4, 2)]
    # the 32-column tiles at both K steps at every M: gate_up + SiLU's best on an H200 were m16n32k256 at one row and
    # m16n32k128 at ten (benchmarks/results/gemm_split_h200/gemm_plain_config_h200.json), each timed at one M only
    if M == 1:   # FMA tiles down to 4 columns: more programs where N is small (SmolLM2: 576)
        return [C(1, 32, 256, 4, 3), C(1, 16, 512, 4, 3), C(1, 4, 1024, 4, 3), C(16, 16, 256, 4, 4),
                C(16, 32, 256, 4, 4), C(16, 32, 128, 4, 4), C(16, 64, 128, 4, 4)]
    bm = G.dot_block_m(M)
    return [C(bm, 16, 256, 4, 3), C(bm, 32, 128, 4, 4), C(bm, 32, 256, 4, 3), C(bm, 64, 64, 4, 4)]


def tile_plan(G, M: int, N: int, K: int, gated: bool, elem: int, sms: int, smoke: bool = False):
    """The tiles one GEMM shape is timed (or compiled) under: (default tile, its K slices, pick_config's tile, the
    batch-invariant mode's tile, every tile to try: the default first, each once). The default is the runtime's
    launch: plain_config for a plain projection, pick_config unsplit for the gated GEMM."""
    pick = G.pick_config(M, N, K, gated, elem, sms)
    default, default_split = (pick, 1) if gated else G.plain_config(M, N, K, elem, sms)
    invariant = G.invariant_config(M, N, K, gated, elem, sms)
    return default, default_split, pick, invariant, list(dict.fromkeys([default, pick, *candidates(G, M, smoke),
                                                                        invariant]))


def label(c) -> str:
    return f"m{c.block_m}n{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}"


def bench_shape(G, model, name, K, N, epilogue, M, args, dev, dtype, cuda_time, graphed, bw, errors) -> dict:
    gated = epilogue == "silu_mul"
    rows = 2 * N if gated else N
    elem = torch.finfo(dtype).bits // 8
    w_bytes = rows * K * elem
    copies = max(1, math.ceil(COLD_BYTES / w_bytes)) if dev.type == "cuda" else 1
    gen = torch.Generator(dev).manual_seed(0)
    ws = [torch.randn(rows, K, generator=gen, device=dev, dtype=dtype) / K ** 0.5 for _ in range(copies)]
    x = torch.randn(M, K, generator=gen, device=dev, dtype=dtype)
    r = torch.randn(M, N, generator=gen, device=dev, dtype=dtype) if epilogue == "residual" else None
    moved = w_bytes + (M * K + M * N * (2 if r is not None else 1)) * elem   # weight + x + out (+ residual)
    from trtllm_dflash.runtime.models.layers import silu_mul

    def triton(cfg, split=1):
        if gated:
            return lambda: [G.gate_up_silu(x, w, cfg) for w in ws]
        return lambda: [G.linear(x, w, None, r, cfg, split=split) for w in ws]

    variants = {"cublas": lambda: [F.linear(x, w) for w in ws]}
    if gated:
        variants["cublas_epilogue"] = lambda: [silu_mul(F.linear(x, w)) for w in ws]
    elif r is not None:
        variants["cublas_epilogue"] = lambda: [F.linear(x, w) + r for w in ws]
    sms = G.num_sms(dev)
    # pick_config's tile unsplit: the launch before plain_config; the batch-invariant tile: its cost at this M
    default, default_split, pick, invariant, tried = tile_plan(G, M, N, K, gated, elem, sms, args.smoke)
    configs = {"default": default, **{label(c): c for c in tried[1:] if c != invariant}}
    if invariant != default:
        configs["invariant"] = invariant
    for key, c in configs.items():
        first = default_split if key == "default" else 1
        variants[f"triton_{key}"] = triton(c, first)
        split = 1 if gated or key == "invariant" else G.split_for(c, M, N, K, sms)
        if split != first:   # each plain projection's tile also with K split as split_for says
            variants[f"triton_{key}_" + (f"split{split}" if split > 1 else "nosplit")] = triton(c, split)

    # the default config against float64 here (tests/gpu/test_gemm_cuda.py checks every candidate config)
    y64 = x.double() @ ws[0].double().T
    want = F.silu(y64[:, :N]) * y64[:, N:] if gated else y64 + (r.double() if r is not None else 0)
    got = triton(default, default_split)()[0]
    row = {"model": model, "gemm": name, "epilogue": epilogue, "M": M, "N": N, "K": K, "weight_copies": copies,
           "bytes": moved, "default_config": label(default), "default_split": default_split,
           "pick_config": label(pick), "invariant_config": label(invariant),
           "default_rel_err_vs_f64": ((got.double() - want).norm() / want.norm()).item(), "us": {}}
    for key, fn in variants.items():
        try:
            run = graphed(fn) if dev.type == "cuda" else fn
            row["us"][key] = 1e6 * cuda_time(run, args.reps) / copies
        except Exception as err:   # noqa: BLE001 - a config that does not compile here is data, not a crash
            errors[f"{model}/{name}/M{M}/{key}"] = repr(err)[:500]
    row["GBps"] = {k: moved / us / 1e3 for k, us in row["us"].items()}
    row["bw_fraction"] = {k: moved / (us * 1e-6) / bw for k, us in row["us"].items()}
    tri = {k: v for k, v in row["us"].items() if k.startswith("triton_")}
    if tri:
        best = min(tri, key=tri.get)
        row["best_variant"] = best
        row["best"] = {"triton_default": label(default), "triton_invariant": label(invariant)}.get(
            best, best.removeprefix("triton_"))
        row["best_us"] = tri[best]
        base = row["us"].get("cublas_epilogue" if gated else "cublas")
        row["default_speedup_vs_baseline"] = base / tri["triton_default"] if base and "triton_default" in tri else None
        row["best_speedup_vs_baseline"] = base / tri[best] if base else None
    shown = {"triton_invariant": f"triton_invariant[{label(invariant)}]"}
    print(f"{model:14s} {name:13s} M={M:4d} N={N:6d} K={K:6d}  " + "  ".join(
        f"{shown.get(k, k)}={v:.1f}us({row['bw_fraction'][k]:.0%})" for k, v in row["us"].items()
        if k in ("cublas", "cublas_epilogue", "triton_default", "triton_invariant")
        or k == f"triton_{row.get('best')}")
        + f"  best={row.get('best')} invariant={label(invariant)} err={row['default_rel_err_vs_f64']:.1e}", flush=True)
    return row


KERNEL_ARGS = ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "out_ptr", "part_ptr", "cnt_ptr", "M", "N", "K", "k_per", "up_off",
               "s_xm", "s_wn", "s_rm", "s_om")
POINTER_TYPES = {"part_ptr": "*fp32", "cnt_ptr": "*i32"}   # the split-K partials and tile counters; the rest bf16


def compile_stats(G, cfg, epilogue: str, M: int, N: int, K: int, arch: int, split: int = 1) -> dict:
    """Compile _gemm_kernel for sm_<arch> (no GPU needed) as a bf16 launch at these shapes would specialize it
    (``split`` K slices per tile)."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    gated = epilogue == "silu_mul"
    consts = G.constexprs(cfg, N, K, gated, False, epilogue == "residual", torch.bfloat16, split)
    values = dict(M=M, N=N, K=K, k_per=G.slice_k(K, cfg.block_k, split), up_off=N if gated else 0,
                  s_xm=K, s_wn=K, s_rm=N, s_om=N)
    sig = {a: POINTER_TYPES.get(a, "*bf16") if a.endswith("_ptr") else "i32" for a in KERNEL_ARGS} | {
        c: "constexpr" for c in consts}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(KERNEL_ARGS)
             if a.endswith("_ptr") or values[a] % 16 == 0 and values[a]}
    k = triton.compile(ASTSource(fn=G._gemm_kernel, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return {"shared": k.metadata.shared, "regs": regs and int(regs.group(1)), "stack": stack and int(stack.group(1)),
            "pipelined": "cp.async" in k.asm["ptx"], "wgmma": "wgmma" in k.asm["ptx"]}


def compile_only(G, shapes: dict, ms: list[int], arch: int, result: dict) -> None:
    done = {}
    for model, cfg in shapes.items():
        for name, K, N, epilogue in gemms(cfg):
            for M in ms:
                gated = epilogue == "silu_mul"
                default, default_split, pick, invariant, tried = tile_plan(G, M, N, K, gated, 2, 132)
                launches = []
                for c in tried:
                    # plain projections also with K split as split_for says (what the timing run tries too)
                    split = 1 if gated else G.split_for(c, M, N, K, 132)
                    launches += [(c, 1)] + ([(c, split)] if split > 1 else [])
                for c, split in dict.fromkeys(launches):
                    key = (c, epilogue, N % c.block_n == 0 and K % c.block_k == 0, M == 1, split)
                    tag = f"{model}/{name}/M{M}/{label(c)}" + (f"/split{split}" if split > 1 else "")
                    if key not in done:
                        try:
                            done[key] = compile_stats(G, c, epilogue, M, N, K, arch, split)
                        except Exception as err:   # noqa: BLE001 - recorded, the others still compile
                            done[key] = {"error": repr(err)[:500]}
                    row = {"model": model, "gemm": name, "M": M, "config": label(c),
                           "default": c == default and split == default_split, "pick": c == pick and split == 1,
                           "invariant": c == invariant and split == 1,
                           "split": split, **done[key]}
                    result["rows"].append(row)
                    if "error" in row:
                        result["errors"][tag] = row["error"]
                    elif row["shared"] > G.MAX_SMEM:
                        result["errors"][tag] = f"{row['shared']} bytes of shared memory > {G.MAX_SMEM}"
                    print(f"{tag}: " + " ".join(f"{k}={v}" for k, v in done[key].items())
                          + (" (default)" if row["default"] else "") + (" (invariant)" if row["invariant"] else ""),
                          flush=True)


def summarize(rows: list[dict]) -> dict:
    out = {}
    for r in rows:
        if "best" not in r or "triton_default" not in r["us"] or r["default_speedup_vs_baseline"] is None:
            continue
        out[f"{r['model']}/{r['gemm']}/M{r['M']}"] = {
            "default": r["default_config"], "default_us": round(r["us"]["triton_default"], 2),
            "default_bw_fraction": round(r["bw_fraction"]["triton_default"], 3),
            "best": r["best"], "best_us": round(r["best_us"], 2),
            "best_bw_fraction": round(r["bw_fraction"][r["best_variant"]], 3),
            "baseline_us": round(r["us"]["cublas_epilogue" if r["epilogue"] == "silu_mul" else "cublas"], 2),
            "default_speedup_vs_baseline": round(r["default_speedup_vs_baseline"], 3)}
    # the goal: the 8B shapes stream weights at >= 85% of the copy bandwidth at M = 1 (else cuBLAS there)
    out["m1_8b_default_bw_fraction"] = {k: v["default_bw_fraction"] for k, v in out.items()
                                        if k.endswith("/M1") and "8b" in k}
    return out


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for every number")
    p.add_argument("--models", default="smollm2-135m,qwen3-8b,llama-3.1-8b",
                   help="targets, comma-separated; NAME:drafter times that model's DFlash drafter "
                        "(gpt-oss-120b:drafter)")
    p.add_argument("--M", default="1,16,64,128", type=ints, help="rows per GEMM (requests x block tokens)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in Triton's interpreter")
    p.add_argument("--compile_only", type=int, metavar="ARCH", help="no GPU: compile for sm_ARCH (90 = H100), report")
    args = p.parse_args(argv)
    if args.compile_only:
        from trtllm_dflash.provenance import record
        from trtllm_dflash.runtime.kernels import gemm as G
        result = {"meta": {"compile_only": f"sm_{args.compile_only}", "triton": __import__("triton").__version__},
                  "provenance": record(["python", "-m", "trtllm_dflash.bench.gemm", *(argv or sys.argv[1:])]),
                  "rows": [], "errors": {}}
        compile_only(G, model_shapes(args.models), args.M, args.compile_only, result)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"errors: {len(result['errors'])}" + "".join(f"\n  {k}: {v}" for k, v in result["errors"].items()))
        return 1 if result["errors"] else 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"   # before the kernels are imported
        args.M, args.reps = [m for m in args.M if m <= 16] or [1], 1
    elif not torch.cuda.is_available():
        p.error("needs a CUDA GPU (or --smoke)")
    from trtllm_dflash.bench.step import ceilings, cuda_time, graphed

    from trtllm_dflash.provenance import record
    from trtllm_dflash.runtime.kernels import GEMM_MAX_ROWS, gemm as G

    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    meta = {"device": "cpu (smoke, Triton interpreter)" if args.smoke else torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": __import__("triton").__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "dtype": str(dtype).removeprefix("torch."),
            "sms": G.num_sms(dev), "gemm_max_rows": GEMM_MAX_ROWS, **ceilings(args.smoke)}
    print(json.dumps(meta), flush=True)
    result = {"meta": meta, "provenance": record(["python", "-m", "trtllm_dflash.bench.gemm", *(argv or sys.argv[1:])]),
              "rows": [], "errors": {}}
    shapes = SMOKE_SHAPES if args.smoke else model_shapes(args.models)
    with torch.inference_mode():
        for model, cfg in shapes.items():
            for name, K, N, epilogue in gemms(cfg):
                for M in args.M:
                    try:
                        result["rows"].append(bench_shape(G, model, name, K, N, epilogue, M, args, dev, dtype,
                                                          cuda_time, graphed, meta["copy_bw_bytes_per_s"],
                                                          result["errors"]))
                    except Exception as err:   # noqa: BLE001 - recorded; the other shapes still run
                        result["errors"][f"{model}/{name}/M{M}"] = repr(err)[:500]
                        print(f"{model}/{name}/M{M}: {err!r}", flush=True)
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
    result["summary"] = summarize(result["rows"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"errors: {len(result['errors'])}" + "".join(f"\n  {k}: {v}" for k, v in result["errors"].items()))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
