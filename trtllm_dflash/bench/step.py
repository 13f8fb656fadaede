# SPDX-License-Identifier: Apache-2.0
"""Decode-step cost of the torch runtime at real 8B shapes (random bf16 weights), against the HBM roofline
and, in the same run, HF transformers' own `generate` and the `dflash` reference package on the same pair.

    python -m trtllm_dflash.bench.step --models qwen3-8b,llama-3.1-8b --batch 1,4,16,64 --out results.json

Per model and batch: the AR step (block 1) and the DFlash step (drafter pass + verify of block B), timed as
the wall time of `Engine.step()` (device work + the one host sync + bookkeeping; CUDA graphs on), median of
`--steps`. Roofline = bytes that must cross HBM per step (every weight read once, the KV cache read once)
over the copy bandwidth measured in the same run. Random weights: acceptance is ~1, so only step costs
are meaningful here; acceptance comes from acceptance.py on a trained pair.

``--profile`` adds kernel counts per step and the host gap (step wall time minus the GPU time of its
kernels: launch, Python bookkeeping and the one sync), and kernels per decoder layer (one eager forward of the
target and of the drafter with 1 and with 2 layers: per layer = the difference). ``--cost_table`` measures the
adaptive draft policy's cost table (runtime/draft_policy.py) for the DFlash engine at every batch and candidate
block. ``--kernels`` picks RuntimeConfig.kernels (torch: the reference path; triton: the fused decode kernels of
runtime/kernels/; auto, the default: triton on a GPU). ``--models smollm2-135m`` runs SmolLM2-135M's shapes with
the shipped drafter's config. ``--smoke`` shrinks every model to a few tiny layers and runs on the CPU when there
is no GPU (the Triton kernels then run in Triton's interpreter): it checks the command, not the speed.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


from trtllm_dflash import model_config
from trtllm_dflash.checkpoints.drafter_init import random_drafter_weights
from trtllm_dflash.checkpoints.resolve import KNOWN_MODELS, PUBLIC_CONFIGS, SHIPPED_DRAFTERS, shipped_drafter_dir
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.provenance import record
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.draft_policy import candidate_blocks, measure_costs
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.weights import load_models

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
_KIND = "CUDA" if DEV.type == "cuda" else "CPU"   # the profiler's device type of the work timed here
BF16 = torch.bfloat16 if DEV.type == "cuda" else torch.float32   # the model dtype (float32 for a CPU smoke run)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def empty_cache() -> None:
    if DEV.type == "cuda":
        torch.cuda.empty_cache()


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def cuda_time(fn, reps: int = 10) -> float:
    """Median seconds of fn() measured with CUDA events (wall clock on a CPU smoke run)."""
    times = []
    if DEV.type != "cuda":
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def graphed(fn):
    """fn captured as one CUDA graph (warmed up on a side stream first, as the engine does); returns the replay."""
    return capture(fn)[0].replay


def ceilings(smoke: bool = False) -> dict:
    if smoke:   # the same measurement at a size a CPU finishes at once
        x, y = torch.randn(1 << 20), torch.empty(1 << 20)
        a = torch.randn(256, 256)
        return {"copy_bw_bytes_per_s": 2 * x.numel() * 4 / cuda_time(lambda: y.copy_(x), 3),
                "bf16_matmul_flops": 2 * 256**3 / cuda_time(lambda: a @ a, 3)}
    x = torch.empty(2 * 1024**3 // 2, dtype=BF16, device=DEV).normal_()
    y = torch.empty_like(x)
    cuda_time(lambda: y.copy_(x), 3)
    bw = 2 * x.numel() * 2 / cuda_time(lambda: y.copy_(x), 10)  # bytes read + written
    a = torch.randn(8192, 8192, dtype=BF16, device=DEV)
    cuda_time(lambda: a @ a, 3)
    flops = 2 * 8192**3 / cuda_time(lambda: a @ a, 10)
    del x, y, a
    empty_cache()
    return {"copy_bw_bytes_per_s": bw, "bf16_matmul_flops": flops}


def target_config(name: str, smoke: bool = False) -> dict:
    cfg = dict(PUBLIC_CONFIGS[KNOWN_MODELS[name].target])
    cfg.setdefault("rms_norm_eps", 1e-6 if "qwen" in name else 1e-5)
    if name.startswith("llama"):
        cfg["rope_scaling"] = dict(LLAMA3_ROPE, rope_theta=cfg["rope_theta"])
    return shrink(cfg, target=True) if smoke else cfg


def drafter_config(name: str, smoke: bool = False) -> dict:
    """The public config of the model's DFlash drafter, or the config.json of a drafter shipped in this package
    (smollm2-135m's)."""
    spec = KNOWN_MODELS[name].drafter
    if spec in SHIPPED_DRAFTERS:
        cfg = json.loads((shipped_drafter_dir(spec) / "config.json").read_text())
        cfg = {k: v for k, v in cfg.items() if not k.startswith("dflash_train")}
    else:
        cfg = dict(PUBLIC_CONFIGS[spec])
    return shrink(cfg, target=False) if smoke else cfg


def shrink(cfg: dict, target: bool) -> dict:
    """--smoke: the same architecture (head grouping, q/k norm, RoPE, block size) with tiny widths and depths."""
    groups = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    small = dict(cfg, hidden_size=32 * groups, intermediate_size=128, num_attention_heads=2 * groups, num_key_value_heads=2,
                 head_dim=16, vocab_size=1024, num_hidden_layers=4 if target else 2)
    if not target:
        dc = dict(cfg.get("dflash_config") or {}, mask_token_id=1023, target_layer_ids=[1, 2])
        small.update(dflash_config=dc, num_target_layers=4, layer_types=None)
    return small


def build_pair(name: str, max_seq_len: int, work: Path, kernels: Kernels, smoke: bool = False):
    """HF model with random weights on the GPU, our target sharing its tensors, and a random drafter, both built
    with ``kernels`` (Kernels.choose of the engines' RuntimeConfig: the Engine refuses models built otherwise)."""
    import transformers
    tcfg, dcfg = target_config(name, smoke), drafter_config(name, smoke)
    hf_cfg = transformers.AutoConfig.for_model(tcfg["model_type"], **{k: v for k, v in tcfg.items() if k != "model_type"})
    with torch.device(DEV):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=BF16).eval()
    (work / "target").mkdir(parents=True, exist_ok=True)
    (work / "target" / "config.json").write_text(json.dumps(tcfg))
    (work / "drafter").mkdir(parents=True, exist_ok=True)
    (work / "drafter" / "config.json").write_text(json.dumps(dcfg))
    dsd = random_drafter_weights(dcfg, tcfg["hidden_size"], dtype=BF16, device=DEV)
    pre = {f"target.{k}": v for k, v in hf.state_dict().items()} | {f"drafter.{k}": v for k, v in dsd.items()}
    target, drafter = load_models(work / "target", model_config.target_config(tcfg), work / "drafter",
                                  model_config.DrafterConfig.from_hf(dcfg), TPGroup(), DEV, BF16, max_seq_len,
                                  kernels=kernels, presharded=pre)
    return hf, target, drafter, dcfg, dsd


