# SPDX-License-Identifier: Apache-2.0
"""gpt-oss with tensor + expert parallelism (TP 2 with EP 2 and with EP 1) in one MPI job: tokens equal to TP 1,
then step times at the gpt-oss-120b shapes with MXFP4 experts (NCCL + CUDA graphs on GPUs, gloo on the CPU).

    mpirun --allow-run-as-root -n 2 python3 -m trtllm_dflash.bench.gpt_oss_tp --out $OUT/gpt_oss_120b_tp2_h200x2.json
    mpiexec -n 2 python -m trtllm_dflash.bench.gpt_oss_tp --tiny --device cpu --out /tmp/gpt_oss_tp.json   # CPU smoke

1. tokens: a tiny random MXFP4 gpt-oss pair (trtllm_dflash.testing's writer: 4 layers, sliding window 8, 4 experts top-2,
   prompts longer than the window) in float32, experts dequantised and, on CUDA, kept MXFP4 in the Triton kernels:
   the engine at TP N with each EP size, greedy and sampled requests, against the same engine at TP 1. Every
   rank runs TP 1 first (on its own device), so none waits in the rendezvous meanwhile. CUDA graphs on, except
   for float32 experts dequantised on CUDA (their per-expert GEMM fallback reads offsets on the host).
2. steps: the real shapes (--tiny: gpt_oss_step.py's tiny ones), random weights made on each rank for its shard
   only (gpt_oss_step.build: seeded per tensor, so replicated tensors are identical on every rank), experts kept
   MXFP4 in the Triton kernels on CUDA: the AR step and the DFlash step (block 10: the z-lab gpt-oss-120b
   drafter's 8 layers) at each batch size, CUDA graphs on, for each EP size; then the same points at TP 1 on
   every GPU (the same-run reference for the speed-up; --no_tp1 skips it).
   Per row: rank 0's median step time and every rank's; each rank's roofline (the bytes that must cross its
   HBM: its shard of the non-expert weights, the distinct experts it serves that the step's tokens chose, its
   KV heads; over the copy bandwidth measured on its GPU in this run) and the step's, the slowest rank's; and
   the all-reduces and all-gathers one step issues (counted in one eager step).
Every rank builds its modules with the decode kernels RuntimeConfig.kernels chooses (``--kernels``; auto: the
Triton attention, GEMMs, norms, router and sampling on CUDA), the same kernels as the TP 1 rows and gpt_oss_step.py.
Random routing touches near the worst case of distinct experts (min(E, tokens x top-k) per layer).
Rank 0 rewrites the JSON after every result (a run cut short keeps what it measured); all ranks leave with
os._exit (tp_bench.py's first H200 run hung in the NCCL teardown after writing its results).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


from trtllm_dflash.bench.gpt_oss_step import TARGETS, TINY, TINY_DRAFTER, ByteModel, Steps, build, distinct_experts, nbytes, time_ms
from trtllm_dflash.bench.step import ceilings, graphed
from trtllm_dflash.bench.tp_flags import add_rank_engine_flags

from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.provenance import record
from trtllm_dflash.runtime.distributed import TPGroup, init_tp, launcher_rank_and_size
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import Kernels


# ---- 1. tokens: TP N == TP 1 on a tiny pair ---------------------------------------------------------------
def tiny_pair(root: Path) -> tuple[Path, Path]:
    """The tiny MXFP4 gpt-oss pair; every rank writes its own copy (same seeds, same bytes: no shared disk)."""
    from trtllm_dflash.testing import write_gpt_oss_drafter, write_tiny_gpt_oss
    target = write_tiny_gpt_oss(root / "target", mxfp4=True, seed=2)  # hidden 64, intermediate 64: 32 per rank at EP 1
    return target, write_gpt_oss_drafter(target, root / "drafter")


def graphs_for(device: str, experts: str) -> bool:
    """CUDA graphs for the tokens check, except float32 experts dequantised on CUDA: gpt_oss._grouped_mm runs
    those one GEMM per expert, reading the group offsets on the host, which a graph capture cannot."""
    return device == "cuda" and experts != "dequant"


def engine_tokens(target: Path, drafter: Path, device: str, experts: str, tp_size: int, ep_size: int,
                  kernels: str = "auto", allreduce_strategy: str = "auto"):
    """Output ids of the fixed greedy + sampled requests (rank 0; None on the other ranks of a TP group);
    ``kernels``, ``allreduce_strategy``: RuntimeConfig's."""
    from trtllm_dflash.testing import GPT_OSS_TP_PARAMS as PARAMS, GPT_OSS_TP_PROMPTS as PROMPTS
    cfg = RuntimeConfig(max_seq_len=128, max_batch_size=2, dtype="float32", device=device, mxfp4_moe=experts,
                        cuda_graphs=graphs_for(device, experts), kernels=kernels, allreduce_strategy=allreduce_strategy)
    eng = Engine.from_dirs(target, drafter, cfg, tp_size=tp_size, ep_size=ep_size)
    if eng.tp.rank != 0:
        eng.follow(close=False)      # the group stays for the next engine and the step benchmarks
        return None
    out = [r.output_ids for r in eng.generate(PROMPTS, PARAMS)]
    eng.shutdown(close=False)
    return out


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per request, the first output position where the two runs differ (None: identical)."""
    return [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None if len(ra) == len(rb) else
                 min(len(ra), len(rb))) for ra, rb in zip(a, b)]


# ---- 2. steps at the real shapes --------------------------------------------------------------------------
def gather(tp: TPGroup, obj) -> list:
    """obj of every rank, in rank order (on every rank)."""
    if not tp.active:
        return [obj]
    out = [None] * tp.size
    dist.all_gather_object(out, obj)
    return out


def count_collectives(tp: TPGroup, fn) -> dict:
    """The all-reduces and all-gathers one call of ``fn`` issues through ``tp`` (with the bytes each rank sends
    in); the modules share this TPGroup, so wrapping its methods sees every call. An all-reduce fused with the
    residual add + RMSNorm (the one-shot all-reduce's add_rms_norm kernel) counts as an all-reduce and, apart, as
    ``fused_add_norm``: without it a fused step read as one with no all-reduces."""
    counts = {"all_reduce": 0, "all_reduce_bytes": 0, "all_gather": 0, "all_gather_bytes": 0, "fused_add_norm": 0}
    wrapped = [(tp, "all_reduce", ("all_reduce",)), (tp, "all_gather_last", ("all_gather",))]
    if tp.small_all_reduce is not None:
        wrapped.append((tp.small_all_reduce, "add_rms_norm", ("all_reduce", "fused_add_norm")))

    def counted(kinds, op):
        def call(x, *args, **kwargs):
            if tp.active:  # at TP 1 the methods move nothing
                for kind in kinds:
                    counts[kind] += 1
                counts[kinds[0] + "_bytes"] += x.numel() * x.element_size()
            return op(x, *args, **kwargs)
        return call

    for owner, name, kinds in wrapped:
        setattr(owner, name, counted(kinds, getattr(owner, name)))
    try:
        fn()
    finally:
        for owner, name, _ in wrapped:
            delattr(owner, name)  # the class's methods again
    return counts


def bench_config(args, label: str, tp: TPGroup, ep_size: int, device, dtype, backend: str, ceil: dict | None,
                 out: "Results", kernels: Kernels) -> None:
    """Every (step, batch) point of one parallel layout, its modules built with ``kernels`` (the same at every
    layout, TP 1 included); rows go to rank 0's results as they are measured."""
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    target, drafter = build(args.target, args.tiny, device, dtype, args.ctx + 16, backend, tp, ep_size, kernels)
    steps = Steps(target, drafter, max(args.batch_sizes), args.ctx, device, dtype)
    bytes_model = ByteModel(target, drafter, args.ctx)
    mine = {"build_s": round(time.perf_counter() - t0, 2), "weight_gb": round(nbytes(target.parameters()) / 1e9, 3),
            "drafter_weight_gb": round(nbytes(drafter.parameters()) / 1e9, 3)}
    if cuda:
        mine["allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    out.add_layout(label, {"tp_size": tp.size, "ep_size": ep_size, "experts": backend, "ranks": gather(tp, mine)})
    for n in args.batch_sizes:
        for B in (1, args.block_size):
            touched = []
            comms = count_collectives(tp, lambda: touched.append(distinct_experts(steps, n, B)))
            fn = graphed(lambda: steps.run(n, B)) if cuda else (lambda: steps.run(n, B))
            ms = time_ms(fn, args.iters, args.warmup, cuda)
            del fn
            if cuda:  # the graph's memory pool goes back before the next shape is captured
                torch.cuda.empty_cache()
            rank_row = {"median_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3),
                        "max_ms": round(max(ms), 3), "distinct_experts": touched[0],
                        "hbm_bytes": bytes_model.step(n, B, touched[0])}
            if ceil is not None:
                rank_row["roofline_ms"] = round(1e3 * rank_row["hbm_bytes"] / ceil["copy_bw_bytes_per_s"], 4)
            ranks = gather(tp, rank_row)
            row = {"layout": label, "tp_size": tp.size, "ep_size": ep_size, "experts": backend,
                   "step": "ar" if B == 1 else "dflash", "block_size": B, "batch": n,
                   "mode": "graph" if cuda else "eager", **{k: ranks[0][k] for k in ("median_ms", "min_ms", "max_ms")},
                   "median_ms_per_rank": [r["median_ms"] for r in ranks],
                   "distinct_experts_per_rank": [r["distinct_experts"] for r in ranks],
                   "hbm_bytes_per_rank": [r["hbm_bytes"] for r in ranks], **comms}
            if ceil is not None:
                row["roofline_ms_per_rank"] = [r["roofline_ms"] for r in ranks]
                row["roofline_ms"] = max(row["roofline_ms_per_rank"])  # the slowest rank bounds the step
                row["roofline_fraction"] = round(row["roofline_ms"] / row["median_ms"], 3)
            out.add_row(row)
    del steps, target, drafter, bytes_model
    if cuda:
        torch.cuda.empty_cache()


# ---- results ----------------------------------------------------------------------------------------------
class Results:
    """Rank 0's JSON, rewritten whole (write, then rename) after every result."""

    def __init__(self, path: Path, rank: int, data: dict):
        self.path, self.rank, self.data = path, rank, data
        self.data.update(tokens={}, layouts={}, results=[], complete=False)

    def save(self) -> None:
        if self.rank != 0:
            return
        self.data["summary"] = summarize(self.data)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)

    def add_tokens(self, experts: str, entry: dict) -> None:
        self.data["tokens"][experts] = entry
        self.save()

    def add_layout(self, label: str, info: dict) -> None:
        self.data["layouts"][label] = info
        self.save()

    def add_row(self, row: dict) -> None:
        self.data["results"].append(row)
        if self.rank == 0:
            print(f"{row['layout']:8s} {row['step']:6s} B={row['block_size']:2d} n={row['batch']:3d} "
                  f"{row['median_ms']:9.3f} ms  experts/rank {row['distinct_experts_per_rank']}  "
                  f"all-reduces {row['all_reduce']}" + (f"  roofline {row['roofline_ms']:.3f} ms "
                                                        f"({row['roofline_fraction']:.0%})" if "roofline_ms" in row else ""),
                  flush=True)
        self.save()


def summarize(data: dict) -> dict:
    """Per layout: step times and roofline fractions at each batch, the collectives per step, tokens == TP 1
    (over every experts backend that ran), and the speed-up over TP 1 measured in the same run."""
    rows, block = data["results"], data["block_size"]

    def pick(layout, step, n):
        return next((r for r in rows if (r["layout"], r["step"], r["batch"]) == (layout, step, n)), None)

    out = {}
    for layout in data["layouts"]:
        s = {}
        for n in data["batch_sizes"]:
            for step in ("ar", "dflash"):
                r, ref = pick(layout, step, n), pick("tp1", step, n)
                if r is None:
                    continue
                s[f"{step}_b{n}_ms"] = r["median_ms"]
                s[f"{step}_b{n}_roofline_fraction"] = r.get("roofline_fraction")
                if layout != "tp1" and ref is not None:
                    s[f"{step}_b{n}_speedup_vs_tp1"] = round(ref["median_ms"] / r["median_ms"], 3)
            ar, df = pick(layout, "ar", n), pick(layout, "dflash", n)
            if ar and df:
                s[f"break_even_tokens_b{n}"] = round(df["median_ms"] / ar["median_ms"], 3)
        for step in ("ar", "dflash"):
            r = pick(layout, step, data["batch_sizes"][0])
            if r is not None:
                s[f"all_reduces_per_{step}_step"] = r["all_reduce"]
                s[f"all_gathers_per_{step}_step"] = r["all_gather"]
                s[f"fused_add_norms_per_{step}_step"] = r.get("fused_add_norm", 0)
        if layout != "tp1":
            checks = [t[layout]["equal_tp1"] for t in data["tokens"].values() if layout in t]
            s["tokens_equal_tp1"] = bool(checks) and all(checks)
            s["tokens_equal_tp1_by_experts"] = {e: t[layout]["equal_tp1"] for e, t in data["tokens"].items() if layout in t}
        out[layout] = s
    out["block_size"] = block
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--target", choices=sorted(TARGETS), default="gpt-oss-120b", help="shapes of the step benchmark")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: gloo, eager, dequantised experts")
    p.add_argument("--tiny", action="store_true", help="tiny step shapes (the CPU smoke test), not the real ones")
    p.add_argument("--experts", choices=("triton", "triton_kernels", "dequant"), default=None,
                   help="experts of the step benchmark: our MXFP4 kernels, ours at one token and the triton_kernels "
                        "library from two (RuntimeConfig.mxfp4_moe; ep size 1 only), or bf16 (default: triton on "
                        "CUDA, dequant on CPU); the tokens check runs dequant and triton in float32 either way")
    p.add_argument("--ep_sizes", "--ep", default="2,1", type=lambda s: [int(x) for x in s.split(",")],
                   help="expert-parallel sizes to run at TP = the number of ranks (each must divide it)")
    p.add_argument("--batch_sizes", default="1,64", type=lambda s: [int(x) for x in s.split(",")],
                   help="requests per step; the summary names its keys after them (ar_b1_ms, dflash_b64_ms, ...)")
    p.add_argument("--block_size", type=int, default=10, help="DFlash block (the z-lab gpt-oss-120b drafter's 10)")
    p.add_argument("--ctx", type=int, default=1024, help="tokens already in each request's KV cache")
    p.add_argument("--iters", type=int, default=10, help="timed steps per point (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed replays before each point")
    p.add_argument("--no_tp1", action="store_true", help="skip the TP 1 reference of the step benchmark")
    add_rank_engine_flags(p, "every rank and TP layout, TP 1 included")
    p.add_argument("--out", required=True, help="rank 0's results JSON")
    args = p.parse_args(argv)

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")                 # NVLink multicast off, before any group forms
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank, size = launcher_rank_and_size()
    if size < 2:
        raise SystemExit(f"{size} rank started; this benchmark compares TP >= 2 with TP 1: "
                         "start it with `mpirun -n 2 python -m trtllm_dflash.bench.gpt_oss_tp ...`")
    bad = [e for e in args.ep_sizes if e < 1 or size % e]
    if bad:
        raise SystemExit(f"--ep_sizes: {bad} do not divide the tp size {size}; use divisors of {size}")
    if args.experts == "triton_kernels" and max(args.ep_sizes) > 1:
        raise SystemExit("--experts triton_kernels runs whole experts on each rank (the intermediate size split): "
                         "use --ep_sizes 1")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA GPU is visible; use --tiny --device cpu for the smoke test")
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    backend = args.experts or ("triton" if cuda else "dequant")
    if backend != "dequant" and not cuda:
        raise SystemExit(f"--experts {backend} runs on CUDA only; use --experts dequant on the CPU")
    dtype = torch.bfloat16 if cuda else torch.float32
    kernels = Kernels.choose(args.kernels, False, device, dtype)
    t0 = time.perf_counter()

    work = Path(tempfile.mkdtemp(prefix=f"gpt_oss_tp_rank{rank}_"))
    target_dir, drafter_dir = tiny_pair(work)
    command = ["mpirun", "-n", str(size), "python", "-m", "trtllm_dflash.bench.gpt_oss_tp",
               *(argv if argv is not None else sys.argv[1:])]
    prov = record(command, checkpoints={"tiny_target": target_dir, "tiny_drafter": drafter_dir}) if rank == 0 else {}
    name = torch.cuda.get_device_name() if cuda else "cpu"
    tc, dc = TARGETS[args.target]
    tc, dc = ({**tc, **TINY}, {**dc, **TINY_DRAFTER}) if args.tiny else (tc, dc)
    out = Results(Path(args.out), rank, {
        "benchmark": "gpt_oss_tp", "git_sha": prov.get("git_sha"), "provenance": prov, "tp_size": size,
        "ep_sizes": args.ep_sizes, "device": name, "dtype": str(dtype).removeprefix("torch."),
        "shapes": {"target": "tiny" if args.tiny else f"openai/{args.target}",
                   "drafter": "tiny" if args.tiny else f"z-lab/{args.target}-DFlash", "ctx": args.ctx,
                   "target_layers": tc["num_hidden_layers"], "experts": tc["num_local_experts"],
                   "experts_per_token": tc["num_experts_per_tok"], "drafter_layers": dc["num_hidden_layers"]},
        "batch_sizes": args.batch_sizes, "block_size": args.block_size, "iters": args.iters,
        "kernels": {"setting": args.kernels, "triton": kernels.triton, "sampling": kernels.sampling},
        "allreduce_strategy": args.allreduce_strategy,
        "routing_note": "random weights route near-uniformly: the distinct experts per step are close to the "
                        "worst case min(E, tokens x top-k) per layer; real routing touches fewer",
        "tokens_note": "tiny random MXFP4 gpt-oss (trtllm_dflash/testing.py write_tiny_gpt_oss, seed 2) in float32; prompts and "
                       "sampling of tests/runtime/gpt_oss_tp_run.py (greedy, temperature 1.0 seed 3, greedy)"})

    # 1. tokens
    tokens_backends = ["dequant", "triton"] if cuda else ["dequant"]
    tp = None
    for experts in tokens_backends:
        tp1 = engine_tokens(target_dir, drafter_dir, args.device, experts, 1, 1, args.kernels)
        entry = {"tp1": tp1, "cuda_graphs": graphs_for(args.device, experts)}
        for ep in args.ep_sizes:
            got = engine_tokens(target_dir, drafter_dir, args.device, experts, size, ep, args.kernels,
                                args.allreduce_strategy)
            if rank == 0:
                entry[f"tp{size}_ep{ep}"] = {"tokens": got, "equal_tp1": got == tp1,
                                             "first_difference": first_difference(got, tp1)}
                print(f"tokens {experts:7s} tp {size} ep {ep} == tp 1: {got == tp1}", flush=True)
        tp = init_tp(size, device, allreduce_strategy=args.allreduce_strategy)   # the group the engines joined
        entry["tp1_same_on_every_rank"] = all(t == tp1 for t in gather(tp, tp1))
        out.add_tokens(experts, entry)
    out.data["tokens_s"] = round(time.perf_counter() - t0, 1)

    # 2. steps
    out.data["allreduce_oneshot"] = tp.small_all_reduce is not None
    ceil = ceilings() if cuda and not args.tiny else None
    out.data["ceilings_per_rank"] = gather(tp, ceil)
    out.data["devices_per_rank"] = gather(tp, name)
    layouts = [(f"tp{size}_ep{ep}", tp, ep) for ep in args.ep_sizes] + ([] if args.no_tp1 else [("tp1", TPGroup(), 1)])
    for label, group, ep in layouts:  # at TP 1 every rank times its own device at once; rank 0's rows are recorded
        bench_config(args, label, group, ep, device, dtype, backend, ceil, out, kernels)
        gc.collect()
        if cuda:  # the last layout's weights go back to the driver before the next one is made (120b at TP 1: 68 GB)
            torch.cuda.empty_cache()
    if cuda:
        out.data["peak_memory_gib_per_rank"] = gather(tp, round(torch.cuda.max_memory_allocated() / 2**30, 2))
    out.data["total_s"] = round(time.perf_counter() - t0, 1)
    out.data["complete"] = True
    out.save()
    if rank == 0:
        print(json.dumps(out.data["summary"], indent=1))
        print(f"wrote {args.out} ({out.data['total_s']} s)", flush=True)
    # No rank leaves before rank 0 has written: a launcher may end the whole job when the first rank exits
    # (MPICH's hydra kills the others, and still returns 0).
    gather(tp, None)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as e:  # argparse's and ours: the message, then the same os._exit as every other path
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    except BaseException:  # noqa: BLE001  a failed rank must end the job, not hang in an NCCL teardown
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
