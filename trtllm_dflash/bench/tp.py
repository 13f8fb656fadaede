# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism on GPUs (NCCL, CUDA graphs): same tokens as one GPU, and the step time at 8B shapes.

    mpirun --allow-run-as-root -n 2 python3 -m trtllm_dflash.bench.tp --out tp.json

1. A tiny random Qwen3 pair in float32: TP=2 greedy and sampled tokens == TP=1 tokens.
2. Qwen3-8B shapes, random bf16 weights (each rank makes only its shard, from per-tensor seeds, so all
   ranks agree on the full weights): AR and DFlash step times at the given batch sizes (rank 0's clock).
   Every rank runs the decode kernels RuntimeConfig.kernels chooses (``--kernels``; auto: the Triton kernels on
   CUDA), as one GPU does, and the all-reduce of ``--allreduce_strategy`` (runtime/allreduce.py).
3. The all-reduce alone (tp_allreduce.py's measure, on the same group): us per call of NCCL and, where the group
   has it, the one-shot all-reduce, at --allreduce_sizes (bf16, 100 calls per CUDA graph).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch


from trtllm_dflash import model_config
from trtllm_dflash.bench import random_pair
from trtllm_dflash.bench.step import profile_steps, target_config, time_engine
from trtllm_dflash.bench.tp_allreduce import measure, parse_size
from trtllm_dflash.bench.tp_flags import add_rank_engine_flags

from trtllm_dflash.checkpoints.drafter_init import random_drafter_weights
from trtllm_dflash.checkpoints.resolve import KNOWN_MODELS, PUBLIC_CONFIGS
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import leave_job
from trtllm_dflash.provenance import record
from trtllm_dflash.runtime.distributed import launcher_rank_and_size
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.weights import load_models
from trtllm_dflash.runtime.shard import slice_for_rank

PROMPTS = [[5, 9, 13], [7] * 20, [40, 41, 42, 43, 44, 45, 46]]
PARAMS = [SamplingParams(max_new_tokens=32, ignore_eos=True),
          SamplingParams(max_new_tokens=32, ignore_eos=True, temperature=1.0, seed=3),
          SamplingParams(max_new_tokens=32, ignore_eos=True, temperature=0.8, top_k=10, seed=5)]


def tiny_tokens(target, drafter, tp_size: int, allreduce_strategy: str = "auto"):
    eng = Engine.from_dirs(target, drafter, RuntimeConfig(max_seq_len=128, max_batch_size=4, dtype="float32",
                                                          allreduce_strategy=allreduce_strategy), tp_size=tp_size)
    if eng.tp.rank != 0:
        eng.follow(close=False)
        return eng, None
    out = [r.output_ids for r in eng.generate(PROMPTS, PARAMS)]
    eng.shutdown(close=False)
    return eng, out


def kv_heads(cfg: dict) -> int:
    return cfg.get("num_key_value_heads") or cfg["num_attention_heads"]


def shards_8b(name: str, tp, work: Path, max_seq: int, kernels: Kernels):
    """This rank's shard of random target + drafter weights (identical full weights on every rank), built with
    ``kernels`` (Kernels.choose of the engine's RuntimeConfig)."""
    tcfg, dcfg = target_config(name), dict(PUBLIC_CONFIGS[KNOWN_MODELS[name].drafter])
    pre = {}
    # the same per-tensor draws as the random checkpoints random_pair writes to disk (for benchmarks that load one)
    for pname, shape in random_pair.tensor_shapes(tcfg).items():
        full = random_pair.random_tensor(pname, shape, torch.bfloat16, "cuda")
        pre[f"target.{pname}"] = slice_for_rank(pname, full, tp.size, tp.rank,
                                                num_kv_heads=kv_heads(tcfg)).clone()
        del full
    for k, v in random_drafter_weights(dcfg, tcfg["hidden_size"], dtype=torch.bfloat16, device="cuda").items():
        pre[f"drafter.{k}"] = slice_for_rank(k, v, tp.size, tp.rank, num_kv_heads=kv_heads(dcfg)).clone()
    for role, cfg in (("target", tcfg), ("drafter", dcfg)):
        (work / role).mkdir(parents=True, exist_ok=True)
        (work / role / "config.json").write_text(json.dumps(cfg))
    dev = torch.device("cuda", torch.cuda.current_device())
    return load_models(work / "target", model_config.target_config(tcfg), work / "drafter",
                       model_config.DrafterConfig.from_hf(dcfg), tp, dev, torch.bfloat16, max_seq, kernels=kernels,
                       presharded=pre)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--batch", default="1,4,16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    add_rank_engine_flags(p, "the 8B-shape engines on every rank")
    p.add_argument("--allreduce_sizes", default="2K,8K,32K,64K,256K,512K,1M",
                   help="message sizes of part 3 (bytes, K/M suffixes; empty: skip it)")
    p.add_argument("--profile", action="store_true",
                   help="also rank 0's kernels per step (top kernels by GPU time, the host gap): where a TP step's "
                        "time goes, the all-reduces' waits for the other ranks included")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")                 # NVLink multicast off, as the runs
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank, size = launcher_rank_and_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    from mpi4py import MPI
    pair = Path(tempfile.gettempdir()) / "tp_bench_pair"
    res = {"tp_size": size, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "weights": f"tiny pair written by trtllm_dflash.testing (hashed below); {args.model}: random, in memory, seeded per tensor"}
    if rank == 0:
        from trtllm_dflash.testing import write_tiny_pair
        target, drafter = write_tiny_pair(pair, "qwen3", heads=4, kv_heads=2)
        res["tp1_tokens"] = tiny_tokens(target, drafter, 1)[1]
    MPI.COMM_WORLD.barrier()  # MPI's last use: init_tp finalises it after the rendezvous
    eng, tokens = tiny_tokens(pair / "target", pair / "drafter", size, args.allreduce_strategy)
    tp = eng.tp
    if rank == 0:
        res["tiny_tp_equals_tp1"] = tokens == res["tp1_tokens"]
        res["provenance"] = record(["mpirun", "-n", str(size), "python", "-m", "trtllm_dflash.bench.tp", *sys.argv[1:]],
                                   checkpoints={"tiny_target": pair / "target", "tiny_drafter": pair / "drafter"})
        print("tiny TP", size, "== TP 1:", res["tiny_tp_equals_tp1"], flush=True)
    max_seq = args.ctx + args.steps * 20 + 64
    kernels = Kernels.choose(args.kernels, False, torch.device("cuda"), torch.bfloat16)
    res["kernels"] = {"setting": args.kernels, "triton": kernels.triton, "sampling": kernels.sampling}
    res["allreduce"] = {"strategy": args.allreduce_strategy, "oneshot": tp.small_all_reduce is not None,
                        "oneshot_max_bytes": getattr(tp.small_all_reduce, "max_bytes", None)}
    with tempfile.TemporaryDirectory() as work:
        target, drafter = shards_8b(args.model, tp, Path(work) / f"rank{rank}", max_seq, kernels)
    rows = []
    for mode, d in (("ar", None), ("dflash", drafter)):
        cfg = RuntimeConfig(block_size=1 if d is None else None, max_batch_size=max(args.batch), max_seq_len=max_seq,
                            kernels=args.kernels, allreduce_strategy=args.allreduce_strategy)
        eng = Engine(target, d, None, cfg, tp, set())
        if rank != 0:
            eng.follow(close=False)
            continue
        for b in args.batch:
            r = time_engine(eng, b, args.ctx, args.steps)
            if args.profile:
                r["profile"] = profile_steps(eng, b, args.ctx, step_ms=r["step_ms"])
            rows.append({"model": args.model, "tp_size": size, "mode": mode, "batch": b, **r})
            print(rows[-1], flush=True)
        eng.shutdown(close=False)
        del eng
        torch.cuda.empty_cache()
    sizes = [parse_size(x) for x in args.allreduce_sizes.split(",")] if args.allreduce_sizes else []
    allreduce_rows = measure(tp, sizes, calls=100, iters=20)
    if rank == 0:
        res["rows"] = rows
        res["allreduce_rows"] = allreduce_rows
        Path(args.out).write_text(json.dumps(res, indent=1))
    # The first H200x2 run wrote its results and then hung in tp.close() (an NCCL barrier, then the group's
    # destroy); a benchmark has nothing left to release, so leave without the teardown, but only once rank 0 has
    # written: a rank leaving first ends the whole job (leave_job). tp_allreduce.py ends on such a barrier too.
    leave_job(0)


if __name__ == "__main__":
    sys.exit(main())
