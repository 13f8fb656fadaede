# SPDX-License-Identifier: Apache-2.0
"""Closed-loop load on the in-process engine at the shipped SmolLM2 pair's shapes (random bf16 weights): requests
keep arriving as others finish, the way a served deployment and `dflash-train`'s regeneration run it.

    python -m trtllm_dflash.bench.load --batch 64,256 --out engine_load.json          # GPU (CUDA graphs on)
    python -m trtllm_dflash.bench.load --smoke --out /tmp/engine_load.json            # CPU, tiny shapes, seconds

Per mode (AR, DFlash at the drafter's block) and batch: ``waves`` x batch requests with prompt lengths drawn in
[--prompt_len] and output lengths in [--output_len] (ignore_eos), ``batch`` of them in flight at any time.
Reported: new tokens/s over the whole run, the mean step (wall time / steps), the steady step at that batch
(every row decoding, nothing arriving; the time between steps in a run of them), their ratio (1 = admissions
cost nothing), and the graphs captured at start-up and mid-run. Random weights: acceptance is ~1, so DFlash rows
show the cost of its steps, not its speed-up (acceptance.py and the sweeps measure that).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


from trtllm_dflash import model_config
from trtllm_dflash.checkpoints.drafter_init import random_drafter_weights
from trtllm_dflash.checkpoints.resolve import PUBLIC_CONFIGS
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.provenance import record
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.weights import load_models
from trtllm_dflash.bench.step import steady_step_ms

DRAFTER_DIR = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-135m-dflash-b16"


def pair_configs(smoke: bool) -> tuple[dict, dict]:
    tcfg = dict(PUBLIC_CONFIGS["packaged:smollm2-135m"])
    dcfg = json.loads((DRAFTER_DIR / "config.json").read_text())
    if smoke:   # a 2-layer target with the same head layout: the same code paths in seconds on a CPU
        tcfg.update(num_hidden_layers=2, vocab_size=512)
        dcfg.update(num_hidden_layers=1, layer_types=["full_attention"], vocab_size=512)
        dcfg["dflash_config"] = dict(dcfg["dflash_config"], target_layer_ids=[0, 1])
    return tcfg, dcfg


def build(tcfg: dict, dcfg: dict, max_seq_len: int, device, dtype, kernels: Kernels):
    """Our target (random weights from a transformers model of that config) and a random drafter, built with
    ``kernels`` (Kernels.choose of the engines' RuntimeConfig)."""
    import transformers
    hf_cfg = transformers.AutoConfig.for_model(tcfg["model_type"], **{k: v for k, v in tcfg.items() if k != "model_type"})
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype).eval()
    with tempfile.TemporaryDirectory() as work:
        for name, cfg in (("target", tcfg), ("drafter", dcfg)):
            (Path(work) / name).mkdir()
            (Path(work) / name / "config.json").write_text(json.dumps(cfg))
        dsd = random_drafter_weights(dcfg, tcfg["hidden_size"], dtype=dtype, device=device)
        pre = {f"target.{k}": v for k, v in hf.state_dict().items()} | {f"drafter.{k}": v for k, v in dsd.items()}
        return load_models(Path(work) / "target", model_config.target_config(tcfg), Path(work) / "drafter",
                           model_config.DrafterConfig.from_hf(dcfg), TPGroup(), device, dtype, max_seq_len,
                           kernels=kernels, presharded=pre)


def steady_ms(eng: Engine, batch: int, prompt_len: int, steps: int, vocab: int) -> float:
    g = torch.Generator().manual_seed(batch)
    return steady_step_ms(eng, [torch.randint(10, vocab - 10, (prompt_len,), generator=g).tolist()
                                for _ in range(batch)], steps)


def sync(eng: Engine) -> None:
    if eng.device.type == "cuda":
        torch.cuda.synchronize()


