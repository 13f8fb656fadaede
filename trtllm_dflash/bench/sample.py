# SPDX-License-Identifier: Apache-2.0
"""Sampling + acceptance + commit of one decode step: the torch path (sampling.sample / accept / commit, as
runner.step_tensors runs it) against the Triton kernels (runtime/kernels/sample.py) at several split plans.

    python -m trtllm_dflash.bench.sample --out sample_bench.json            # CUDA: graph replay, ~1 min on an H100
    python -m trtllm_dflash.bench.sample --smoke --out /tmp/sample.json     # CPU: interpreter, tiny shapes

Per (vocab, rows, block, greedy|sampled): microseconds per call (CUDA-graph replay, median of --reps batches),
device kernels per call (torch profiler, eager; CPU ops on a smoke run) and whether every plan's tokens and
accepted counts equal the torch path's. ``summary.best_plan`` is the plan with the lowest geometric-mean time
over all shapes (the candidate default for kernels/sample.py's BLOCK_V / PROGRAMS).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"   # before the kernels are imported

import torch

from trtllm_dflash.bench.step import device_events
from trtllm_dflash.provenance import record
from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.kernels import sample as K
from trtllm_dflash.runtime.sampling import Commit, SamplingBatch, accept, commit, sample

VOCABS = {"smollm2-135m": 49152, "qwen3-8b": 151936}


def inputs(n: int, T: int, V: int, greedy: bool, dev):
    g = torch.Generator(dev).manual_seed(n * 131 + T)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    logits = (3 * torch.randn(n, T, V, device=dev, generator=g)).to(dtype)          # [n, T, V]
    temps = torch.zeros(n, device=dev) if greedy else torch.full((n,), 0.8, device=dev)
    sb = SamplingBatch(temps, torch.zeros(n, dtype=torch.long, device=dev), torch.ones(n, device=dev),
                       torch.arange(n, device=dev) * 7919, greedy, False, False)
    pos = torch.arange(T, device=dev) + 100 + torch.arange(n, device=dev)[:, None]  # [n, T]
    ref = sample(logits, sb, pos)
    draft = None
    if T > 1:   # right for the first T // 2 drafts: a realistic mix of accepted and rejected positions
        draft = ref[:, :-1].clone()
        draft[:, T // 2] += 1
    return logits, sb, pos, draft


def fresh_state(n: int, dev) -> Commit:
    return Commit(torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, dtype=torch.long, device=dev),
                  torch.ones(n, dtype=torch.bool, device=dev), 10**9)


def torch_path(logits, sb, pos, draft, t_out, a_out, state):
    """runner.step_tensors' torch branch (without the TP broadcast, a no-op on one GPU)."""
    t = sample(logits, sb, pos)
    a = accept(draft, t)
    commit(t, a, state)
    t_out.copy_(t)
    a_out.copy_(a)


