# SPDX-License-Identifier: Apache-2.0
"""Summary of the AR / DFlash fixed / DFlash adaptive sweep (gpu_smollm2.sh stages sweep2, sweep3 and sweep4).

    python -m trtllm_dflash.bench.sweep2_summary --sweep sweep.jsonl --deployment_dir DEPLOY --batch 64 --input_len 128 \\
        --out summary.json
    python -m trtllm_dflash.bench.sweep2_summary ... --top 256 --regen_tok_s 41000     # sweep3: the issue #22 keys as well

- ``min/max_adaptive_over_ar_iso_interactivity``: DFlash adaptive's throughput (tok/s/gpu) over AR's at equal
  interactivity (tok/s/user), over the two Pareto fronts' shared range (bench/plot.py's iso_ratio, the
  numbers of the iso-interactivity plot); the same for DFlash at its fixed block.
- ``itl_c64_over_steady_b64``: the mean gap between streamed chunks at concurrency ``--batch`` in the sweep
  (requests arriving and leaving) over the step time of a steady batch of ``--batch`` requests that all
  decode (no arrivals), both in adaptive mode on this device: 1 = arrivals cost nothing. The steady batch decodes
  random prompts, where the drafter accepts little and the policy keeps to block 1, while the sweep's prompts make
  it draft: the ratio then also holds the drafting blocks' cost. Hence also
- ``itl_c64_fixed_over_steady_b64_fixed``: the same for the fixed block (the "DFlash" run against a steady batch at
  the deployment's block), where a step costs the same whatever is accepted: what arrivals and admission add.
- ``ar_tok_s_c<batch>``, ``ar_tok_s_c<top>``: AR's output tokens/s of all users at those concurrencies.
- ``openai_over_inprocess_c<batch>``, ``triton_over_inprocess_c<batch>``: tok/s of the runs labelled
  ``DFlash via dflash-openai`` / ``DFlash via Triton`` (the same prompts through the servers) over the
  in-process ``DFlash`` run at that concurrency; null when the sweep has no such run (``notes`` says why).
- ``openai_ar_tok_s_c<top>``, ``triton_ar_tok_s_c<top>`` (sweep4): AR's tok/s through the servers (runs labelled
  ``AR via dflash-openai`` / ``AR via Triton``, an AR deployment of the same pair); null without such a run.
- ``openai_ttft_p50_over_inprocess_c<batch>``, ``triton_...``: the servers' TTFT p50 over in-process DFlash's.
- ``regen_tok_s_b<top>``: ``--regen_tok_s`` (dflash-train's regeneration, a separate run); null if not given.
- ``steady_state``: requests per level over the concurrency (waves) and seconds measured, per run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from trtllm_dflash.bench.plot import iso_ratio
from trtllm_dflash.provenance import record


def steady_step_ms(engine_dir: Path, batch: int, input_len: int, mode: str, steps: int = 30) -> dict:
    """Median step time of ``batch`` requests that all decode (prompts prefilled first, nothing arrives): mode "ar"
    at block 1, "dflash" at the deployment's block, "adaptive" the policy measured here."""
    import torch
    from trtllm_dflash.bench import step as step_bench
    from trtllm_dflash.runtime.engine import Engine
    engine = Engine.from_deployment(engine_dir, draft_policy="fixed", max_batch_size=batch,
                                    **({"block_size": 1} if mode == "ar" else {}))
    if mode == "adaptive":
        engine.use_adaptive_policy(context=input_len)
    g = torch.Generator().manual_seed(0)
    vocab = engine.target.config.vocab_size
    step_ms = step_bench.steady_step_ms(engine, [torch.randint(10, vocab - 10, (input_len,), generator=g).tolist()
                                                 for _ in range(batch)], steps)
    return {"step_ms": step_ms, "block_counts": engine.block_counts}


SERVERS = {"openai": "DFlash via dflash-openai", "triton": "DFlash via Triton"}
AR_SERVERS = {"openai": "AR via dflash-openai", "triton": "AR via Triton"}


