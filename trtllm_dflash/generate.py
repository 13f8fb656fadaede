# SPDX-License-Identifier: Apache-2.0
"""dflash-generate: run prompts through the torch runtime, autoregressive and/or DFlash, and print the
text and acceptance statistics. Under ``mpirun -n N`` with ``--tp_size N`` every rank loads its shard
and rank 0 prints."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .bench.helpformat import HelpFormatter
from .config import RuntimeConfig, SamplingParams
from .deployment import Deployment
from .errors import DFlashError

EPILOG = """examples:
  dflash-generate --target smollm2-135m --mode both --prompt "What is DFlash?"   # the shipped drafter
  dflash-generate --deployment_dir out/smollm2 --prompt_file prompts.txt --temperature 0.7 --seed 1
  mpirun -n 2 dflash-generate --target DIR --drafter DIR --tp_size 2 --prompt "Hello"
"""


def parse_args(argv):
    p = argparse.ArgumentParser("dflash-generate", description=__doc__, epilog=EPILOG, formatter_class=HelpFormatter)
    src = p.add_argument_group("model")
    src.add_argument("--target", help="target HF folder, or smollm2-135m (the packaged SmolLM2-135M-Instruct)")
    src.add_argument("--drafter", help="DFlash drafter folder (z-lab layout), smollm2-135m-dflash (ships with this "
                                       "package; the default for --target smollm2-135m), or 'untrained' for a random "
                                       "one (acceptance ~1; shows the mechanics, not the speed-up)")
    src.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="deployment_dir",
                     help="a dflash-build deployment directory (instead of --target/--drafter)")
    src.add_argument("--allow_pickle", action="store_true", help="allow *.bin/*.pt weights (weights_only load)")
    run = p.add_argument_group("runtime")
    run.add_argument("--mode", choices=("dflash", "ar", "both"), default="dflash",
                     help="both = run autoregressive and DFlash, compare tokens and speed")
    run.add_argument("--tp_size", "--tp", type=int, default=None, help="tensor-parallel ranks (start with mpirun -n N)")
    run.add_argument("--block_size", type=int, default=None,
                     help="verify this fixed block every step (max_draft_len + 1); default: --draft_policy decides")
    run.add_argument("--draft_policy", choices=("adaptive", "fixed"), default=None,
                     help="adaptive = measure step costs on this device first, then pick the block per step from the "
                          "batch size and the running acceptance, down to 1 (AR) where drafting does not pay; "
                          "fixed = always the drafter's block. Default: the deployment's (--deployment_dir), else adaptive")
    run.add_argument("--max_batch_size", type=int, default=RuntimeConfig.max_batch_size)
    run.add_argument("--max_seq_len", type=int, default=RuntimeConfig.max_seq_len)
    run.add_argument("--dtype", default=RuntimeConfig.dtype, choices=("auto", "float32", "bfloat16", "float16"))
    run.add_argument("--device", default=RuntimeConfig.device, help="auto, cpu, cuda, cuda:1, ...")
    gen = p.add_argument_group("prompts and sampling")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    gen.add_argument("--prompt_file", help="one prompt per line")
    gen.add_argument("--no_chat_template", action="store_true", help="send raw text instead of a chat turn")
    gen.add_argument("--max_new_tokens", type=int, default=SamplingParams.max_new_tokens)
    gen.add_argument("--temperature", type=float, default=SamplingParams.temperature)
    gen.add_argument("--top_k", type=int, default=SamplingParams.top_k)
    gen.add_argument("--top_p", type=float, default=SamplingParams.top_p)
    gen.add_argument("--seed", type=int, default=SamplingParams.seed)
    gen.add_argument("--ignore_eos", action="store_true")
    gen.add_argument("--rounds", type=int, default=5,
                     help="--mode both: after one warm-up generation per mode, run AR and DFlash this many times in "
                          "turn (AR first in odd rounds, DFlash first in even ones, so a machine's drift hits both "
                          "alike) and report the median DFlash/AR speed-up with its range")
    p.add_argument("--json", help="also write per-request results to this JSON file")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    # opened once, for every engine this run loads
    args.deployment = Deployment.open(args.deployment_dir) if args.deployment_dir else None
    return args


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise DFlashError("--prompt_file", f"{path} does not exist", "pass a text file with one prompt per line")
        prompts += [line for line in path.read_text().splitlines() if line.strip()]
    return prompts or ["Explain speculative decoding in two sentences."]


def _resolve_target(name: str) -> Path:
    if name == "smollm2-135m":
        from .checkpoints.packaged import smollm2_target_dir
        return smollm2_target_dir()
    path = Path(name)
    if not path.is_dir():
        from .checkpoints.resolve import did_you_mean
        raise DFlashError("--target", f"{name} is not a folder", did_you_mean(name)
                          + "pass an HF checkpoint folder or smollm2-135m")
    return path


def _resolve_drafter(name: str | None, target: Path, workdir: Path) -> Path | None:
    from .checkpoints.resolve import SHIPPED_DRAFTERS, shipped_drafter_dir
    if name is None:
        return None
    if name in SHIPPED_DRAFTERS:
        return shipped_drafter_dir(name)
    if name == "untrained":
        from .checkpoints.drafter_init import write_random_drafter
        print("note: using an UNTRAINED drafter: outputs are exact, acceptance will be ~1 token/step", file=sys.stderr)
        return write_random_drafter(target, workdir / "untrained_drafter", num_layers=1, block_size=16)
    path = Path(name)
    if not path.is_dir():
        raise DFlashError("--drafter", f"{name} is not a folder", "pass a DFlash drafter folder, "
                          "smollm2-135m-dflash, or 'untrained'")
    return path


def _engine(args, block_size: int | None, workdir: Path):
    from .runtime.engine import Engine
    cfg = dict(max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len, dtype=args.dtype,
               device=args.device, block_size=block_size)
    deployment = args.deployment
    if deployment is not None:   # the policy is applied by run_mode, which knows the prompts (context, batch)
        if not block_size:   # the deployment's own block
            del cfg["block_size"]
        return Engine.from_deployment(deployment, draft_policy="fixed", **cfg)
    if not args.target:
        raise DFlashError("--target", "missing", "pass --target DIR (and --drafter DIR), or --deployment_dir DIR")
    target = _resolve_target(args.target)
    drafter_spec = args.drafter
    if drafter_spec is None:  # a short-name target brings its known drafter
        from .checkpoints.resolve import KNOWN_MODELS, SHIPPED_DRAFTERS
        known = KNOWN_MODELS.get(args.target.lower())
        drafter_spec = known.drafter if known is not None and known.drafter in SHIPPED_DRAFTERS else None
    drafter = _resolve_drafter(drafter_spec, target, workdir) if block_size != 1 else None
    if drafter is None and block_size != 1:
        raise DFlashError("--drafter", "missing for DFlash mode", "pass --drafter DIR (or 'untrained'), or --mode ar")
    return Engine.from_dirs(target, drafter, RuntimeConfig(**cfg), tp_size=args.tp_size or 1,
                            allow_pickle=args.allow_pickle)


def _encode(engine, text: str, chat: bool) -> list[int]:
    tok = engine.tokenizer
    if tok is None:
        raise DFlashError("target tokenizer", "missing (no tokenizer.json in the target folder)",
                          "copy the tokenizer files into the target folder")
    if chat and tok.chat_template:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tok(text)["input_ids"]


def _policy(args) -> str:
    if args.draft_policy is not None:
        return args.draft_policy
    deployment = args.deployment
    return deployment.draft_policy if deployment is not None else "adaptive"


def _measure_costs(engine, mode: str, prompts: list[list[int]]) -> None:
    """The adaptive policy's step costs at these prompts' context and count (Engine.measure_adaptive_policy)."""
    engine.measure_adaptive_policy(f"[{mode}]", context=max(map(len, prompts)), max_batch=len(prompts))


def _choice_note(args, engine, adaptive: bool) -> str:
    """Why the engine ran the blocks it ran: the adaptive policy's last choice (and the step periods it left out as
    stalls), or why the block was fixed."""
    if not adaptive:
        return f"fixed: {_fixed_reason(args, engine)}"
    stalls = engine.policy.stalls_refused
    left_out = f"; {stalls} stalled step period(s) left out" if stalls else ""
    return f"adaptive; last choice: {engine.last_reason}{left_out}"


def _fixed_reason(args, engine) -> str:
    """Why the block stayed fixed: the one cause that applies, not a list of flags the user may not have passed."""
    if args.block_size is not None:
        return f"--block_size {args.block_size}"
    if engine.tp.size > 1 and _policy(args) == "adaptive":
        return "tensor parallelism: adaptive measures step costs on rank 0 alone"
    if args.draft_policy == "fixed":
        return "--draft_policy fixed"
    return "the deployment's draft_policy fixed"


def run_mode(args, mode: str, texts: list[str], workdir: Path) -> list[dict]:
    """One mode's engine and generate(). The tensor-parallel group outlives the engine: MPI agrees the rendezvous
    once per process (it is finalised after), so the next mode could not form a group of its own; and the ranks
    leave it together in errors.exit_code, once rank 0 has printed and written its results (a follower released
    here would exit, and MPICH's hydra then ended rank 0 mid-write with exit code 0)."""
    block = 1 if mode == "ar" else args.block_size
    t0 = time.perf_counter()
    engine = _engine(args, block, workdir)
    load_s = time.perf_counter() - t0
    if engine.tp.rank != 0:
        engine.follow(close=False)
        return []
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    prompts = [_encode(engine, t, not args.no_chat_template) for t in texts]
    # measuring costs runs steps on rank 0 alone, so under tensor parallelism the block stays fixed
    adaptive = (mode == "dflash" and args.block_size is None and _policy(args) == "adaptive"
                and engine.tp.size == 1)
    if adaptive:
        _measure_costs(engine, mode, prompts)
    t0 = time.perf_counter()
    reqs = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    engine.shutdown(close=False)
    print(f"[{mode}] block_size={engine.block_size} device={engine.device} dtype={str(engine.dtype)[6:]} "
          f"tp={engine.tp.size} load={load_s:.1f}s", file=sys.stderr)
    if mode == "dflash":
        ran = ", ".join(f"block {b}: {k} steps" for b, k in sorted(engine.block_counts.items()))
        print(f"[{mode}] ran {ran} ({_choice_note(args, engine, adaptive)})", file=sys.stderr)
    return _rows(mode, engine, texts, reqs, wall)


def _rows(mode: str, engine, texts: list[str], reqs, wall: float) -> list[dict]:
    out = []
    for text, r in zip(texts, reqs):
        s = r.stats
        out.append({"mode": mode, "prompt": text, "text": engine.tokenizer.decode(r.output_ids, skip_special_tokens=True),
                    "output_ids": r.output_ids, "finish_reason": r.finish_reason, **s.as_dict(),
                    "acceptance_rate": round(s.acceptance_rate, 4), "wall_s": wall,
                    "tok_per_s": s.num_output_tokens / s.decode_s if s.decode_s else 0.0})
    return out


def summary_line(results: dict, n_prompts: int) -> str:
    """One speed figure: DFlash/AR by the wall time of generating every prompt (same tokens, so the ratio of
    times is the ratio of speeds), the median over the rounds with its range."""
    df = results["dflash"]
    tau = sum(r["tau"] for r in df) / len(df)
    rounds = results.get("rounds")
    if rounds is None:   # tensor parallelism: one generation per mode
        ar_wall, df_wall = results["ar"][0]["wall_s"], df[0]["wall_s"]
        return (f"summary: mean tau {tau:.2f} tokens/step, DFlash/AR speed-up {ar_wall / max(df_wall, 1e-9):.2f}x "
                f"(wall time, one generation each: AR {ar_wall:.2f} s, DFlash {df_wall:.2f} s; {n_prompts} prompt(s))")
    r = rounds["speedup"]
    spread = f" (range {min(r):.2f}-{max(r):.2f}x over {len(r)} rounds)" if len(r) > 1 else ""
    return (f"summary: mean tau {tau:.2f} tokens/step, DFlash/AR speed-up {rounds['median_speedup']:.2f}x{spread}; "
            f"median wall time AR {results['ar'][0]['wall_s']:.2f} s, DFlash {df[0]['wall_s']:.2f} s "
            f"({n_prompts} prompt(s), after one warm-up generation each)")


def compare_modes(args, texts: list[str], workdir: Path) -> dict:
    """--mode both in one process (tp 1): both engines loaded and warmed up with one whole generation each
    (first-step allocations, kernel selection, the adaptive policy's costs and acceptance), then ``--rounds``
    generations of each in turn. A fresh engine's first generate() ran several hundred ms slower, so
    AR-first-without-warm-up made the ratio noise."""
    import statistics

    engines, load = {}, {}
    for mode in ("ar", "dflash"):
        t0 = time.perf_counter()
        engines[mode] = _engine(args, 1 if mode == "ar" else args.block_size, workdir)
        load[mode] = time.perf_counter() - t0
    ar, df = engines["ar"], engines["dflash"]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    prompts = [_encode(ar, t, not args.no_chat_template) for t in texts]
    adaptive = args.block_size is None and _policy(args) == "adaptive"
    if adaptive:
        _measure_costs(df, "dflash", prompts)
    # A whole generation per mode, untimed: with an 8-token warm-up the adaptive policy was still learning the
    # acceptance in the first timed round (on 2 CPU cores that round's DFlash ran 1.2x the later ones' wall time in
    # each of 3 quick starts, and the median over rounds moved with how fast it settled)
    for engine in (ar, df):
        engine.generate(prompts, params)
    df.block_counts.clear()                        # report what the measured rounds ran
    walls: dict[str, list[float]] = {"ar": [], "dflash": []}
    last: dict[str, list] = {}
    for r in range(args.rounds):
        print(f"[both] round {r + 1}/{args.rounds}...", file=sys.stderr, flush=True)
        for mode in (("ar", "dflash") if r % 2 == 0 else ("dflash", "ar")):
            t0 = time.perf_counter()
            last[mode] = engines[mode].generate(prompts, params)
            walls[mode].append(time.perf_counter() - t0)
    for mode in ("ar", "dflash"):
        engines[mode].shutdown()
        e = engines[mode]
        print(f"[{mode}] block_size={e.block_size} device={e.device} dtype={str(e.dtype)[6:]} tp={e.tp.size} "
              f"load={load[mode]:.1f}s", file=sys.stderr)
    ran = ", ".join(f"block {b}: {k} steps" for b, k in sorted(df.block_counts.items()))
    print(f"[dflash] ran {ran} over {args.rounds} round(s) ({_choice_note(args, df, adaptive)})", file=sys.stderr)
    ratios = [a / max(d, 1e-9) for a, d in zip(walls["ar"], walls["dflash"])]
    rounds = {"ar_wall_s": walls["ar"], "dflash_wall_s": walls["dflash"], "speedup": ratios,
              "median_speedup": statistics.median(ratios)}
    return {"ar": _rows("ar", ar, texts, last["ar"], statistics.median(walls["ar"])),
            "dflash": _rows("dflash", df, texts, last["dflash"], statistics.median(walls["dflash"])),
            "rounds": rounds}


def main(argv=None) -> int:
    args = parse_args(argv)
    texts = _prompts(args)
    modes = ["ar", "dflash"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory(prefix="dflash-generate-") as work:
        if args.mode == "both" and (args.tp_size or 1) == 1:
            results = compare_modes(args, texts, Path(work))
        else:   # ranks of a tensor-parallel group follow one engine at a time: one generation per mode
            results = {m: run_mode(args, m, texts, Path(work)) for m in modes}
    if not any(results[m] for m in modes):
        return 0  # ranks > 0
    for i, text in enumerate(texts):
        print(f"\n=== prompt {i}: {text!r}")
        for m in modes:
            r = results[m][i]
            print(f"--- {m}: {r['text']!r}")
            print(f"    tokens={r['num_output_tokens']} finish={r['finish_reason']} tau={r['tau']:.2f} "
                  f"accept_rate={r['acceptance_rate']:.2f} ttft={r['ttft_s'] * 1e3:.0f}ms "
                  f"tpot={r['tpot_s'] * 1e3:.1f}ms ({r['tok_per_s']:.1f} tok/s)")
        if len(modes) == 2:
            same = results["ar"][i]["output_ids"] == results["dflash"][i]["output_ids"]
            print(f"    DFlash tokens identical to autoregressive: {'yes' if same else 'NO'}")
    if len(modes) == 2:
        print("\n" + summary_line(results, len(texts)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
