# SPDX-License-Identifier: Apache-2.0
"""dflash-sweep: throughput (tok/s/gpu) vs interactivity (tok/s/user) over a list of concurrencies.

In: a deployment directory run in-process (``--server engine``; TP ranks under ``mpirun``, rank 0
drives), or a running server: Triton's ``tensorrt_llm`` model over a gRPC stream (``--server triton``)
or an OpenAI-compatible ``/v1/completions`` such as ``trtllm-serve`` (``--server openai``).
Out: one JSONL row per concurrency level, appended to ``--out``: every setting, versions, the command
line and the metrics of ``bench.metrics`` (whose docstring defines them).

Each level is a closed loop: C requests in flight, a finished one replaced at once, until N have
finished; warm-up requests run first at the same concurrency and are not measured. The AR baseline
is the same engine with block_size 1 (``--mode ar``), never a separate code path.
"""
from __future__ import annotations

import argparse
import functools
import json
import platform
import shlex
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .. import __version__
from ..config import SamplingParams
from ..errors import DFlashError, exit_code
from ..runtime.draft_policy import AdaptivePolicy
from ..versions import installed
from . import drivers
from .helpformat import HelpFormatter
from .metrics import summarize
from .workload import DATASETS, WorkItem, load_workload

SCHEMA = "trtllm_dflash.sweep/1"
EPILOG = """examples:
  dflash-sweep --deployment_dir engines/smollm2 --mode ar --concurrency 1,2,4,8,16,32,64 --out sweep.jsonl
  dflash-sweep --deployment_dir engines/smollm2 --mode dflash --concurrency 1,2,4,8,16,32,64 --out sweep.jsonl
  dflash-sweep --deployment_dir engines/smollm2 --dataset humaneval --max_new_tokens 256 --concurrency 1,4 --out h.jsonl
  mpirun -n 8 dflash-sweep --deployment_dir engines/gpt-oss-120b/fp8/8-gpu --mode dflash --out tp8.jsonl
  dflash-sweep --server triton --url localhost:8001 --deployment_dir engines/smollm2 --concurrency 1,4 --out tr.jsonl
  dflash-sweep --server openai --url localhost:8000 --tokenizer openai/gpt-oss-120b --tp_size 8 \\
      --label EAGLE-3 --dataset random --input_len 1024 --max_new_tokens 1024 --ignore_eos --out eagle3.jsonl
  dflash-plot sweep.jsonl eagle3.jsonl --out_dir plots/
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-sweep", description=__doc__, epilog=EPILOG,
                                formatter_class=HelpFormatter)
    g = p.add_argument_group("what to measure")
    g.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="engine", type=Path, help="deployment directory (dflash-build output)")
    # --backend: its name before "backend" came to mean only the deployment's runtime (dflash-build --backend)
    g.add_argument("--server", "--backend", dest="server", choices=("engine", "triton", "openai"), default="engine",
                   help="what answers the requests: engine = the deployment's torch runtime in this process "
                        "(no server), triton = gRPC stream to the tensorrt_llm model, openai = /v1/completions "
                        "server-sent events (trtllm-serve, dflash-openai)")
    g.add_argument("--mode", choices=("dflash", "ar", "adaptive"), default="dflash",
                   help="engine: ar = the same engine with block_size 1; adaptive = DFlash with the block picked per "
                        "step (runtime/draft_policy.py, step costs measured on this device first); endpoints: "
                        "recorded only")
    g.add_argument("--url", help="endpoint host:port (triton: the gRPC port)")
    g.add_argument("--model", help="model name at the endpoint [triton: tensorrt_llm, openai: the first listed]")
    g.add_argument("--tokenizer", help="endpoints: tokenizer folder or hub id for counting tokens [--engine's target]")
    g.add_argument("--label", help="run name in plots [AR or DFlash, from --mode]")
    g = p.add_argument_group("runtime (--server engine; endpoints read them from the deployment for the record)")
    g.add_argument("--block_size", type=int, help="DFlash block (max_draft_len + 1) [the deployment's]")
    g.add_argument("--tp_size", type=int, help="GPUs for tok/s/gpu [the deployment's tp_size, else 1]")
    g.add_argument("--max_seq_len", type=int, help="[the deployment's]")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="[the deployment's]")
    g.add_argument("--device", help="auto, cpu, cuda, cuda:1 [the deployment's: auto]")
    g = p.add_argument_group("load (trtllm-bench flag names)")
    g.add_argument("--concurrency", default="1,2,4,8", help="comma-separated requests in flight, one level each")
    g.add_argument("--num_requests", type=int, default=0, help="measured requests per level; 0 = 5 x concurrency, >= 8")
    g.add_argument("--warmup", type=int, default=-1, help="unmeasured requests per level first; -1 = concurrency")
    g.add_argument("--dataset", choices=DATASETS, default="random",
                   help="random = fixed-length random token prompts; others: packaged data with the chat template")
    g.add_argument("--input_len", type=int, default=None, help="random prompts: tokens each [128]")
    g.add_argument("--max_new_tokens", "--output_len", type=int, default=128, help="output tokens per request (cap)")
    g.add_argument("--ignore_eos", action="store_true", help="generate exactly --max_new_tokens")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--seed", type=int, default=0, help="prompt sampling; request i samples with seed + i")
    g.add_argument("--streaming", dest="streaming", action="store_true", default=True,
                   help="endpoints stream chunks (TTFT, ITL need it); on unless --no_streaming")
    g.add_argument("--no_streaming", dest="streaming", action="store_false", help="one response per request")
    g.add_argument("--timeout_s", "--timeout", type=float, default=600.0,
                   help="endpoints: seconds to wait for a response (--timeout still parses)")
    g.add_argument("--client_processes", type=int, default=0,
                   help="endpoints: client processes sharing each level's requests in flight (one Python process "
                        "reading every stream can be the limit before the server is); 0 = auto: one per 32 in "
                        "flight, at most a quarter of this machine's cores")
    p.add_argument("--out", type=Path, required=True, help="JSONL file; one row per level is appended")
    args = p.parse_args(argv)
    args.levels = parse_concurrency(args.concurrency)
    if args.client_processes < 0:
        raise DFlashError("--client_processes", f"{args.client_processes} is negative", "pass 0 (auto) or a count")
    return args


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1:
        raise DFlashError("--concurrency", f"{text!r} is not a list of positive integers", "pass e.g. 1,2,4,8,16")
    return levels


@dataclass
class Target:
    """What a level runs against: ``run(items, concurrency, params, on_done) -> (records, wall_s)``."""

    run: Callable
    tokenizer: object
    vocab_size: int | None
    block_size: int | None
    max_seq_len: int | None
    settings: dict = field(default_factory=dict)
    close: Callable[[], None] = lambda: None


def _deployment(engine_dir: Path | None):
    """The deployment, opened once (its manifest checked), or None for an endpoint named by --url alone."""
    from ..deployment import Deployment
    return Deployment.open(engine_dir) if engine_dir is not None else None


def _pair(m: dict) -> dict:
    """Where the deployment's checkpoints came from, and the hardware profile it was built for."""
    d = m.get("drafter") or {}
    return {"target": (m.get("target") or {}).get("source"), "drafter": d.get("source"),
            "drafter_untrained": d.get("untrained"), "gpu_profile": m.get("gpu")}


