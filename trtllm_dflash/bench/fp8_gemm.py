# SPDX-License-Identifier: Apache-2.0
"""FP8 GEMMs (``RuntimeConfig.fp8_gemm``, runtime/fp8.py) against the bf16 GEMMs of dequantised weights, one GPU.

    python -m trtllm_dflash.bench.fp8_gemm --out fp8_gemm_h100.json
    python -m trtllm_dflash.bench.fp8_gemm --cpu_smoke --out /tmp/fp8_smoke.json   # every code path, tiny, on CPU

(a) Linear level: Qwen3-8B projections and Llama-3.1-70B's per-rank projections at TP 8, M tokens at a time:
    bf16 F.linear vs Fp8Linear (per-token activation quantization + torch._scaled_mm; also with Hopper's fast
    accumulation, and the GEMM / the quantization alone), eager and replayed from a CUDA graph (small M: the
    runtime replays its decode steps as graphs). Each timed call cycles through copies of the weight totalling
    >= 256 MB, so weights stream from HBM as in a real forward rather than sitting in the 50 MB L2. Median of
    --reps CUDA-event timings; effective weight bandwidth = weight bytes / time.
(b) Step level: a Qwen3-8B-shaped target cut to --layers layers with random bf16 weights, its ModelOpt-style
    FP8 copy (per-tensor weight_scale = amax / 448, input_scale 1.0, the configs dflash-build --quant fp8
    writes) and a random drafter: Engine AR and DFlash step times (step_bench.time_engine: CUDA graphs on) of
    the bf16 target and of the FP8 target with fp8_gemm. The FP8 target with fp8_gemm off is a bf16 model of
    the same shapes (same speed); it only serves the agreement check: greedy tokens of fp8_gemm vs dequantised
    weights, free-running and teacher-forced (reported, not asserted; random weights give flat logits, so
    this is a lower bound on what a trained model shows).
Weights reach the loader in memory (load_target's ``presharded`` dict, the path of a pre-sharded deployment);
only config.json and hf_quant_config.json are written, which saves a ~15 GB disk round trip.
A failing part is recorded under "errors" in the JSON (exit code 1) and the other parts still run.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F


from trtllm_dflash import model_config
from trtllm_dflash.bench.step import cuda_time, graphed, target_config, time_engine

from trtllm_dflash.checkpoints import hf
from trtllm_dflash.checkpoints.drafter_init import drafter_config, random_drafter_weights
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime import fp8
from trtllm_dflash.runtime.distributed import TPGroup
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.kernels import Kernels
from trtllm_dflash.runtime.kv_cache import KVCache
from trtllm_dflash.runtime.weights import load_drafter, load_target
from trtllm_dflash.runtime.models import layers
from trtllm_dflash.runtime.quant import fp8_row_scales
from trtllm_dflash.provenance import record
from trtllm_dflash.versions import installed

# (in_features, out_features) per projection, fused as the runtime runs them
LINEARS = {
    "qwen3-8b": {"qkv_proj": (4096, 6144), "o_proj": (4096, 4096), "gate_up_proj": (4096, 24576),
                 "down_proj": (12288, 4096)},
    "llama-3.1-70b/tp8": {"qkv_proj": (8192, 1280), "o_proj": (1024, 8192), "gate_up_proj": (8192, 7168),
                          "down_proj": (3584, 8192)},
}
SMOKE_LINEARS = {"tiny": {"qkv_proj": (64, 96), "down_proj": (128, 64)}}
SMOKE_TARGET = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 1024, "rope_theta": 1000000,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
COLD_BYTES = 256 * 1024**2   # weight bytes cycled per timed call (> L2)


# ---- timing ---------------------------------------------------------------------------------------------------
def timed(fn, reps: int, cuda: bool) -> float:
    """Median seconds of fn() (after 3 warm-up calls): CUDA events on a GPU, the wall clock elsewhere."""
    for _ in range(3):
        fn()
    if cuda:
        return cuda_time(fn, reps)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- (a) linear level ---------------------------------------------------------------------------------------
def fp8_layer(w: torch.Tensor) -> fp8.Fp8Linear:
    """Fp8Linear of a bf16 weight, quantized per tensor like ModelOpt (amax / 448)."""
    scale = w.abs().amax().float() / fp8.FP8_MAX
    with torch.device(w.device):
        lin = fp8.Fp8Linear(w.shape[1], w.shape[0])
    lin.weight.data = (w.float() / scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8)
    lin.weight_scale.data = fp8_row_scales(scale, w.shape[0])
    return lin


def fast_accum(lin: fp8.Fp8Linear) -> fp8.Fp8Linear:
    """The same layer (a shallow copy shares its FP8 weight) with Hopper's fast FP8 accumulation."""
    f = copy.copy(lin)
    f.fast_accum = True
    return f


