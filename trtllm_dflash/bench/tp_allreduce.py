# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism's all-reduce alone: microseconds per call, NCCL vs the one-shot over peer memory, by size.

    mpirun --allow-run-as-root -n 2 python3 -m trtllm_dflash.bench.tp_allreduce --out tp_allreduce_2.json
    mpirun --allow-run-as-root -n 4 python3 -m trtllm_dflash.bench.tp_allreduce --out tp_allreduce_4.json

Each point: ``--calls`` back-to-back all-reduces of one bf16 tensor captured in one CUDA graph (how the decode step
runs them), the graph replayed ``--iters`` times; per call = replay time / calls; rank 0's median and the slowest
rank's. The one-shot path (runtime/allreduce.py) is timed up to its max_bytes (--max_bytes); NCCL at every size,
with NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off, as the runtime runs) set
before the group forms. Both results are checked against each other first (max abs difference in the JSON).

Then the decode layer's whole tail after a row-parallel projection, all-reduce + residual add + RMSNorm, at the
hidden size ``--hidden`` for each message size that is a whole number of rows: NCCL then the norm kernel, the
one-shot all-reduce then the norm kernel, and the two kernels that do all three (kernels/allreduce_norm.py): the one
that meets the peers at barriers ("fused") and the Lamport kernel that pushes into the peers' buffers and polls its
own ("lamport", up to allreduce.LAMPORT_MAX_ROWS rows). The plain all-reduce is timed on the Lamport kernel too, the
message as rows of 4096 values.

The barrier kernel is timed up to ``--barrier_max_rows`` rows (16): the runtime routes no rows to it since the
Lamport kernel (allreduce.FUSED_MAX_ROWS = 0), and at 64 rows x 4096 (512 KB) on two H200s its 100-call graph never
finished (benchmarks/results/tp_h200x2_full_slot/), which took the whole run with it. Rows past the limit say so in
the JSON (``fused_skipped``); ``--barrier_max_rows 64`` times it anyway.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

DEFAULT_SIZES = "2K,8K,16K,32K,64K,128K,256K,512K,1M,4M"


def parse_size(text: str) -> int:
    """'8K' -> 8192, '1M' -> 1048576, '300' -> 300 (bytes)."""
    scale = {"K": 1024, "M": 1024 ** 2}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def per_call_us(fn, calls: int, iters: int, warmup: int = 3) -> list[float]:
    """Microseconds per call of ``fn`` (graph-safe device work), ``calls`` of them captured in one graph."""
    for _ in range(warmup):   # eager warm-up (NCCL's communicator, one-shot's first barrier) before the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(1e3 * start.elapsed_time(end) / calls)
    return out


def say(tp, text: str) -> None:
    """Rank 0's progress on stderr, before each point: a point that never returns (a collective waiting on a peer)
    is then named in the log rather than lost with the results, which are written at the end."""
    if tp.rank == 0:
        print(f"[tp_allreduce] {text}", file=sys.stderr, flush=True)


def measure(tp, sizes: list[int], calls: int, iters: int) -> list[dict]:
    """Rows of (bytes, strategy, us per call) on this rank; ``tp``: a TPGroup with its one-shot all-reduce."""
    import torch.distributed as dist
    rows = []
    small = tp.small_all_reduce
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda",
                        generator=torch.Generator("cuda").manual_seed(tp.rank))
        nccl_x = x.clone()
        dist.all_reduce(nccl_x)
        ways = {"nccl": lambda: dist.all_reduce(x)}
        row = {"bytes": nbytes}
        if small is not None and small.handles(x):
            say(tp, f"{nbytes} B: checks against NCCL")
            row["max_abs_diff_vs_nccl"] = (small.one_shot(x).float() - nccl_x.float()).abs().max().item()
            ways["oneshot"] = lambda: small.one_shot(x)
            rows_x = x.view(-1, min(x.numel(), 4096))   # the Lamport kernel takes rows: of a decode layer's width
            if nbytes % (2 * 4096) == 0 or x.numel() < 4096:
                if small.pushes(rows_x):
                    row["lamport_max_abs_diff_vs_nccl"] = (
                        small.lamport_call(rows_x)[0].flatten().float() - nccl_x.float()).abs().max().item()
                    ways["lamport"] = lambda: small.lamport_call(rows_x)
        for name, fn in ways.items():
            say(tp, f"{nbytes} B: {name}")
            us = per_call_us(fn, calls, iters)
            row[f"{name}_us"] = round(statistics.median(us), 2)
        rows.append(row)
    return rows