def open_engine(args, deployment) -> Target:
    """The deployment in this process, with max_batch_size = the largest concurrency."""
    if deployment is None:
        raise DFlashError("--deployment_dir", "missing",
                          "pass a deployment directory, or --server triton/openai --url ...")
    from ..runtime.engine import Engine

    overrides = {"max_batch_size": max(args.levels)}
    if args.mode == "ar":
        overrides["block_size"] = 1
    elif args.block_size is not None:
        overrides["block_size"] = args.block_size
    overrides.update({k: getattr(args, k) for k in ("max_seq_len", "dtype", "device") if getattr(args, k)})
    # the sweep's mode decides the policy, whatever the deployment names (adaptive is applied below)
    engine = Engine.from_deployment(deployment, draft_policy="fixed", **overrides)
    if args.mode == "adaptive" and engine.tp.size == 1:
        engine.use_adaptive_policy(context=args.input_len or 256)
    if engine.tp.rank != 0:
        return Target(None, None, None, None, None, close=engine.follow)   # mirrors rank 0 until shutdown
    if engine.device.type == "cuda":
        import torch
        gpu = torch.cuda.get_device_name(engine.device)
    else:
        gpu = f"none (cpu: {platform.processor() or platform.machine()})"
    settings = {**_pair(deployment.manifest), "block_size": engine.block_size, "tp_size": engine.tp.size, "gpu_name": gpu,
                "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
                "max_batch_size": engine.cfg.max_batch_size, "max_seq_len": engine.cfg.max_seq_len,
                "draft_policy": type(engine.policy).__name__, "batch_invariant": engine.cfg.batch_invariant}

    def run(items, concurrency, params, on_done):
        before = dict(engine.block_counts)
        out = drivers.run_engine_level(engine, items, concurrency, params, on_done)
        settings["block_counts"] = {b: k - before.get(b, 0) for b, k in engine.block_counts.items()}  # this level
        if isinstance(engine.policy, AdaptivePolicy):   # why it chose what it chose: the costs it went by
            settings["step_costs_ms"] = {"measured_at_start": _ms_table(engine.policy.measured),
                                         "observed": engine.policy.observed_costs()}
        return out

    return Target(run, engine.tokenizer, engine.target.config.vocab_size, engine.block_size, engine.cfg.max_seq_len,
                  settings, close=engine.shutdown)