def bench_linear(model: str, name: str, k: int, n: int, ms: list[int], args, dev, dtype) -> list[dict]:
    cuda = dev.type == "cuda"
    copies = max(1, math.ceil(COLD_BYTES / (k * n * 2))) if cuda else 1
    gen = torch.Generator(dev).manual_seed(0)
    ws = [torch.randn(n, k, generator=gen, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
    lins = [fp8_layer(w) for w in ws]
    fast = [fast_accum(lin) for lin in lins] if cuda else []   # CPU _scaled_mm has no fast accumulation
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device=dev, dtype=dtype)
        xq, sx = fp8.quantize_rows(x)
        with torch.inference_mode():   # against a float32 GEMM of the dequantised weight and unquantized x
            ref = F.linear(x.float(), lins[0].weight.float() * lins[0].weight_scale[:, None])
            err = ((lins[0](x).float() - ref).norm() / ref.norm()).item()
        variants = {
            "bf16": lambda: [F.linear(x, w) for w in ws],
            "fp8": lambda: [lin(x) for lin in lins],
            "fp8_fast_accum": lambda: [f(x) for f in fast],
            "fp8_gemm_only": lambda: [torch._scaled_mm(xq, lin.weight.t(), scale_a=sx, scale_b=lin.weight_scale[None],
                                                       out_dtype=dtype) for lin in lins],
            "quantize_only": lambda: [fp8.quantize_rows(x) for _ in lins],
        }
        if not cuda:
            del variants["fp8_fast_accum"]
        row = {"model": model, "layer": name, "in": k, "out": n, "M": m, "weight_copies": copies,
               "fp8_rel_err_vs_f32": err}
        with torch.inference_mode():
            for v, fn in variants.items():
                row[f"{v}_us"] = 1e6 * timed(fn, args.reps, cuda) / copies
            if cuda and m <= args.graph_max_m:
                for v in ("bf16", "fp8", "fp8_fast_accum"):
                    row[f"{v}_graph_us"] = 1e6 * timed(graphed(variants[v]), args.reps, cuda) / copies
        for suffix in ("", "_graph"):
            if f"fp8{suffix}_us" in row:
                row[f"speedup{suffix}"] = row[f"bf16{suffix}_us"] / row[f"fp8{suffix}_us"]
                row[f"bf16{suffix}_weight_GBps"] = k * n * 2 / row[f"bf16{suffix}_us"] / 1e3
                row[f"fp8{suffix}_weight_GBps"] = (k * n + 4 * n) / row[f"fp8{suffix}_us"] / 1e3
        rows.append(row)
        g = f"  graph {row['bf16_graph_us']:8.1f} {row['fp8_graph_us']:8.1f} x{row['speedup_graph']:.2f}" \
            if "speedup_graph" in row else ""
        print(f"{model:18s} {name:13s} M={m:5d}  bf16 {row['bf16_us']:8.1f} us  fp8 {row['fp8_us']:8.1f} us "
              f"x{row['speedup']:.2f}{g}  (rel err {err:.3f})", flush=True)
    del ws, lins, fast
    if cuda:
        torch.cuda.empty_cache()
    return rows


# ---- (b) step level -----------------------------------------------------------------------------------------
def random_target(cfg: dict, dev, dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named random weights of a Llama / Qwen3 target (std 0.02, norms 1)."""
    g = torch.Generator(dev).manual_seed(seed)
    h, inter, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads
    q, kv = heads * d, (cfg.get("num_key_value_heads") or heads) * d

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=dev) * 0.02).to(dtype)

    def ones(size):
        return torch.ones(size, dtype=dtype, device=dev)

    sd = {"model.embed_tokens.weight": w(cfg["vocab_size"], h), "model.norm.weight": ones(h),
          "lm_head.weight": w(cfg["vocab_size"], h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                   p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                   p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                   p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
                   p + "mlp.down_proj.weight": w(h, inter)})
        if cfg["model_type"] == "qwen3":
            sd.update({p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d)})
    return sd


def modelopt_fp8(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ModelOpt's FP8 export holds for these weights: each decoder linear as float8_e4m3fn with a per-tensor
    weight_scale (amax / 448) and an input_scale; embeddings, norms and lm_head unchanged (shared tensors)."""
    out = {}
    for name, w in sd.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            scale = w.abs().amax().float() / fp8.FP8_MAX
            out[name] = (w.float() / scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8)
            out[f"{name}_scale"] = scale
            out[name.removesuffix("weight") + "input_scale"] = torch.ones((), device=w.device)
        else:
            out[name] = w
    return out


def write_configs(root: Path, tcfg: dict, dcfg: dict) -> dict[str, Path]:
    """config.json folders for the bf16 target, its FP8 copy (with ModelOpt's quantization configs) and the drafter."""
    qcfg = {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head", "model.embed_tokens"]}
    producer = {"name": "modelopt (fp8_gemm_bench stand-in)",
                "version": installed("nvidia-modelopt")["nvidia-modelopt"] or "0"}
    dirs = {"bf16": root / "target_bf16", "fp8": root / "target_fp8", "drafter": root / "drafter"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    (dirs["bf16"] / "config.json").write_text(json.dumps(tcfg))
    (dirs["fp8"] / "hf_quant_config.json").write_text(json.dumps({"producer": producer, "quantization": qcfg}))
    (dirs["fp8"] / "config.json").write_text(json.dumps({**tcfg, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "FP8", "ignore": qcfg["exclude_modules"], "producer": producer,
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                      "weights": {"dynamic": False, "num_bits": 8, "type": "float"}}}}}))
    (dirs["drafter"] / "config.json").write_text(json.dumps(dcfg))
    return dirs


def greedy_tokens(target, n_prompts: int, new_tokens: int, vocab: int, max_seq: int) -> list[list[int]]:
    eng = Engine(target, None, None, RuntimeConfig(block_size=1, max_batch_size=n_prompts, max_seq_len=max_seq),
                 TPGroup(), set())
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, vocab - 3, (16 + 8 * i,), generator=g).tolist() for i in range(n_prompts)]
    out = [r.output_ids for r in eng.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))]
    del eng
    return out