def closed_loop(eng: Engine, batch: int, waves: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                vocab: int) -> dict:
    g = torch.Generator().manual_seed(1000 + batch)
    total = waves * batch
    work = [(torch.randint(10, vocab - 10, (int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g)),),
                           generator=g).tolist(),
             SamplingParams(max_new_tokens=int(torch.randint(output_len[0], output_len[1] + 1, (1,), generator=g)),
                            ignore_eos=True)) for _ in range(total)]
    steps0 = eng.counters["steps"]
    mid0 = eng.runner.captured_mid_run
    sync(eng)
    t0 = time.perf_counter()
    live, done, i, steps = 0, [], 0, 0
    while i < total or live:
        while live < batch and i < total:
            eng.add_request(*work[i])
            i, live = i + 1, live + 1
        finished = eng.step()
        steps += 1
        live -= len(finished)
        done += finished
    sync(eng)
    wall = time.perf_counter() - t0
    new_tokens = sum(len(r.output_ids) for r in done)
    tpot = [r.stats.tpot_s for r in done if r.stats.num_output_tokens > 1]
    return {"requests": total, "new_tokens": new_tokens, "wall_s": wall, "tok_s": new_tokens / wall,
            "engine_steps": steps, "decode_steps": eng.counters["steps"] - steps0, "mean_step_ms": 1e3 * wall / steps,
            "tpot_ms_p50": 1e3 * statistics.median(tpot), "ttft_ms_p50": 1e3 * statistics.median(r.stats.ttft_s for r in done),
            "graphs_captured_mid_run": eng.runner.captured_mid_run - mid0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="64,256", help="concurrencies (max_batch_size = the largest)")
    p.add_argument("--modes", default="ar,dflash")
    p.add_argument("--waves", type=int, default=4, help="requests per level = waves x batch")
    p.add_argument("--prompt_len", default="64:512")
    p.add_argument("--output_len", default="64:384")
    p.add_argument("--steady_prompt_len", type=int, default=256)
    p.add_argument("--max_seq_len", type=int, default=1024)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script, times nothing)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    batches = [int(b) for b in args.batch.split(",")]
    plen, olen = (tuple(int(x) for x in a.split(":")) for a in (args.prompt_len, args.output_len))
    if args.smoke:
        batches, plen, olen, args.waves = [2, 4], (4, 24), (4, 12), 2
    tcfg, dcfg = pair_configs(args.smoke)
    # the engines below run RuntimeConfig's default kernels: the models are built with them
    target, drafter = build(tcfg, dcfg, args.max_seq_len, device, dtype,
                            Kernels.choose(RuntimeConfig.kernels, RuntimeConfig.batch_invariant, device, dtype))
    vocab = tcfg["vocab_size"]
    rows = []
    for mode in args.modes.split(","):
        cfg = RuntimeConfig(block_size=1 if mode == "ar" else None, max_batch_size=max(batches),
                            max_seq_len=args.max_seq_len)
        t0 = time.perf_counter()
        eng = Engine(target, drafter if mode != "ar" else None, None, cfg, TPGroup(), set())
        start_s = time.perf_counter() - t0
        for b in batches:
            loop = closed_loop(eng, b, args.waves, plen, olen, vocab)
            steady = steady_ms(eng, b, args.steady_prompt_len if not args.smoke else 16, 20, vocab)
            row = {"mode": mode, "batch": b, "block": eng.block_size, **loop, "steady_step_ms": steady,
                   "mean_step_over_steady": loop["mean_step_ms"] / steady,
                   "tpot_p50_over_steady": loop["tpot_ms_p50"] / steady,
                   "startup_graphs": eng.startup_capture["graphs"], "startup_capture_s": eng.startup_capture["seconds"],
                   "engine_start_s": start_s}
            rows.append(row)
            print(f"{mode:6s} b={b:3d} {row['tok_s']:9.0f} tok/s  step {row['mean_step_ms']:6.2f} ms  steady "
                  f"{steady:6.2f} ms  x{row['mean_step_over_steady']:.2f}  tpot p50 {row['tpot_ms_p50']:.2f} ms  "
                  f"mid-run captures {row['graphs_captured_mid_run']}", flush=True)
        del eng
        if cuda:
            torch.cuda.empty_cache()
    out = {"rows": rows, "settings": vars(args), "weights": "random (bf16 on CUDA) at smollm2-135m + shipped drafter shapes",
           "provenance": record()}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