def _ms_table(costs) -> dict:
    return {n: {b: round(1e3 * v, 4) for b, v in row.items()} for n, row in costs.seconds.items()}


def open_endpoint(args, m: dict) -> Target:
    if not args.url:
        raise DFlashError("--url", f"missing for --server {args.server}", "pass host:port of the running server")
    tok_source = args.tokenizer or (str(args.engine / (m.get("target") or {}).get("path", "target")) if m else None)
    if tok_source is None:
        raise DFlashError("--tokenizer", "missing: endpoints return text, counted in tokens on this side",
                          "pass --tokenizer DIR (the target's) or --deployment_dir DIR")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tok_source)
    runtime = m.get("runtime", {})
    mbs = runtime.get("max_batch_size")
    if args.server == "triton" and mbs and max(args.levels) > mbs:
        raise DFlashError("--concurrency", f"{max(args.levels)} > the deployment's max_batch_size {mbs}: requests "
                          "would wait in the server's queue", f"rebuild with dflash-build --max_batch_size "
                          f"{max(args.levels)}, or lower --concurrency")
    from .endpoints import OpenAIClient, TritonClient, open_client
    cls = TritonClient if args.server == "triton" else OpenAIClient
    kw = dict({"model": args.model} if args.model else {}, max_tokens=args.max_new_tokens,
              temperature=args.temperature, seed=args.seed, ignore_eos=args.ignore_eos, streaming=args.streaming,
              timeout=args.timeout_s)
    client = cls(args.url, tokenizer, **kw)
    kw["model"] = client.model   # the client processes ask no more
    block = args.block_size or (1 if args.mode == "ar" else runtime.get("block_size"))
    settings = {**_pair(m), "target": _pair(m)["target"] or tok_source, "url": args.url, "model": client.model,
                "block_size": block, "tp_size": args.tp_size or int(m.get("tp_size", 1)), "gpu_name": None,
                "device": None, "dtype": runtime.get("dtype"), "max_batch_size": mbs,
                "max_seq_len": runtime.get("max_seq_len"), "draft_policy": runtime.get("draft_policy"),
                "batch_invariant": bool(runtime.get("batch_invariant", False))}

    def run(items, concurrency, params, on_done):
        processes = drivers.client_processes(args.client_processes, concurrency)
        if processes == 1:
            return drivers.run_threaded_level(client.send, items, concurrency, on_done)
        make_client = functools.partial(open_client, args.server, args.url, str(tok_source), **kw)
        return drivers.run_process_level(make_client, items, concurrency, processes, on_done)

    return Target(run, tokenizer, len(tokenizer), block, runtime.get("max_seq_len"), settings, close=client.close)


