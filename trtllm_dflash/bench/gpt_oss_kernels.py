# SPDX-License-Identifier: Apache-2.0
"""gpt-oss's decode kernels (RuntimeConfig.attention_kernel "triton") against the torch path they replace, on one
GPU at gpt-oss-20b shapes (random weights; bf16):

  attention  the Triton attention with sinks (runtime/kernels/decode_attention.py) vs cache.read +
             gpt_oss.attend_with_sinks, for full and sliding-window (128) layers, T = 1 (AR) and 10 (DFlash
             verify), contexts 4k and 32k; the kernel at several (BLOCK_N, num_warps) tiles and split counts, so
             the defaults can be picked from one run ("best" per shape, and the default's time over the best's);
  router     nn.Linear + top-k + softmax (torch) vs nn.Linear + the top-k/softmax kernel (kernels/router.py),
             32 and 128 experts, 1/10/64 tokens;
  norm       the residual add (+ o_proj bias) + RMSNorm: eager ops vs the compiled kernel;
  target     the gpt-oss-20b target (24 layers, MXFP4 experts on their Triton kernels, gpt_oss_step.py's
             random weights): kernels per layer (profiler, eager forward, 4 layers minus 2 over 2) and the
             CUDA-graph time of one target forward at batch 1 (AR T=1, verify T=10) at context 4096, torch vs triton.

Times are CUDA-graph replays (median of 5 runs of ``--reps`` replays, CUDA events). ~1.5-2 min on an H100
(Triton compiles per tile config and the 20b build take most of it). JSON to --out.
``--smoke`` runs tiny shapes on the CPU (Triton's interpreter; eager timing, meaningless numbers).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


HQ, HKV, D, WINDOW, HIDDEN = 64, 8, 64, 128, 2880
TILES = [(32, 4), (64, 4), (128, 8)]   # (BLOCK_N, num_warps); default at d = 64: BLOCK_N 64, 4 warps (8 past 64 rows)
SPLITS = [None, 1, 8]               # None: num_splits (the default)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpt_oss_kernels_bench.json")
    p.add_argument("--parts", default="attention,router,norm,target")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--ctx", type=int, default=4096, help="context of the target part")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"   # before the kernels are imported
    import torch
    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    bench = Bench(dev, dtype, 2 if args.smoke else args.reps, args.smoke)
    parts = args.parts.split(",")
    t0 = time.time()
    from trtllm_dflash.provenance import record
    out = {"benchmark": "gpt_oss_kernels_bench", "provenance": record(), "dtype": str(dtype), "smoke": args.smoke}
    for part in parts:
        t = time.time()
        out[part] = getattr(bench, part)(args)
        out[f"{part}_s"] = round(time.time() - t, 1)
        Path(args.out).write_text(json.dumps(out, indent=1))    # partial results survive a timeout
    out["total_s"] = round(time.time() - t0, 1)
    out["summary"] = summarize(out)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    return 0


class Bench:
    def __init__(self, dev, dtype, reps: int, smoke: bool):
        import torch
        self.torch, self.dev, self.dtype, self.reps, self.smoke = torch, dev, dtype, reps, smoke

    # ---- timing --------------------------------------------------------------------------------------
    def time_us(self, fn) -> float:
        """Median us of fn() as a CUDA-graph replay (eager wall clock on the CPU)."""
        torch = self.torch
        if self.dev.type != "cuda":
            fn()
            t = time.perf_counter()
            for _ in range(self.reps):
                fn()
            return (time.perf_counter() - t) / self.reps * 1e6
        from trtllm_dflash.runtime.graphs import capture
        graph, _ = capture(fn)   # compiles / warms up outside the capture, as the runner does
        graph.replay()
        runs = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(self.reps):
                graph.replay()
            b.record()
            b.synchronize()
            runs.append(a.elapsed_time(b) * 1e3 / self.reps)
        return round(statistics.median(runs), 2)

    def kernels(self, fn) -> int:
        """Device kernels of one eager fn() (after a warm-up call), from the profiler."""
        from torch.profiler import ProfilerActivity, profile
        torch = self.torch
        fn()
        kind = ProfilerActivity.CUDA if self.dev.type == "cuda" else ProfilerActivity.CPU
        with profile(activities=[kind]) as prof:
            fn()
            if self.dev.type == "cuda":
                torch.cuda.synchronize()
        want = "CUDA" if self.dev.type == "cuda" else "CPU"
        return sum(e.count for e in prof.key_averages() if e.device_type.name == want)

    # ---- parts ---------------------------------------------------------------------------------------
    def attention(self, args) -> list[dict]:
        torch = self.torch
        from trtllm_dflash.runtime.kernels import decode_attention as K
        from trtllm_dflash.runtime.kv_cache import KVCache
        from trtllm_dflash.runtime.models import layers as L
        from trtllm_dflash.runtime.models.gpt_oss import attend_with_sinks
        Hq, Hkv, d = (4, 2, 16) if self.smoke else (HQ, HKV, D)
        shapes = [(T, kv, w) for T in (1, 10) for kv in ((64,) if self.smoke else (4096, 32768))
                  for w in (None, 8 if self.smoke else WINDOW)]
        rows = []
        for T, kv_len, window in shapes:
            g = torch.Generator(self.dev).manual_seed(T + kv_len)
            cache = KVCache(1, 1, Hkv, kv_len, d, self.dtype, self.dev)
            cache.k.normal_(generator=g)
            cache.v.normal_(generator=g)
            q = torch.randn(1, T, Hq, d, device=self.dev, generator=g).to(self.dtype)
            sinks = torch.randn(Hq, device=self.dev, generator=g).to(self.dtype)
            pos = torch.arange(kv_len - T, kv_len, device=self.dev)[None]
            keys = L.KeyRange.causal(pos, window)
            visible = keys.mask(kv_len)        # built once per forward in the model: not timed
            rid = cache.row_ids(slice(0, 1))
            span = None if window is None else window + T - 1

            def torch_path():
                k, v = cache.read(0, slice(0, 1), kv_len)
                return attend_with_sinks(q.transpose(1, 2), k, v, visible, sinks, d ** -0.5)

            row = {"T": T, "kv_len": kv_len, "window": window, "torch_us": self.time_us(torch_path)}
            row["triton_default_us"] = self.time_us(
                lambda: K.attend(q, cache.k[0], cache.v[0], rid, kv_len, keys.lo, keys.hi, d ** -0.5,
                                 sinks=sinks, span=span))
            sweep = []
            for tiles in TILES[:1] if self.smoke else TILES:
                for splits in SPLITS[:2] if self.smoke else SPLITS:
                    us = self.time_us(lambda: K.attend(q, cache.k[0], cache.v[0], rid, kv_len, keys.lo, keys.hi,
                                                       d ** -0.5, splits=splits, sinks=sinks, span=span,
                                                       tiles=tiles))
                    sweep.append({"block_n": tiles[0], "num_warps": tiles[1], "splits": splits or "auto", "us": us})
            best = min(sweep, key=lambda r: r["us"])
            row.update(sweep=sweep, best=best, default_over_best=round(row["triton_default_us"] / best["us"], 3),
                       torch_over_default=round(row["torch_us"] / row["triton_default_us"], 2))
            print(f"attention T={T} kv={kv_len} window={window}: torch {row['torch_us']} us, triton default "
                  f"{row['triton_default_us']} us, best {best}", flush=True)
            rows.append(row)
        return rows

    def router(self, args) -> list[dict]:
        torch = self.torch
        from trtllm_dflash.runtime.kernels import router as R
        H = 64 if self.smoke else HIDDEN
        rows = []
        for E in (32, 128):
            lin = torch.nn.Linear(H, E, device=self.dev, dtype=self.dtype)
            for N in (1, 10, 64):
                x = torch.randn(N, H, device=self.dev, dtype=self.dtype)

                def torch_path():
                    top, ids = lin(x).topk(4, dim=-1)
                    return ids, torch.softmax(top, dim=-1)

                def fused():
                    return R.topk_softmax(lin(x), 4)

                rows.append({"E": E, "N": N, "torch_us": self.time_us(torch_path), "gemm_topk_us": self.time_us(fused),
                             "torch_kernels": self.kernels(torch_path), "gemm_topk_kernels": self.kernels(fused)})
                print(f"router {rows[-1]}", flush=True)
        return rows

    def norm(self, args) -> list[dict]:
        torch = self.torch
        from trtllm_dflash.runtime.models.gpt_oss import GptOssRMSNorm
        H = 64 if self.smoke else HIDDEN
        norm = GptOssRMSNorm(H, 1e-5).to(self.dev, self.dtype)
        bias = torch.randn(H, device=self.dev, dtype=self.dtype)
        rows = []
        for N in (1, 10, 64):
            x, res = (torch.randn(N, H, device=self.dev, dtype=self.dtype) for _ in range(2))
            for fused in (False, True):
                def fn(x=x, res=res, fused=fused):
                    return norm(x, res, bias=bias, fused=fused)
                rows.append({"N": N, "fused": fused, "us": self.time_us(fn), "kernels": self.kernels(fn)})
                print(f"norm {rows[-1]}", flush=True)
        return rows

    def target(self, args) -> dict:
        torch = self.torch
        from trtllm_dflash.bench.gpt_oss_step import build   # its random weights: the 20b target as that benchmark measures it
        from trtllm_dflash.runtime.kv_cache import KVCache
        from trtllm_dflash.runtime.kernels import Kernels
        ctx = 32 if self.smoke else args.ctx
        targets = {kernel: build("gpt-oss-20b", self.smoke, self.dev, self.dtype, ctx + 64,
                                 "dequant" if self.smoke else "triton",
                                 kernels=Kernels.choose(kernel, False, self.dev, self.dtype))[0]
                   for kernel in ("torch", "triton")}   # seeded random weights: the same in both
        target = targets["torch"]
        L_, H, Dh = target.kv_shape()
        cache = KVCache(L_, 1, H, ctx + 64, Dh, self.dtype, self.dev)
        cache.k.normal_(), cache.v.normal_()
        out = {"ctx": ctx, "layers": L_}

        @torch.inference_mode()
        def forward(T):
            ids = torch.full((1, T), 7, device=self.dev)
            pos = torch.arange(ctx, ctx + T, device=self.dev)[None]
            return target(ids, pos, cache, slice(0, 1), ctx + 16)[0]

        for kernel, target in targets.items():
            layers, capture = target.layers, target.capture_layers
            for T in (1, 10):
                counts = {}
                try:   # kernels per layer: 4 layers minus 2 (a sliding and a full layer each), over 2
                    target.capture_layers = ()
                    for k in (2, 4):
                        target.layers = torch.nn.ModuleList(list(layers)[:k])
                        counts[k] = self.kernels(lambda: forward(T))
                finally:
                    target.layers, target.capture_layers = layers, capture
                out[f"{kernel}_T{T}"] = {"kernels_per_layer": (counts[4] - counts[2]) / 2,
                                         "kernels_rest": 2 * counts[2] - counts[4],
                                         "forward_us": self.time_us(lambda: forward(T))}
                print(f"target {kernel} T={T}: {out[f'{kernel}_T{T}']}", flush=True)
        return out


def summarize(out: dict) -> dict:
    s = {}
    for row in out.get("attention", []):
        key = f"attention_T{row['T']}_kv{row['kv_len']}_{'sliding' if row['window'] else 'full'}"
        s[key] = {"torch_us": row["torch_us"], "triton_default_us": row["triton_default_us"],
                  "best_us": row["best"]["us"], "best": {k: row["best"][k] for k in ("block_n", "num_warps", "splits")},
                  "default_over_best": row["default_over_best"]}
    for row in out.get("router", []):
        s[f"router_E{row['E']}_N{row['N']}"] = {k: row[k] for k in ("torch_us", "gemm_topk_us", "torch_kernels",
                                                                      "gemm_topk_kernels")}
    for row in out.get("norm", []):
        s[f"norm_N{row['N']}_{'fused' if row['fused'] else 'eager'}"] = {"us": row["us"], "kernels": row["kernels"]}
    if "target" in out:
        s["target"] = dict(out["target"])
    return s


if __name__ == "__main__":
    raise SystemExit(main())