def measure_fused(tp, sizes: list[int], hidden: int, calls: int, iters: int, barrier_max_rows: int = 16) -> list[dict]:
    """Rows of (bytes, rows, us per call) of all-reduce + add + RMSNorm, unfused on NCCL and on one-shot, and fused
    (the barrier kernel up to ``barrier_max_rows`` rows, the Lamport kernel where the runtime takes it)."""
    import torch.distributed as dist

    from trtllm_dflash.runtime.kernels import Kernels
    from trtllm_dflash.runtime.models.layers import RMSNorm
    small, out = tp.small_all_reduce, []
    norm = RMSNorm(hidden, 1e-6, Kernels(triton=True, sampling=True)).to("cuda", torch.bfloat16)
    for nbytes in sizes:
        rows = nbytes // (2 * hidden)
        if rows < 1 or rows * hidden * 2 != nbytes or small is None or not small.handles(
                torch.empty(rows, hidden, dtype=torch.bfloat16, device="cuda")):
            continue
        g = torch.Generator("cuda").manual_seed(tp.rank)
        x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda", generator=g)
        residual = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda",
                               generator=torch.Generator("cuda").manual_seed(99))

        def nccl():
            y = x.clone()
            dist.all_reduce(y)
            return norm(y, residual)

        ways = {"nccl_norm": nccl, "oneshot_norm": lambda: norm(small.one_shot(x), residual)}
        row = {"bytes": nbytes, "rows": rows, "hidden": hidden}
        if rows <= barrier_max_rows:
            ways["fused"] = lambda: small.barrier_add_rms_norm(x, residual, norm.weight, norm.eps)
        else:
            row["fused_skipped"] = f"{rows} rows > --barrier_max_rows {barrier_max_rows} (the runtime does not use it)"
        if small.pushes(x):
            ways["lamport"] = lambda: small.lamport_call(x, residual, norm.weight, norm.eps)
        say(tp, f"{rows} x {hidden} + add + norm: checks")
        want = ways["oneshot_norm"]()[1]
        if "fused" in ways:
            row["fused_total_equals_oneshot_norm"] = torch.equal(ways["fused"]()[0], want)
        if "lamport" in ways:
            row["lamport_total_equals_oneshot_norm"] = torch.equal(ways["lamport"]()[0], want)
        for name, fn in ways.items():
            say(tp, f"{rows} x {hidden} + add + norm: {name}")
            row[f"{name}_us"] = round(statistics.median(per_call_us(fn, calls, iters)), 2)
        out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="message sizes in bytes (K, M suffixes)")
    p.add_argument("--max_bytes", type=parse_size, default=None,
                   help="largest message of the one-shot path (default: the runtime's, allreduce.ONESHOT_MAX_BYTES)")
    p.add_argument("--calls", type=int, default=100, help="all-reduces per graph")
    p.add_argument("--iters", type=int, default=20, help="graph replays timed per point")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size of the all-reduce + add + norm rows (Qwen3-8B's)")
    p.add_argument("--barrier_max_rows", type=int, default=16,
                   help="time the barrier kernel (\"fused\") up to this many rows (default 16: it stalled at 64 rows "
                        "x 4096 on two H200s, and the runtime routes no rows to it)")
    p.add_argument("--out", required=True, help="rank 0's results JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

    from trtllm_dflash.provenance import record
    from trtllm_dflash.runtime import allreduce
    from trtllm_dflash.runtime.distributed import init_tp, launcher_rank_and_size

    rank, size = launcher_rank_and_size()
    if size < 2:
        raise SystemExit("1 rank started: start it with `mpirun -n 2 python -m trtllm_dflash.bench.tp_allreduce ...`")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU is visible: the one-shot all-reduce runs over CUDA peer memory")
    max_bytes = args.max_bytes or allreduce.ONESHOT_MAX_BYTES
    tp = init_tp(size, torch.device("cuda"), allreduce_strategy="nccl")
    tp.small_all_reduce = allreduce.make_small_all_reduce("oneshot", torch.device("cuda", torch.cuda.current_device()),
                                                          rank, max_bytes)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = measure(tp, sizes, args.calls, args.iters)
    fused = measure_fused(tp, sizes, args.hidden, args.calls, args.iters, args.barrier_max_rows)
    import torch.distributed as dist
    every = [None] * size
    dist.all_gather_object(every, rows)
    if rank == 0:
        for i, row in enumerate(rows):   # the slowest rank bounds a collective
            for key in ("nccl_us", "oneshot_us", "lamport_us"):
                if key in row:
                    row[key.replace("_us", "_us_slowest_rank")] = max(r[i][key] for r in every)
        small = [r for r in rows if "oneshot_us" in r and r["bytes"] <= 64 * 1024]
        res = {"benchmark": "tp_allreduce", "tp_size": size, "gpu": torch.cuda.get_device_name(),
               "torch": torch.__version__, "dtype": "bfloat16", "calls_per_graph": args.calls, "iters": args.iters,
               "oneshot_max_bytes": max_bytes,
               "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
               "provenance": record(["mpirun", "-n", str(size), "python", "-m", "trtllm_dflash.bench.tp_allreduce",
                                     *(argv if argv is not None else sys.argv[1:])]),
               "rows": rows, "add_norm_rows": fused,
               "summary": {"oneshot_us_max_up_to_64k": max((r["oneshot_us"] for r in small), default=None),
                           "lamport_us_max_up_to_64k": max((r["lamport_us"] for r in small if "lamport_us" in r),
                                                           default=None),
                           "nccl_us_max_up_to_64k": max((r["nccl_us"] for r in rows if r["bytes"] <= 64 * 1024),
                                                        default=None)}}
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        for r in rows + fused:
            print(r, flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)   # as tp.py: nothing left to release, and an NCCL teardown has hung before


if __name__ == "__main__":
    sys.exit(main())