def serving_keys(rows: list[dict], batch: int, top: int, regen_tok_s: float | None) -> dict:
    """Issue #22's keys: AR throughput at ``batch`` and ``top``, the servers over in-process at ``batch``."""
    def tok_s(label: str, c: int) -> float | None:
        at = [r for r in rows if r["label"] == label and r["settings"]["concurrency"] == c]
        return at[-1]["metrics"]["total_tok_s"] if at else None

    def ttft_p50(label: str, c: int) -> float | None:
        at = [r for r in rows if r["label"] == label and r["settings"]["concurrency"] == c]
        return at[-1]["metrics"]["ttft_ms"]["p50"] if at else None

    out = {f"ar_tok_s_c{batch}": tok_s("AR", batch), f"ar_tok_s_c{top}": tok_s("AR", top)}
    inproc, inproc_ttft = tok_s("DFlash", batch), ttft_p50("DFlash", batch)
    for key, label in SERVERS.items():
        served = tok_s(label, batch)
        out[f"{key}_over_inprocess_c{batch}"] = served / inproc if served and inproc else None
        # sweep4: AR through the servers too (an AR deployment), and the servers' TTFT
        out[f"{key}_ar_tok_s_c{top}"] = tok_s(AR_SERVERS[key], top)
        served_ttft = ttft_p50(label, batch)
        out[f"{key}_ttft_p50_over_inprocess_c{batch}"] = (served_ttft / inproc_ttft if served_ttft and inproc_ttft
                                                          else None)
    out[f"regen_tok_s_b{top}"] = regen_tok_s
    out["steady_state"] = [{"label": r["label"], "concurrency": r["settings"]["concurrency"],
                            "waves": r["metrics"]["num_requests"] / r["settings"]["concurrency"],
                            "wall_s": r["metrics"]["wall_s"]} for r in rows]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=Path, required=True, help="JSONL with the runs labelled AR, DFlash, DFlash adaptive")
    p.add_argument("--deployment_dir", "--engine_dir", "--engine", dest="engine", type=Path, required=True, help="the deployment the sweep ran")
    p.add_argument("--batch", type=int, default=64, help="the concurrency compared with a steady batch")
    p.add_argument("--input_len", type=int, default=128, help="prompt tokens of the steady batch's requests")
    p.add_argument("--top", type=int, default=None, help="the largest concurrency, for ar_tok_s_c<top> (sweep3)")
    p.add_argument("--regen_tok_s", type=float, default=None,
                   help="dflash-train's regeneration new tokens/s at batch --top, measured separately")
    p.add_argument("--note", action="append", default=[], help="a line for the summary's notes (repeatable)")
    p.add_argument("--skip_steady", action="store_true",
                   help="no steady-batch measurement (no GPU here): the itl_*_over_steady key is null")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in args.sweep.read_text().splitlines() if line.strip()]
    curves: dict[str, list] = {}
    for r in rows:
        m = r["metrics"]
        if m.get("tok_s_user") and m.get("tok_s_gpu"):
            curves.setdefault(r["label"], []).append((m["tok_s_user"], m["tok_s_gpu"], r["settings"]["concurrency"]))
    for need in ("AR", "DFlash", "DFlash adaptive"):
        if need not in curves:
            raise SystemExit(f"error: --sweep has no run labelled {need!r} (labels: {', '.join(curves)})")
    summary: dict = {}
    for label, key in (("DFlash adaptive", "adaptive"), ("DFlash", "fixed")):
        ratios = iso_ratio(curves["AR"], curves[label])
        summary[f"{key}_over_ar_iso_interactivity"] = ratios
        vals = [x["ratio"] for x in ratios]
        summary[f"min_{key}_over_ar_iso_interactivity"] = min(vals) if vals else None
        summary[f"max_{key}_over_ar_iso_interactivity"] = max(vals) if vals else None
    b = args.batch
    for mode, label, name in (("adaptive", "DFlash adaptive", "adaptive"), ("dflash", "DFlash", "fixed")):
        at_c = [r for r in rows if r["label"] == label and r["settings"]["concurrency"] == b]
        steady = None if args.skip_steady else steady_step_ms(args.engine, b, args.input_len, mode)
        summary[f"steady_b{b}_{name}"] = steady
        itl = at_c[-1]["metrics"]["itl_chunk_ms"]["mean"] if at_c else None
        summary[f"itl_c{b}_{name}_ms"] = itl
        suffix = "" if mode == "adaptive" else "_fixed"   # the adaptive ratio keeps the key
        summary[f"itl_c{b}{suffix}_over_steady_b{b}{suffix}"] = itl / steady["step_ms"] if itl and steady else None
    if args.top is not None:
        summary.update(serving_keys(rows, args.batch, args.top, args.regen_tok_s))
    summary["notes"] = args.note
    summary["levels"] = {label: sorted(c for *_, c in pts) for label, pts in curves.items()}
    summary["requests_per_level"] = sorted({r["metrics"].get("num_requests") for r in rows} - {None})
    out = {"summary": summary, "provenance": record(["python", "-m", "trtllm_dflash.bench.sweep2_summary",
                                                      *(argv if argv is not None else sys.argv[1:])])}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