def fitting(items: list[WorkItem], target: Target, max_new_tokens: int) -> tuple[list[WorkItem], int]:
    """Prompts that leave room for max_new_tokens (and one block) in the KV cache; a cut-short request would
    silently change the OSL. Returns (kept, dropped count)."""
    if not target.max_seq_len:
        return items, 0
    room = target.max_seq_len - max_new_tokens - (target.block_size or 1) - 1
    kept = [it for it in items if len(it.prompt_ids) <= room]
    if not kept:
        raise DFlashError("--max_new_tokens", f"no prompt fits: max_seq_len {target.max_seq_len} leaves {room} prompt "
                          f"tokens next to {max_new_tokens} new ones", "lower --max_new_tokens / --input_len, or "
                          "raise --max_seq_len")
    return kept, len(items) - len(kept)


def level_sizes(args, concurrency: int) -> tuple[int, int]:
    """(measured requests, warm-up requests) of one level."""
    n = args.num_requests or max(8, 5 * concurrency)
    return n, concurrency if args.warmup < 0 else args.warmup


def run_level(target: Target, items: list[WorkItem], concurrency: int, args, label: str) -> dict:
    from tqdm import tqdm

    n, w = level_sizes(args, concurrency)
    measured = [items[k % len(items)] for k in range(n)]
    warm = [items[-1 - k % len(items)] for k in range(w)]   # from the other end: different prompts when possible

    def params(i: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed + i,
                              ignore_eos=args.ignore_eos)

    for phase, batch in (("warm-up", warm), ("", measured)):
        if not batch:
            continue
        with tqdm(total=len(batch), desc=f"{label} c={concurrency} {phase}".rstrip(), unit="req",
                  file=sys.stderr) as bar:
            records, wall = target.run(batch, concurrency, params, lambda _rec: bar.update(1))
    # The server counts drafts, not steps: only a fixed block turns drafts into steps (drafts / (block - 1)).
    # Under the adaptive policy the steps' blocks vary, so acceptance comes from tokens per streamed chunk.
    fixed = target.settings.get("draft_policy") != "adaptive"
    metrics = summarize(records, wall, int(target.settings["tp_size"]), target.block_size if fixed else None)
    if metrics["num_errors"] == len(records):
        raise DFlashError("requests", f"all {len(records)} failed at concurrency {concurrency}: "
                          f"{metrics['first_error']}", "check the server's log and --url / --model")
    return metrics


def versions(git_sha: str | None) -> dict:
    """``git_sha``: the provenance record's (provenance.git_state: a copy of the tree may sit under a stale .git,
    where only the .git_state.json copied with it is right; asking git there recorded 8246e5c-dirty)."""
    return {"trtllm_dflash": __version__, "python": platform.python_version(), "git_sha": git_sha,
            **installed("torch", "transformers", "tritonclient", "tensorrt_llm")}


