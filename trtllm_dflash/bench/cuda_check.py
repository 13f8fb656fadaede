# SPDX-License-Identifier: Apache-2.0
"""Correctness of the torch runtime on CUDA (CUDA graphs on), in one run on the GPU host; every row is recorded:

1. tiny random Llama / Qwen3 pairs in float32 and bf16: DFlash greedy == AR greedy, AR greedy == HF transformers
   greedy, and DFlash sampled == AR sampled (same seed), six requests of different lengths over four slots;
2. the real SmolLM2-135M-Instruct target (from the packaged GGUF) with the shipped trained drafter, in float32
   (must be exact) and bf16 (equal up to a first divergence that must be a float32 near-tie: the policy in
   divergence.py: the two tokens are the float32 top 2, their float32 logits less than 0.5 apart), each
   divergence with its position and float32 numbers; tokens/s at batch 1, 8. With --batch_invariant on (the
   default: RuntimeConfig.batch_invariant on the Triton kernels) bf16 must be exact as well, at blocks 16, 8 and
   4, and each prompt's answer alone must equal its answer among the 8.

    python -m trtllm_dflash.bench.cuda_check --out results.json [--smollm2] [--drafter DIR|random] [--batch_invariant off]
    python -m trtllm_dflash.bench.cuda_check --cpu_smoke --out /tmp/c.json     # the same code paths on CPU, tiny, float32
    python -m trtllm_dflash.bench.cuda_check --rejudge results.json  # re-judge a file's divergences from its float32 numbers
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch


from trtllm_dflash.bench.divergence import POLICY, first_divergence, judge, near_tie, policy_key, policy_met
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.provenance import git_state, record
from trtllm_dflash.runtime.engine import Engine

PROMPTS = ["What is the capital of France?", "Write a Python function that returns the sum of a list.",
           "Explain speculative decoding in two sentences.", "List three prime numbers greater than 100.",
           "Translate 'good morning' into Spanish and German.", "What does a GPU do?",
           "Write a haiku about the sea.", "How many legs does a spider have?"]


def tiny_checks(work: Path, dtype: str, device: str, new_tokens: int, batch_invariant: bool = True) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.testing import write_tiny_pair
    out = []
    for arch in ("llama", "qwen3"):
        pair = work / f"tiny_{arch}"
        target, drafter = (pair / "target", pair / "drafter") if pair.is_dir() else write_tiny_pair(pair, arch)
        cfg = dict(max_seq_len=256, max_batch_size=4, dtype=dtype, device=device, batch_invariant=batch_invariant)
        ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
        df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(2, 90, (k,), generator=g).tolist() for k in (3, 17, 1, 40, 9, 25)]
        greedy = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        a, b = ar.generate(prompts, greedy), df.generate(prompts, greedy)
        hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).to(device)
        hf_same = sum(
            hf.generate(torch.tensor([p], device=device), max_new_tokens=new_tokens, do_sample=False,
                        eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() == x.output_ids
            for p, x in zip(prompts, a))
        sps = [SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=1.0, top_k=20, seed=s)
               for s in range(6)]
        sa, sd = ar.generate(prompts, sps), df.generate(prompts, sps)
        out.append({"arch": arch, "dtype": dtype, "n": len(prompts), "batch_invariant": batch_invariant,
                    "dflash_eq_ar_greedy": sum(x.output_ids == y.output_ids for x, y in zip(a, b)),
                    "ar_eq_hf_greedy": hf_same, "hf_dtype": "float32",
                    "dflash_eq_ar_sampled": sum(x.output_ids == y.output_ids for x, y in zip(sa, sd)),
                    "graphs": df.metrics()["graphs"]})
        print(out[-1], flush=True)
    return out


def smollm2_check(target: Path, drafter: Path, dtype: str, device: str, max_new: int, timing: bool,
                  batch_invariant: bool = True) -> dict:
    from transformers import AutoModelForCausalLM
    cfg = dict(max_seq_len=1024, max_batch_size=8, dtype=dtype, device=device, batch_invariant=batch_invariant)
    ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, **cfg))
    df = Engine.from_dirs(target, drafter, RuntimeConfig(**cfg))
    tok = ar.tokenizer
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
               add_special_tokens=False)["input_ids"] for p in PROMPTS]
    sp = SamplingParams(max_new_tokens=max_new)
    res = {"dtype": dtype, "n_prompts": len(ids), "max_new_tokens": max_new, "batch_invariant": batch_invariant}
    if timing:
        for eng in (ar, df):  # warm up: graph capture for the shapes used below
            eng.generate(ids[:1], sp), eng.generate(ids, sp)
        for name, eng in (("ar", ar), ("dflash", df)):
            for batch in (1, 8):
                t0 = time.perf_counter()
                reqs = eng.generate(ids[:batch], SamplingParams(max_new_tokens=max_new, ignore_eos=True))
                wall = time.perf_counter() - t0
                res[f"{name}_b{batch}_tok_per_s"] = sum(len(r.output_ids) for r in reqs) / wall
    a, b = ar.generate(ids, sp), df.generate(ids, sp)
    res.update(dflash_eq_ar_greedy=sum(x.output_ids == y.output_ids for x, y in zip(a, b)),
               first_answer=tok.decode(a[0].output_ids, skip_special_tokens=True),
               tau=sum(r.stats.tau for r in b) / len(b))
    res["diverged_at"] = [first_divergence(x.output_ids, y.output_ids) for x, y in zip(a, b)]
    if batch_invariant:   # smaller blocks of the same drafter, and each answer alone vs among the 8
        for block in (8, 4):
            small = Engine.from_dirs(target, drafter, RuntimeConfig(**{**cfg, "block_size": block})).generate(ids, sp)
            res[f"dflash_eq_ar_greedy_block{block}"] = sum(x.output_ids == y.output_ids for x, y in zip(a, small))
        res["ar_alone_eq_batch"] = sum(ar.generate([p], sp)[0].output_ids == x.output_ids for p, x in zip(ids, a))
        res["dflash_alone_eq_batch"] = sum(df.generate([p], sp)[0].output_ids == y.output_ids for p, y in zip(ids, b))
    if any(at is not None for at in res["diverged_at"]):
        ref = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).to(device).eval()
        res["divergences"] = [{"prompt": i, **near_tie(ref, p, x.output_ids[:at], x.output_ids[at], y.output_ids[at])}
                              for i, (p, x, y, at) in enumerate(zip(ids, a, b, res["diverged_at"])) if at is not None]
        del ref
    res["policy"] = POLICY[policy_key(res)]
    res["policy_met"] = policy_met(res)
    print({k: v for k, v in res.items() if k != "first_answer"}, flush=True)
    return res


def _changes(where: str, old: dict, new: dict) -> list[str]:
    """Apply ``new`` to ``old``; the values that differ, as 'where key: old -> new' (keys new to the file: silent)."""
    out = [f"{where} {k}: {json.dumps(old[k])} -> {json.dumps(v)}" for k, v in new.items()
           if old.get(k) is not None and old[k] != v]
    old.update(new)
    return out


def rejudge(path: Path, argv: list[str]) -> bool:
    """Re-judge a results file's SmolLM2 rows in place from the float32 numbers it recorded (no model, no GPU):
    each divergence's verdict and margin, each row's policy and policy_met; a `rejudged` record says what changed,
    by which command and commit. Files made before the margin was the two tokens' own gap keep the old top-1/top-2
    gap as f32_top2_margin. Returns whether every row meets its policy."""
    data = json.loads(path.read_text())
    changed = []
    for row in data.get("smollm2", []):
        for d in row.get("divergences", []):
            d.setdefault("f32_top2_margin", d.get("f32_margin"))   # what the older code called f32_margin
            new = judge(d["tokens"], d["f32_top2"], d["f32_gaps"])
            changed += _changes(f"{row['dtype']} prompt {d['prompt']}", d, new)
        new_row = {"policy": POLICY[policy_key(row)], "policy_met": policy_met(row)}
        changed += _changes(row["dtype"], row, new_row)
    if changed:
        data.setdefault("rejudged", []).append({
            "what": "policy verdicts re-evaluated on the CPU from the float32 logits this file recorded (tokens, "
                    "f32_top2, f32_gaps); outputs, divergence positions and timings are the original GPU run's",
            "command": " ".join(["python", "-m", "trtllm_dflash.bench.cuda_check", *argv]), "git": git_state(),
            "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "changed": changed})
        path.write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(changed) or f"{path}: every verdict already holds")
    return all(r["policy_met"] for r in data.get("smollm2", []))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="the results file to write (required unless --rejudge)")
    p.add_argument("--rejudge", type=Path, metavar="FILE",
                   help="re-judge FILE's divergences from its recorded float32 numbers and rewrite it; runs nothing")
    p.add_argument("--smollm2", action="store_true", help="also the real SmolLM2 pair (float32 and bf16)")
    p.add_argument("--drafter", default="smollm2-135m-dflash",
                   help="SmolLM2 drafter: a folder, a shipped drafter name, or 'random' (untrained, 1 layer)")
    p.add_argument("--skip_tiny", action="store_true")
    p.add_argument("--batch_invariant", choices=("on", "off"), default="on" if RuntimeConfig.batch_invariant else "off",
                   help="RuntimeConfig.batch_invariant of every engine (on: bf16 must be exact too)")
    p.add_argument("--cpu_smoke", action="store_true",
                   help="run on CPU in float32 with few tokens: checks the script, measures nothing")
    args = p.parse_args(argv)
    if args.rejudge:
        return 0 if rejudge(args.rejudge, sys.argv[1:] if argv is None else list(argv)) else 1
    if not args.out:
        p.error("--out: required. Fix: --out results.json (or --rejudge FILE to re-check a recorded file)")
    import transformers
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        p.error("needs a CUDA GPU (or --cpu_smoke)")
    invariant = args.batch_invariant == "on"
    res = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
           "transformers": transformers.__version__, "batch_invariant": invariant}
    checkpoints = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if not args.skip_tiny:
            dtypes = ("float32",) if args.cpu_smoke else ("float32", "bfloat16")
            res["tiny"] = [row for dt in dtypes
                           for row in tiny_checks(work, dt, device, 8 if args.cpu_smoke else 48, invariant)]
            for arch in ("llama", "qwen3"):
                checkpoints[f"tiny_{arch}_target"] = work / f"tiny_{arch}" / "target"
                checkpoints[f"tiny_{arch}_drafter"] = work / f"tiny_{arch}" / "drafter"
        if args.smollm2:
            from trtllm_dflash.checkpoints.packaged import smollm2_target_dir
            from trtllm_dflash.checkpoints.resolve import SHIPPED_DRAFTERS, shipped_drafter_dir
            target = smollm2_target_dir()
            if args.drafter == "random":
                from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
                drafter = write_random_drafter(target, work / "drafter", num_layers=1, block_size=16)
            else:
                drafter = shipped_drafter_dir(args.drafter) if args.drafter in SHIPPED_DRAFTERS else Path(args.drafter)
            checkpoints.update(smollm2_target=target, smollm2_drafter=drafter)
            dtypes = ("float32",) if args.cpu_smoke else ("float32", "bfloat16")
            res["smollm2"] = [smollm2_check(target, drafter, dt, device, 16 if args.cpu_smoke else 128,
                                            timing=dt == "bfloat16", batch_invariant=invariant) for dt in dtypes]
        res["provenance"] = record(["python", "-m", "trtllm_dflash.bench.cuda_check", *(sys.argv[1:] if argv is None else argv)],
                                   checkpoints=checkpoints)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    ok = all(r["dflash_eq_ar_greedy"] == r["n"] and r["dflash_eq_ar_sampled"] == r["n"] for r in res.get("tiny", []))
    ok &= all(r["policy_met"] and r.get("ar_alone_eq_batch", r["n_prompts"]) == r["n_prompts"]
              and r.get("dflash_alone_eq_batch", r["n_prompts"]) == r["n_prompts"] for r in res.get("smollm2", []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