@torch.inference_mode()
def teacher_forced(targets: dict, ids: torch.Tensor, dtype) -> dict[str, torch.Tensor]:
    """Logits [n, T, vocab] of each target on the same tokens (one prefill forward)."""
    out = {}
    for name, t in targets.items():
        L, H, D = t.kv_shape()
        cache = KVCache(L, ids.shape[0], H, ids.shape[1], D, dtype, ids.device)
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        h, _ = t(ids, pos, cache, slice(0, ids.shape[0]), None)
        out[name] = t.logits(h).float()
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    same = [sum(x == y for x, y in zip(p, q)) / len(p) for p, q in zip(a, b)]
    prefix = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b)]
    return {"token_match_fraction": statistics.mean(same), "mean_common_prefix": statistics.mean(prefix),
            "identical_sequences": sum(p == q for p, q in zip(a, b)), "sequences": len(a)}


def bench_steps(args, dev, dtype, smoke: bool, result: dict) -> None:
    tcfg = dict(SMOKE_TARGET) if smoke else {**target_config(args.model), "num_hidden_layers": args.layers}
    dcfg = drafter_config(tcfg, num_layers=args.drafter_layers, block_size=args.block_size)
    max_seq = args.ctx + args.steps * 20 + 64
    sd = random_target(tcfg, dev, dtype)
    q = modelopt_fp8(sd)
    pre_bf16 = {f"target.{k}": v for k, v in sd.items()}
    pre_fp8 = {f"target.{k}": v for k, v in q.items()}
    dsd = random_drafter_weights(dcfg, tcfg["hidden_size"], dtype=dtype, device=dev)
    pre_d = {f"drafter.{k}": v for k, v in dsd.items()}
    # the engines below run RuntimeConfig's default kernels: the models are built with them
    kernels = Kernels.choose(RuntimeConfig.kernels, RuntimeConfig.batch_invariant, dev, dtype)
    with tempfile.TemporaryDirectory() as work:
        dirs = write_configs(Path(work), tcfg, dcfg)
        drafter = load_drafter(dirs["drafter"], model_config.DrafterConfig.from_hf(dcfg),
                               tcfg["hidden_size"], TPGroup(), dev, dtype, max_seq, presharded=pre_d, kernels=kernels)
        capture = drafter.config.target_layer_ids

        def target(pre, path, fp8_gemm):   # the FP8 folder's config.json adds ModelOpt's quantization_config
            return load_target(path, model_config.target_config(hf.read_config(path)), TPGroup(), dev, dtype,
                               max_seq, capture, presharded=pre, fp8_gemm=fp8_gemm, kernels=kernels)

        targets = {"bf16": target(pre_bf16, dirs["bf16"], False), "fp8_dequant": target(pre_fp8, dirs["fp8"], False),
                   "fp8_gemm": target(pre_fp8, dirs["fp8"], True)}
    n_fp8 = sum(isinstance(m, fp8.Fp8Linear) for m in targets["fp8_gemm"].modules())
    result["step_model"] = {"config": tcfg, "drafter_layers": args.drafter_layers, "block_size": args.block_size,
                            "fp8_linears": n_fp8, "ctx": args.ctx, "steps": args.steps}
    print(f"step model: {tcfg['num_hidden_layers']} layers, hidden {tcfg['hidden_size']}, {n_fp8} FP8 linears",
          flush=True)

    # agreement first: cheap, and meaningful even if a timing below fails
    agree = {}
    toks = {k: greedy_tokens(targets[k], args.agree_prompts, args.agree_tokens, tcfg["vocab_size"], max_seq)
            for k in ("bf16", "fp8_dequant", "fp8_gemm")}
    agree["greedy_fp8_gemm_vs_fp8_dequant"] = agreement(toks["fp8_gemm"], toks["fp8_dequant"])
    agree["greedy_fp8_dequant_vs_bf16"] = agreement(toks["fp8_dequant"], toks["bf16"])
    ids = torch.randint(3, tcfg["vocab_size"] - 3, (args.agree_prompts, 128 if not smoke else 16),
                        generator=torch.Generator().manual_seed(8)).to(dev)
    logits = teacher_forced(targets, ids, dtype)
    for a, b in (("fp8_gemm", "fp8_dequant"), ("fp8_dequant", "bf16")):
        la, lb = logits[a], logits[b]
        agree[f"teacher_forced_{a}_vs_{b}"] = {
            "top1_match_fraction": (la.argmax(-1) == lb.argmax(-1)).float().mean().item(),
            "logits_rel_err": ((la - lb).norm() / lb.norm()).item(), "positions": la.shape[0] * la.shape[1]}
    del logits
    result["agreement"] = agree
    for k, v in agree.items():
        print(f"agreement {k}: {v}", flush=True)

    rows = result.setdefault("steps", [])
    for name in ("bf16", "fp8_gemm") + (("fp8_dequant",) if args.time_dequant else ()):
        for mode, d in (("ar", None), ("dflash", drafter)):
            eng = Engine(targets[name], d, None, RuntimeConfig(block_size=1 if d is None else None,
                                                               max_batch_size=max(args.batch), max_seq_len=max_seq),
                         TPGroup(), set())
            for b in args.batch:
                r = time_engine(eng, b, args.ctx, args.steps)
                rows.append({"target": name, "mode": mode, "batch": b, "block_size": eng.block_size, **r,
                             "graphs": eng.metrics()["graphs"]})
                print(f"step {name:11s} {mode:6s} b={b:3d}  {r['step_ms']:7.2f} ms", flush=True)
            del eng
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def summarize(result: dict) -> dict:
    s = {}
    by = {(r["target"], r["mode"], r["batch"]): r["step_ms"] for r in result.get("steps", [])}
    for (t, mode, b), ms in by.items():
        if t == "fp8_gemm" and ("bf16", mode, b) in by:
            s[f"step_speedup_{mode}_b{b}"] = by[("bf16", mode, b)] / ms
    for r in result.get("linear", []):
        s[f"linear_speedup_{r['model']}_{r['layer']}_M{r['M']}"] = r["speedup"]
        if "speedup_graph" in r:
            s[f"linear_graph_speedup_{r['model']}_{r['layer']}_M{r['M']}"] = r["speedup_graph"]
    return s


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for every number")
    p.add_argument("--linear_models", default=",".join(LINEARS), help="shape sets for (a), comma-separated")
    p.add_argument("--M", default="1,16,64,256,1024", type=ints, help="tokens per linear call in (a)")
    p.add_argument("--graph_max_m", type=int, default=64, help="also time (a) inside a CUDA graph up to this M")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--model", default="qwen3-8b", help="step_bench model whose shapes (b) uses")
    p.add_argument("--layers", type=int, default=8, help="target depth for (b) (Qwen3-8B has 36)")
    p.add_argument("--drafter_layers", type=int, default=5)
    p.add_argument("--block_size", type=int, default=16)
    p.add_argument("--batch", default="1,4,16,64", type=ints)
    p.add_argument("--ctx", type=int, default=512, help="prompt tokens per request in (b)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--agree_prompts", type=int, default=8)
    p.add_argument("--agree_tokens", type=int, default=64)
    p.add_argument("--time_dequant", action="store_true", help="also time the dequantised FP8 target (= bf16 speed)")
    p.add_argument("--skip", default="", help="linear and/or steps: parts to leave out")
    p.add_argument("--cpu_smoke", action="store_true", help="tiny shapes on CPU: checks the code paths, times nothing real")
    args = p.parse_args(argv)

    smoke = args.cpu_smoke
    if smoke:
        dev, dtype = torch.device("cpu"), torch.bfloat16
        args.M, args.batch, args.reps, args.steps, args.ctx = [1, 16], [1, 2], 2, 2, 8
        args.drafter_layers, args.block_size, args.agree_prompts, args.agree_tokens = 1, 4, 2, 8
        # step_bench.time_engine syncs CUDA around each step; there is nothing to sync on CPU
        torch.cuda.synchronize = lambda *a, **k: None
    else:
        if not torch.cuda.is_available():
            p.error("needs a CUDA GPU (or --cpu_smoke)")
        dev, dtype = torch.device("cuda"), torch.bfloat16
        fp8.check_device(dev, dtype)
    meta = {"device": torch.cuda.get_device_name() if not smoke else "cpu (smoke)", "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "command": " ".join(sys.argv),
            "capability": list(torch.cuda.get_device_capability()) if not smoke else None,
            "fused_kernels": layers._FUSE, "fp8_fast_accum_in_runtime": fp8.Fp8Linear.fast_accum}
    print(json.dumps(meta), flush=True)
    # random weights made in memory (no checkpoint file to hash): the shapes are in step_model / linear
    result = {"meta": meta, "errors": {}, "provenance": record(["python", "-m", "trtllm_dflash.bench.fp8_gemm", *sys.argv[1:]])}

    def save():
        result["summary"] = summarize(result)
        Path(args.out).write_text(json.dumps(result, indent=1))

    # A first FP8 GEMM decides whether the quantize kernel compiles here; if torch.compile fails, every fused
    # chain (bf16 and FP8 alike) runs eagerly, so the comparison stays fair, and the JSON says so.
    try:
        fp8_layer(torch.randn(32, 32, device=dev, dtype=dtype))(torch.randn(2, 32, device=dev, dtype=dtype))
    except Exception as err:   # noqa: BLE001 - recorded, then retried eagerly
        result["errors"]["fused_quantize"] = repr(err)
        layers._FUSE = meta["fused_kernels"] = False
        print(f"fused quantize failed ({err!r}); running every fused chain eagerly", flush=True)

    skip = set(filter(None, args.skip.split(",")))
    if "linear" not in skip:
        result["linear"] = []
        for model in args.linear_models.split(",") if not smoke else SMOKE_LINEARS:
            for name, (k, n) in (SMOKE_LINEARS if smoke else LINEARS)[model].items():
                try:
                    result["linear"] += bench_linear(model, name, k, n, args.M, args, dev, dtype)
                except Exception as err:   # noqa: BLE001 - one failing shape must not lose the others
                    result["errors"][f"linear {model} {name}"] = traceback.format_exc()
                    print(f"linear {model} {name} failed: {err!r}", flush=True)
                save()
    if "steps" not in skip:
        try:
            bench_steps(args, dev, dtype, smoke, result)
        except Exception as err:   # noqa: BLE001
            result["errors"]["steps"] = traceback.format_exc()
            print(f"steps failed: {err!r}", flush=True)
    save()
    print("\nsummary (bf16 time / fp8 time; > 1 means FP8 is faster):")
    for k, v in result["summary"].items():
        print(f"  {k:55s} {v:6.2f}")
    if result["errors"]:
        print(f"errors: {list(result['errors'])} (tracebacks in {args.out})")
    return 1 if result["errors"] else 0   # the JSON holds every number that was measured either way


if __name__ == "__main__":
    sys.exit(main())