def provenance(command: str, engine_dir: Path | None, m: dict) -> dict:
    """provenance.record for the sweep; the deployment's target/drafter sha256 come from its manifest (what
    `dflash-build inspect` prints and verifies), so a 60 GB target is not hashed again for every sweep."""
    from ..build import checkpoint_sha256
    from ..provenance import checkpoint_digest, record
    prov = record(command)
    for role in ("target", "drafter"):
        if not (m.get(role) and (engine_dir / m[role]["path"]).is_dir()):
            continue
        path = engine_dir / m[role]["path"]
        if "files" in m:
            prov["checkpoints"][role] = {"path": str(path), "sha256": checkpoint_sha256(m, role),
                                         "from": "manifest.json (verify: dflash-build inspect)"}
        else:   # a manifest without a file list: hash the folder itself
            prov["checkpoints"][role] = {**checkpoint_digest(path), "from": "hashed"}
    return prov


def make_row(args, label: str, concurrency: int, target: Target, metrics: dict, command: str, extra: dict,
             prov: dict) -> dict:
    """One level's row; its versions' git_sha is the provenance record's, read once per sweep, not per level."""
    n, w = level_sizes(args, concurrency)
    settings = {"server": args.server, "engine_dir": str(args.engine) if args.engine else None, "mode": args.mode,
                "concurrency": concurrency, "dataset": args.dataset, "num_requests": n, "warmup": w,
                "input_len": args.input_len, "max_new_tokens": args.max_new_tokens, "ignore_eos": args.ignore_eos,
                "temperature": args.temperature, "seed": args.seed, "streaming": args.streaming,
                "client_processes": (None if args.server == "engine" else
                                     drivers.client_processes(args.client_processes, concurrency)),
                **target.settings, **extra}
    settings["num_gpus"] = settings["tp_size"]
    return {"schema": SCHEMA, "label": label, "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": command, "settings": settings, "versions": versions(prov["git_sha"]), "metrics": metrics,
            "provenance": prov}


def _fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def summary_line(row: dict) -> str:
    m = row["metrics"]
    return (f"{row['label']} c={row['settings']['concurrency']}: {_fmt(m['tok_s_user'])} tok/s/user  "
            f"{_fmt(m['tok_s_gpu'])} tok/s/gpu  TTFT p50 {_fmt(m['ttft_ms']['p50'], '.0f')} ms  "
            f"TPOT p50 {_fmt(m['tpot_ms']['p50'])} ms  AL {_fmt(m['acceptance_length_mean'], '.2f')}  "
            f"errors {m['num_errors']}/{m['num_requests']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(sys.orig_argv) if argv is None else shlex.join(["dflash-sweep", *argv])
    deployment = _deployment(args.engine)
    m = deployment.manifest if deployment is not None else {}
    target = open_engine(args, deployment) if args.server == "engine" else open_endpoint(args, m)
    if target.run is None:
        target.close()   # ranks > 0 of a TP engine: follow rank 0's steps, write nothing
        return 0
    try:
        prov = provenance(command, args.engine, m)   # rank 0 only: the other ranks write nothing
        label = args.label or {"ar": "AR", "dflash": "DFlash", "adaptive": "DFlash adaptive"}[args.mode]
        n_max = max(sum(level_sizes(args, c)) for c in args.levels)
        input_len = args.input_len if args.input_len is not None else (128 if args.dataset == "random" else None)
        items = load_workload(args.dataset, target.tokenizer, num_prompts=n_max, input_len=input_len,
                              vocab_size=target.vocab_size, seed=args.seed)
        items, dropped = fitting(items, target, args.max_new_tokens)
        if dropped:
            print(f"note: {dropped} of {dropped + len(items)} prompts do not fit max_seq_len with "
                  f"{args.max_new_tokens} new tokens; skipped", file=sys.stderr)
        args.input_len = input_len
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for c in args.levels:
            metrics = run_level(target, items, c, args, label)
            row = make_row(args, label, c, target, metrics, command, {"num_prompts_skipped": dropped}, prov)
            with args.out.open("a") as f:   # one line per level, so a crashed sweep keeps the finished ones
                f.write(json.dumps(row) + "\n")
            print(summary_line(row), flush=True)
        print(f"wrote {len(args.levels)} row(s) to {args.out}", flush=True)
    finally:
        target.close()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main))