def weight_bytes(module: torch.nn.Module, skip=("embed_tokens",)) -> int:
    return sum(p.numel() * p.element_size() for n, p in module.named_parameters() if not n.startswith(skip))


def settle(eng: Engine, reqs) -> None:
    """Step until every prompt is prefilled (chunked under max_num_tokens, so possibly several steps), then
    capture this shape's graph and warm up: the timed steps are decode steps only."""
    while not all(r.decoding for r in reqs):
        eng.step()
    for _ in range(3):
        eng.step()


def step_spacing_s(eng: Engine, steps: int, window: int = 5) -> list[float]:
    """Seconds per step in runs of ``window`` steps: step() enqueues step k+1 and then reads step k (the host's work
    overlaps the device's), so one call's wall time is not its step; the spacing of steps in a run is."""
    def sync():
        if eng.device.type == "cuda":
            torch.cuda.synchronize()
    times = []
    for _ in range(max(1, steps // window)):
        sync()
        t0 = time.perf_counter()
        for _ in range(window):
            eng.step()
        sync()
        times.append((time.perf_counter() - t0) / window)
    return times


def steady_step_ms(eng: Engine, prompts: list[list[int]], steps: int) -> float:
    """Median step time (ms) of one request per prompt, all decoding and nothing arriving; the requests are
    cancelled and the engine drained afterwards, so the next measurement starts from an idle engine."""
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=10**6, ignore_eos=True)) for p in prompts]
    settle(eng, reqs)
    times = step_spacing_s(eng, steps)
    for r in reqs:
        eng.cancel(r.request_id)
    while eng.has_work():
        eng.step()
    return 1e3 * statistics.median(times)


