# SPDX-License-Identifier: Apache-2.0
"""What quantizing the target costs: greedy token agreement with the unquantized target, and the drafter's tau
against each, with our torch runtime.

    dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml --out /tmp/base
    dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml --quant fp8 --out /tmp/fp8
    python -m trtllm_dflash.bench.quant_report --base /tmp/base --quant /tmp/fp8 --n 32      # -> results/quant_smollm2_fp8.json

``--base`` / ``--quant``: deployment directories (or plain HF target folders); ``--drafter`` defaults to the base
deployment's drafter/, so re-running with a trained drafter is ``--drafter DIR``. Every prompt (chat-templated,
``--dataset``) runs greedily through the DFlash loop, whose output is exactly the target's greedy output, so one
run per target gives both the tokens and tau (z-lab's: per request (output tokens - 1) / verify steps, then the
mean over requests).

"weight_only" dequantises the weights and runs activations unquantized; on Hopper/Ada an FP8 target also runs
"fp8_gemm" (the runtime's default there: FP8 weights, per-token FP8 activations, torch._scaled_mm). TensorRT-LLM also quantizes
the linears' inputs (FP8: static per-tensor ``input_scale``; NVFP4: dynamic 16-value blocks under the static
``input_scale``); "act_emulated" reruns the quantized target with that input quantization emulated in float
(forward pre-hooks), which is closer to what a GPU deployment computes, up to GEMM accumulation order.
Free-running greedy outputs diverge for good after the first differing token, so the report also gives the
per-token top-1 agreement under teacher forcing on the base's continuations (transformers, the same weights).
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

import torch


from trtllm_dflash.deployment import Deployment
from trtllm_dflash.errors import DFlashError, exit_code
from trtllm_dflash.provenance import record
from trtllm_dflash.versions import installed

RESULTS = Path("benchmarks") / "results"   # the default --out folder, in the checkout it runs from
FP8_MAX = 448.0                                                  # largest float8_e4m3fn
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# HF linear -> the runtime's (fused) module; fused inputs share one input_scale in ModelOpt exports.
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
          "up_proj": "gate_up_proj", "o_proj": "o_proj", "down_proj": "down_proj"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="dflash-bench quant_report", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base", required=True, help="unquantized deployment directory (or HF target folder)")
    p.add_argument("--quant", required=True, help="deployment built with dflash-build --quant (or its target/)")
    p.add_argument("--drafter", default=None, help="DFlash drafter folder; default: <base>/drafter")
    p.add_argument("--n", type=int, default=32, help="prompts")
    p.add_argument("--max_new_tokens", type=int, default=64, help="K: tokens compared per prompt")
    p.add_argument("--dataset", default="mtbench", choices=("mtbench", "humaneval", "sharegpt"))
    p.add_argument("--max_batch_size", type=int, default=32)
    p.add_argument("--dtype", default="auto", help="runtime dtype (auto = bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--no_act_emulation", action="store_true", help="skip the emulated input-quantization run")
    p.add_argument("--name", default="smollm2", help="file name part: results/quant_<name>_<algo>.json")
    p.add_argument("--out", default=None, help="default: benchmarks/results/quant_<name>_<algo>.json")
    return p.parse_args(argv)


def target_of(path: Path) -> tuple[Path, dict | None]:
    """(HF target folder, manifest or None) of a deployment directory or a plain folder."""
    if Deployment.is_deployment(path):
        deployment = Deployment.open(path)
        return deployment.target_dir, deployment.manifest
    return path, None


# ---- emulated input quantization (what TensorRT-LLM's FP8 / FP4 GEMMs see) ---------------------------------
def fake_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor FP8: round x / scale to float8_e4m3fn (saturating), scale back."""
    s = scale.to(x.dtype)
    return (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(x.dtype) * s


def fake_nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Dynamic NVFP4: per 16 values a FP8 block scale (amax / 6, in units of the static global scale), E2M1 codes."""
    shape, g = x.shape, global_scale.float()
    blocks = x.float().reshape(-1, 16)
    block_scale = (blocks.abs().amax(-1, keepdim=True) / 6 / g).clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float() * g
    v = (blocks / block_scale.clamp(min=1e-30)).clamp(-6, 6)
    grid = torch.tensor(E2M1_VALUES, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    q = grid[torch.bucketize(v.abs(), mids)] * v.sign()      # round to the nearest E2M1 magnitude
    return (q * block_scale).reshape(shape).to(x.dtype)


def input_scales(quant_target: Path) -> dict[str, torch.Tensor]:
    """HF linear name (model.layers.3.self_attn.q_proj) -> its static input_scale."""
    from trtllm_dflash.checkpoints import hf

    scales = hf.load_state_dict(quant_target, select=lambda n: n.endswith(".input_scale"))
    return {n.removesuffix(".input_scale"): s for n, s in scales.items()}


def hook_inputs(modules: dict, scales: dict[str, torch.Tensor], algo: str) -> list:
    """Quantize each named module's input the way TensorRT-LLM's GEMM does; returns the hook handles."""
    fake = fake_fp8 if algo == "FP8" else fake_nvfp4
    handles = []
    for key, s in scales.items():
        if key not in modules:
            raise DFlashError(f"input_scale of {key}", "has no module in the model", "report this")
        s = s.to(next(modules[key].parameters()).device)
        handles.append(modules[key].register_forward_pre_hook(lambda _m, args, s=s: (fake(args[0], s), *args[1:])))
    return handles


def emulate_input_quant(engine, quant_target: Path, algo: str) -> int:
    """Forward pre-hooks on the engine's (fused) target linears; returns how many were hooked."""
    scales = input_scales(quant_target)
    modules = dict(engine.target.named_modules())
    per_module: dict[str, torch.Tensor] = {}
    for name, s in scales.items():   # model.layers.3.self_attn.q_proj -> layers.3.self_attn.qkv_proj
        parts = name.removeprefix("model.").split(".")
        key = ".".join(parts[:-1] + [_FUSED[parts[-1]]])
        per_module[key] = torch.maximum(per_module.get(key, s), s)
    return len(hook_inputs(modules, per_module, algo))


# ---- runs ---------------------------------------------------------------------------------------------------
def run(target: Path, drafter: Path, prompts: list[list[int]], args, *, emulate: str | None = None,
        fp8_gemm: bool = False) -> dict:
    """Greedy DFlash over every prompt: output ids, per-request tau, wall time."""
    from tqdm import tqdm

    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    block = json.loads((drafter / "config.json").read_text())["block_size"]
    longest = max(map(len, prompts))
    engine = Engine.from_dirs(target, drafter, RuntimeConfig(
        max_batch_size=args.max_batch_size, max_seq_len=longest + args.max_new_tokens + 2 * block, dtype=args.dtype,
        fp8_gemm=fp8_gemm))
    hooked = emulate_input_quant(engine, target, emulate) if emulate else 0
    t0 = time.perf_counter()
    reqs = [engine.add_request(p, SamplingParams(max_new_tokens=args.max_new_tokens)) for p in prompts]
    label = f"{target.parent.name}/{target.name}" + (" (act emulated)" if emulate else " (fp8_gemm)" if fp8_gemm else "")
    with tqdm(total=len(reqs), desc=label, unit="req", file=sys.stderr) as bar:
        while engine.has_work():
            bar.update(len(engine.step()))
    wall = time.perf_counter() - t0
    engine.shutdown()
    taus = [(len(r.output_ids) - 1) / len(r.stats.acceptance_lengths) for r in reqs if r.stats.acceptance_lengths]
    return {"outputs": [r.output_ids for r in reqs], "tau": round(statistics.mean(taus), 4), "block_size": block,
            "wall_s": round(wall, 1), "hooked_linears": hooked}


def teacher_forced(base_target: Path, quant_target: Path, prompts: list[list[int]], continuations: list[list[int]],
                   algo: str) -> dict:
    """Per-token top-1 agreement on the base's own greedy continuations (transformers, float32, the same dequantised
    weights): the quantization error per token, without free-running divergence compounding it."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.checkpoints import hf
    from trtllm_dflash.runtime import quant

    def load(weights=None):
        model = AutoModelForCausalLM.from_pretrained(str(base_target), dtype=torch.float32).eval()
        if weights is not None:
            missing, unexpected = model.load_state_dict(weights, strict=False)
            assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)   # tied lm_head
        return model

    base, quantized = load(), load(quant.dequantize(hf.load_state_dict(quant_target), torch.float32))
    same = {"weight_only": [], "act_emulated": []}
    with torch.no_grad():
        for p, c in tqdm(list(zip(prompts, continuations)), desc="teacher-forced", unit="prompt", file=sys.stderr):
            ids = torch.tensor([p + c[:-1]])   # position len(p) - 1 + i predicts continuation token i
            want = base(ids).logits[0, len(p) - 1:].argmax(-1)
            same["weight_only"].append(quantized(ids).logits[0, len(p) - 1:].argmax(-1) == want)
            handles = hook_inputs(dict(quantized.named_modules()), input_scales(quant_target), algo)
            same["act_emulated"].append(quantized(ids).logits[0, len(p) - 1:].argmax(-1) == want)
            for h in handles:
                h.remove()
    return {name: round(torch.cat(v).float().mean().item(), 4) for name, v in same.items()}


def agreement(base: list[list[int]], other: list[list[int]], k: int) -> dict:
    """Exact match of the first k tokens, common-prefix length, first-token match, over prompts."""
    prefix = []
    for a, b in zip(base, other):
        a, b = a[:k], b[:k]
        prefix.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    return {"exact_match_rate": round(sum(a[:k] == b[:k] for a, b in zip(base, other)) / len(base), 4),
            "mean_common_prefix": round(statistics.mean(prefix), 2),
            "first_token_match_rate": round(sum(a[:1] == b[:1] for a, b in zip(base, other)) / len(base), 4),
            "common_prefix": prefix}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from trtllm_dflash import data

    t0 = time.perf_counter()
    base_target, base_m = target_of(Path(args.base).expanduser().absolute())
    quant_target, quant_m = target_of(Path(args.quant).expanduser().absolute())
    hq = quant_target / "hf_quant_config.json"
    if not hq.is_file():
        raise DFlashError("--quant", f"{quant_target} has no hf_quant_config.json", "build it with dflash-build --quant")
    algo = json.loads(hq.read_text())["quantization"]["quant_algo"]
    drafter = Path(args.drafter).expanduser().absolute() if args.drafter else (
        base_target.parent / base_m["drafter"]["path"] if base_m else None)
    if drafter is None or not (drafter / "config.json").is_file():
        raise DFlashError("--drafter", f"{drafter} is not a drafter folder", "pass --drafter DIR")
    dcfg = json.loads((drafter / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(base_target))
    prompts = [data.apply_chat_template(tokenizer, p) for p in data.load_prompts(args.dataset, args.n)]

    base = run(base_target, drafter, prompts, args)
    weight_only = run(quant_target, drafter, prompts, args)
    runs = {"weight_only": weight_only}
    if not args.no_act_emulation:
        runs["act_emulated"] = run(quant_target, drafter, prompts, args, emulate=algo)
    if algo == "FP8" and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        runs["fp8_gemm"] = run(quant_target, drafter, prompts, args, fp8_gemm=True)   # the runtime's Hopper default
    k = args.max_new_tokens
    result = {
        "machine": "CPU" if not torch.cuda.is_available() else torch.cuda.get_device_name(),
        "cpu": _cpu_name(), "torch_threads": torch.get_num_threads(),
        "command": "python -m trtllm_dflash.bench.quant_report " + " ".join(argv),
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quant_algo": algo,
        "quant_build": (quant_m or {}).get("quant"),
        "base_target": (base_m or {}).get("target", {}).get("source", str(base_target)),
        "drafter": str(drafter), "drafter_trained": bool(dcfg.get("dflash_trained", True)),
        "block_size": base["block_size"],
        "workload": {"dataset": args.dataset, "n": len(prompts), "max_new_tokens": k, "greedy": True,
                     "stops_at_eos": True, "runtime_dtype": args.dtype},
        "tau": {"base": base["tau"], **{name: r["tau"] for name, r in runs.items()}},
        "agreement_vs_base": {name: agreement(base["outputs"], r["outputs"], k) for name, r in runs.items()},
        "teacher_forced_top1_agreement": teacher_forced(base_target, quant_target, prompts, base["outputs"], algo),
        "hooked_linears": {name: r["hooked_linears"] for name, r in runs.items()},
        "timings_s": {"base": base["wall_s"], **{name: r["wall_s"] for name, r in runs.items()},
                      "total": round(time.perf_counter() - t0, 1)},
        "versions": installed("trtllm-dflash", "torch", "transformers", "nvidia-modelopt"),
        "provenance": record("python -m trtllm_dflash.bench.quant_report " + " ".join(argv),
                             checkpoints={"base_target": base_target, "quant_target": quant_target, "drafter": drafter}),
    }
    if not result["drafter_trained"]:
        result["note"] = ("the drafter is untrained (dflash_trained false): tau ~1 says nothing about quantization; "
                          "re-run with --drafter <trained drafter>")
    out = Path(args.out) if args.out else RESULTS / f"quant_{args.name}_{algo.lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    summary = {name: {key: v for key, v in a.items() if key != "common_prefix"}
               for name, a in result["agreement_vs_base"].items()}
    print(json.dumps({"tau": result["tau"], "agreement_vs_base": summary,
                      "teacher_forced_top1_agreement": result["teacher_forced_top1_agreement"]}, indent=2))
    print(f"wrote {out}")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(exit_code(main))