def timed(fn, dev, reps: int, inner: int) -> float:
    """Microseconds per call: CUDA-graph replay of ``inner`` calls, median over ``reps`` (wall clock on CPU)."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)

    def calls():
        for _ in range(inner):
            fn()
    graph, _ = capture(calls)
    graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(1e3 * a.elapsed_time(b) / inner)
    return statistics.median(times)


def kernels_per_call(fn) -> int:
    """Device kernels of one call (the profiler; CPU ops, nested ones included, on a smoke run)."""
    fn()
    return sum(e.count for e in device_events(fn))


def aten_ops(fn) -> int:
    """torch operators one call dispatches, views aside (each a kernel launch on the GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += not func.is_view
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return Count.n


@torch.inference_mode()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    p.add_argument("--rows", default="1,16,64")
    p.add_argument("--blocks", default="1,16")
    p.add_argument("--plans", default="512:528,1024:528,2048:528,4096:528,1024:1056,2048:264",
                   help="BLOCK_V:PROGRAMS split plans of the kernel to compare")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--inner", type=int, default=10, help="calls per graph replay")
    args = p.parse_args(argv)
    dev = torch.device("cpu" if args.smoke else "cuda")
    vocabs = {"tiny": 96} if args.smoke else VOCABS
    rows = [1, 3] if args.smoke else [int(x) for x in args.rows.split(",")]
    blocks = [1, 4] if args.smoke else [int(x) for x in args.blocks.split(",")]
    plans = [(16, 8), (32, 1)] if args.smoke else [tuple(int(v) for v in s.split(":")) for s in args.plans.split(",")]
    results = []
    for name, V in vocabs.items():
        for n in rows:
            for T in blocks:
                for greedy in (True, False):
                    logits, sb, pos, draft = inputs(n, T, V, greedy, dev)
                    t_out = torch.zeros(n, T, dtype=torch.long, device=dev)
                    a_out = torch.zeros(n, dtype=torch.long, device=dev)
                    ref_state = fresh_state(n, dev)
                    torch_path(logits, sb, pos, draft, t_out, a_out, ref_state)
                    ref_t, ref_a = t_out.clone(), a_out.clone()
                    state = fresh_state(n, dev)
                    ref_fn = partial(torch_path, logits, sb, pos, draft, t_out, a_out, state)
                    row = {"model": name, "vocab": V, "rows": n, "block": T, "mode": "greedy" if greedy else "sampled",
                           "torch_us": timed(ref_fn, dev, args.reps, args.inner),
                           "torch_kernels": kernels_per_call(ref_fn), "torch_aten_ops": aten_ops(ref_fn),
                           "kernel_us": {}, "tokens_equal": True}
                    for bv, pr in plans:
                        st = fresh_state(n, dev)
                        K.sample_accept(logits, sb, pos, draft, t_out, a_out, st, block_v=bv, programs=pr)
                        row["tokens_equal"] &= bool(torch.equal(t_out, ref_t) and torch.equal(a_out, ref_a)
                                                    and torch.equal(st.start, ref_state.start)
                                                    and torch.equal(st.last, ref_state.last))
                        fn = partial(K.sample_accept, logits, sb, pos, draft, t_out, a_out, state, block_v=bv,
                                     programs=pr)
                        row["kernel_us"][f"{bv}:{pr}"] = timed(fn, dev, args.reps, args.inner)
                        row["kernel_kernels"] = kernels_per_call(fn)
                    best = min(row["kernel_us"], key=row["kernel_us"].get)
                    row["best_plan"], row["speedup"] = best, row["torch_us"] / row["kernel_us"][best]
                    results.append(row)
                    print(f"{name} n={n} T={T} {row['mode']}: torch {row['torch_us']:.1f} us "
                          f"({row['torch_kernels']} kernels, {row['torch_aten_ops']} aten ops), "
                          f"kernels {row['kernel_us'][best]:.1f} us at {best} "
                          f"({row['kernel_kernels']} kernels), x{row['speedup']:.1f}, equal={row['tokens_equal']}",
                          flush=True)
    geo = {f"{bv}:{pr}": math.exp(statistics.mean(math.log(r["kernel_us"][f"{bv}:{pr}"]) for r in results))
           for bv, pr in plans}
    summary = {"best_plan": min(geo, key=geo.get), "geomean_us_by_plan": geo,
               "default_plan": f"{K.BLOCK_V}:{K.PROGRAMS}",
               "all_tokens_equal": all(r["tokens_equal"] for r in results),
               **{f"{k}_range": [min(r[k] for r in results), max(r[k] for r in results)]
                  for k in ("torch_kernels", "torch_aten_ops", "kernel_kernels")}}
    argv_ = argv if argv is not None else sys.argv[1:]
    out = {"provenance": record(["python", "-m", "trtllm_dflash.bench.sample", *argv_]),
           "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (Triton interpreter)",
           "summary": summary, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    return 0 if summary["all_tokens_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