def time_engine(eng: Engine, batch: int, ctx: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(100, 1000, (ctx,), generator=g).tolist() for _ in range(batch)]
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=10**6, ignore_eos=True)) for p in prompts]
    settle(eng, reqs)
    times = step_spacing_s(eng, steps)
    for r in reqs:
        eng.cancel(r.request_id)
    eng.step()
    return {"step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times)}


def profile_steps(eng: Engine, batch: int, ctx: int, steps: int = 3, step_ms: float | None = None) -> dict:
    """Kernel-level view of a few steps: count, the top kernels by GPU time, and the host gap
    (``step_ms`` minus the kernels' GPU time per step)."""
    reqs = [eng.add_request(list(range(100, 100 + ctx)), SamplingParams(max_new_tokens=10**6, ignore_eos=True))
            for _ in range(batch)]
    settle(eng, reqs)

    def run():
        for _ in range(steps):
            eng.step()
    prof = _profiled(run)
    evts = _averages(prof)
    for r in reqs:
        eng.cancel(r.request_id)
    eng.step()
    total = sum(e.self_device_time_total for e in evts)
    top = sorted(evts, key=lambda e: -e.self_device_time_total)[:12]
    device_ms = total / 1e3 / steps
    return {"kernels_per_step": sum(e.count for e in evts) / steps, "device_ms_per_step": device_ms,
            "host_gap_ms_per_step": None if step_ms is None else step_ms - device_ms,
            "top": [{"name": e.key[:90], "count": e.count // steps, "ms": e.self_device_time_total / 1e3 / steps}
                    for e in top],
            "idle_gaps": idle_gaps(prof, steps)}


def idle_gaps(prof, steps: int, top: int = 8) -> list[dict]:
    """Where the device sat idle: every gap between the end of the work so far and the next kernel's start, summed
    per (kernel before, kernel after) pair over the profiled steps, the largest first, in us per step. The host gap
    is their sum; the pairs say whether it sits between steps (the host late with the next one) or inside one (a
    kernel waiting on the host mid-step)."""
    evts = sorted((e for e in prof.events() if e.device_type.name == _KIND), key=lambda e: e.time_range.start)
    pairs: dict[tuple[str, str], list] = {}
    end, before = None, None
    for e in evts:
        if end is not None and e.time_range.start > end:
            gap = pairs.setdefault((before, e.name), [0.0, 0])
            gap[0] += e.time_range.start - end
            gap[1] += 1
        if end is None or e.time_range.end > end:
            end, before = e.time_range.end, e.name
    ranked = sorted(pairs.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"before": b[:60], "after": a[:60], "us_per_step": round(us / steps, 1), "count_per_step": n / steps}
            for (b, a), (us, n) in ranked]


def _profiled(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[getattr(ProfilerActivity, _KIND)]) as prof:
        fn()
        sync()
    return prof


def _averages(prof) -> list:
    return [e for e in prof.key_averages() if e.device_type.name == _KIND]


def device_events(fn) -> list:
    """The profiler's per-kernel averages of fn()'s device work (CPU ops on a CPU smoke run)."""
    return _averages(_profiled(fn))


def count_kernels(fn) -> int:
    fn()   # compiles / autotunes outside the count
    return sum(e.count for e in device_events(fn))


@torch.inference_mode()
def layer_kernels(eng: Engine, block: int, ctx: int) -> dict:
    """Kernels per decoder layer in one eager forward at decode shapes (batch 1, ``block`` query rows over a
    cache of ``ctx`` tokens; the drafter at its own block): the model run with 1 and with 2 of its layers, per
    layer = the difference, the rest (embedding, RoPE tables, masks, final norm) = count(1) - per layer."""
    runner, out = eng.runner, {}
    kv_len = ctx + block
    pos = torch.arange(ctx, kv_len, device=DEV)[None]

    def per_layer(model, forward) -> dict:
        layers, capture = model.layers, getattr(model, "capture_layers", ())
        counts = []
        try:
            for k in (1, 2)[:len(layers)]:
                model.layers = torch.nn.ModuleList(list(layers)[:k])
                if capture:
                    model.capture_layers = ()
                counts.append(count_kernels(forward))
        finally:
            model.layers = layers
            if capture:
                model.capture_layers = capture
        if len(counts) < 2:   # a one-layer model: no difference to take
            return {"per_layer": None, "rest": None, "total": counts[0], "layers": len(layers)}
        return {"per_layer": counts[1] - counts[0], "rest": 2 * counts[0] - counts[1], "layers": len(layers)}

    ids = torch.full((1, block), 100, device=DEV)
    out[f"target_T{block}"] = per_layer(eng.target, lambda: eng.target(ids, pos, runner.cache, slice(0, 1), kv_len))
    if eng.drafter is not None:
        B = eng.drafter.config.block_size
        x = eng.target.embed(torch.full((1, B), 100, device=DEV))
        dpos = torch.arange(ctx, ctx + B, device=DEV)[None]
        start = torch.tensor([ctx], device=DEV)
        out[f"drafter_T{B}"] = per_layer(eng.drafter, lambda: eng.drafter(x, dpos, start, runner.draft_cache,
                                                                         slice(0, 1), ctx + B))
    return out


def hf_ar_per_token(hf, ctx: int, n: int = 32) -> float:
    ids = torch.randint(100, 1000, (1, ctx), device=DEV)

    def gen(k):
        sync()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t0

    gen(4)
    return (statistics.median([gen(n + 1) for _ in range(2)]) - statistics.median([gen(1) for _ in range(2)])) / n


def dflash_ref_per_iteration(hf, dcfg: dict, dsd: dict, ctx: int, n: int = 48) -> float:
    import transformers
    from dflash.model import DFlashDraftModel, dflash_generate
    cfg = transformers.Qwen3Config(**{k: v for k, v in dcfg.items() if k not in ("architectures", "model_type")})
    with torch.device(DEV):
        ref = DFlashDraftModel(cfg).to(BF16).eval()
    missing = ref.load_state_dict(dsd, strict=False).missing_keys
    assert not [k for k in missing if "rotary" not in k], missing
    ids = torch.randint(100, 1000, (1, ctx), device=DEV)
    dflash_generate(ref, hf, ids, max_new_tokens=8, stop_token_ids=None, return_stats=True)
    st = dflash_generate(ref, hf, ids, max_new_tokens=n, stop_token_ids=None, return_stats=True)
    return st.time_per_output_token * st.num_output_tokens / len(st.acceptance_lengths)


def bench_model(name: str, args, ceil: dict, rows: list, summary: dict) -> None:
    max_seq = args.ctx + args.steps * 20 + 64
    kernel, invariant = args.kernels, args.batch_invariant == "on"
    with tempfile.TemporaryDirectory() as work:
        hf, target, drafter, dcfg, dsd = build_pair(name, max_seq, Path(work),
                                                    Kernels.choose(kernel, invariant, DEV, BF16), args.smoke)
    B = drafter.config.block_size
    bw = ceil["copy_bw_bytes_per_s"]
    t_bytes, d_bytes = weight_bytes(target), weight_bytes(drafter)
    lm_head = target.lm_head.weight.numel() * 2
    L, H, D = target.kv_shape()
    kv_per_tok = 2 * L * H * D * 2
    dL, dH, dD = drafter.kv_shape()
    dkv_per_tok = 2 * dL * dH * dD * 2
    rc = dict(max_batch_size=max(args.batch), max_seq_len=max_seq, kernels=kernel, batch_invariant=invariant)
    engines = {"ar": Engine(target, None, None, RuntimeConfig(block_size=1, **rc), TPGroup(), set()),
               "dflash": Engine(target, drafter, None, RuntimeConfig(**rc), TPGroup(), set())}
    for b in args.batch:
        for mode, eng in engines.items():
            r = time_engine(eng, b, args.ctx, args.steps)
            need = t_bytes + b * args.ctx * kv_per_tok + (d_bytes + lm_head + b * args.ctx * dkv_per_tok if mode == "dflash" else 0)
            tokens = b * eng.block_size  # each weight byte does 2 FLOP per token that passes through it
            flops = 2 * tokens * (t_bytes / 2 + (d_bytes / 2 + lm_head / 2 if mode == "dflash" else 0))
            row = {"model": name, "attention_kernel": kernel, "batch_invariant": args.batch_invariant, "mode": mode, "batch": b, "block_size": eng.block_size, "ctx": args.ctx, **r,
                   "roofline_ms": 1e3 * max(need / bw, flops / ceil["bf16_matmul_flops"]),
                   "memory_floor_ms": 1e3 * need / bw, "compute_floor_ms": 1e3 * flops / ceil["bf16_matmul_flops"],
                   "bytes_per_step": need, "graphs": eng.metrics()["graphs"]}
            row["roofline_fraction"] = row["roofline_ms"] / row["step_ms"]
            rows.append(row)
            print(f"{name:14s} {mode:6s} b={b:3d} step {row['step_ms']:7.2f} ms  roofline {row['roofline_ms']:6.2f} ms "
                  f"({100 * row['roofline_fraction']:.0f}%)", flush=True)
    ar1 = next(r for r in rows if r["model"] == name and r["mode"] == "ar" and r["batch"] == min(args.batch))
    df1 = next(r for r in rows if r["model"] == name and r["mode"] == "dflash" and r["batch"] == min(args.batch))
    s = {"ar_b1_step_ms": ar1["step_ms"], "dflash_b1_step_ms": df1["step_ms"],
         "ar_b1_roofline_fraction": ar1["roofline_fraction"], "dflash_b1_step_over_ar_step": df1["step_ms"] / ar1["step_ms"],
         "block_size": B, "target_weight_gb": t_bytes / 1e9, "drafter_weight_gb": d_bytes / 1e9,
         "attention_kernel": kernel, "batch_invariant": args.batch_invariant}
    if args.profile:
        s["kernels_per_layer"] = {**layer_kernels(engines["ar"], 1, args.ctx), **layer_kernels(engines["dflash"], B, args.ctx)}
        print(f"kernels per layer {name} ({kernel}): "
              + "; ".join(f"{k}: {v['per_layer']} x {v['layers']} + {v['rest']}" for k, v in s["kernels_per_layer"].items()),
              flush=True)
        for mode in ("ar", "dflash"):
            for b in sorted({min(args.batch), max(args.batch)}):
                ms = next(r["step_ms"] for r in rows if r["model"] == name and r["mode"] == mode and r["batch"] == b)
                prof = profile_steps(engines[mode], b, args.ctx, step_ms=ms)
                s[f"profile_{mode}_b{b}"] = prof
                print(f"profile {name} {mode} b={b}: {prof['kernels_per_step']:.0f} kernels, "
                      f"{prof['device_ms_per_step']:.2f} ms device/step, host gap {prof['host_gap_ms_per_step']:.3f} ms; top: "
                      + "; ".join(f"{t['name'][:40]} x{t['count']} {t['ms']:.2f}ms" for t in prof["top"][:6])
                      + "; idle: " + "; ".join(f"{g['before'][:30]} -> {g['after'][:30]} {g['us_per_step']:.0f}us"
                                                for g in prof["idle_gaps"][:3]), flush=True)
    if args.cost_table:
        t0 = time.perf_counter()
        table = measure_costs(engines["dflash"].runner, args.batch, candidate_blocks(B), args.ctx, reps=5)
        s["cost_table"] = table.to_json()
        print(f"cost table {name} ({time.perf_counter() - t0:.0f}s): "
              + "; ".join(f"b{n}: " + " ".join(f"{k}={1e3 * v:.2f}" for k, v in r.items()) for n, r in table.seconds.items()),
              flush=True)
    del engines
    empty_cache()
    if args.peers:
        try:
            hf_tok = hf_ar_per_token(hf, args.ctx)
            s.update(hf_ar_b1_ms_per_token=1e3 * hf_tok, speedup_vs_hf_ar_b1=hf_tok * 1e3 / ar1["step_ms"])
        except Exception as err:  # a peer failing must not lose our own numbers
            s["hf_error"] = repr(err)
        try:
            ref_it = dflash_ref_per_iteration(hf, dcfg, dsd, args.ctx)
            s.update(dflash_ref_b1_ms_per_iteration=1e3 * ref_it,
                     speedup_vs_dflash_ref_b1=ref_it * 1e3 / df1["step_ms"])
        except Exception as err:
            s["dflash_ref_error"] = repr(err)
    summary[name] = s
    print(json.dumps({name: s}, indent=1), flush=True)
    del hf, target, drafter
    empty_cache()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="qwen3-8b,llama-3.1-8b")
    p.add_argument("--batch", default="1,4,16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--ctx", type=int, default=512, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--peers", action="store_true", help="also time HF generate and the dflash reference package")
    p.add_argument("--profile", action="store_true", help="kernel counts and top kernels of b=min and b=max steps")
    p.add_argument("--cost_table", action="store_true", help="measure the adaptive draft policy's cost table")
    p.add_argument("--kernels", "--attention_kernel", dest="kernels", default=RuntimeConfig.kernels,
                   choices=["auto", "triton", "torch"],
                   help="RuntimeConfig.kernels for every engine of the run (--attention_kernel: its old name)")
    p.add_argument("--batch_invariant", choices=("on", "off"), default="on" if RuntimeConfig.batch_invariant else "off",
                   help="RuntimeConfig.batch_invariant for every engine of the run (its cost: run on and off)")
    p.add_argument("--smoke", action="store_true", help="tiny layers, CPU if there is no GPU: checks the command runs")
    p.add_argument("--out", required=True)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    import transformers
    ceil = ceilings(args.smoke)
    meta = {"gpu": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "command": " ".join(sys.argv), "attention_kernel": args.kernels,
            "batch_invariant": args.batch_invariant, "smoke": args.smoke, **ceil}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    print(json.dumps(meta), flush=True)
    # random in-memory weights at the public configs' shapes: no checkpoint to hash
    prov = record(["python", "-m", "trtllm_dflash.bench.step", *(argv if argv is not None else sys.argv[1:])])
    rows, summary = [], {}
    for name in args.models.split(","):
        bench_model(name, args, ceil, rows, summary)
        Path(args.out).write_text(json.dumps({"meta": meta, "summary": summary, "rows": rows, "provenance": prov},
                                             indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
