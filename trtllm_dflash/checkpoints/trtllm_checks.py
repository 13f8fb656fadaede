# SPDX-License-Identifier: Apache-2.0
"""What TensorRT-LLM (PyTorch backend, 1.3.0rc15 to 1.4.x) accepts for DFlash, checked before any GPU time.

Sources (NVIDIA/TensorRT-LLM): the supported-models matrix (docs/source/models/supported-models.md, DFlash
column); ``DFlashDecodingConfig.attention_backend`` in the 1.4.0rc1 API reference
(nvidia.github.io/TensorRT-LLM/1.4.0rc1/llm-api/reference/DFlashDecodingConfig.html: VANILLA = the flash-attn
package, FA4 = FlashAttention-4 on SM90 since PR #18553, TRTLLM = trtllm-gen on SM100/SM103 only); NVIDIA's
gpt-oss configs (examples/configs/database/openai/gpt-oss-120b/: TRITON MoE on Hopper, TRTLLM MoE on
Blackwell). Every failure is a DFlashError naming the field and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DFlashError
from ..model_config import TORCH_RUNTIME_ARCHITECTURES


@dataclass(frozen=True)
class GpuProfile:
    """One GPU kind: what the DFlash drafter attention and the MoE layers can run on it."""

    name: str
    family: str                          # hopper | blackwell | cpu
    sm: int | None                       # compute capability x10; None on CPU
    memory_gib: int                      # per GPU, for the plan printout
    drafter_attention: tuple[str, ...]   # allowed DFlashDecodingConfig.attention_backend, default first
    moe_backends: tuple[str, ...]        # allowed moe_config.backend, default first


GPUS: dict[str, GpuProfile] = {
    # Hopper defaults to FA4: VANILLA needs the flash-attn package, which TensorRT-LLM's wheels do not depend on.
    "h100": GpuProfile("h100", "hopper", 90, 80, ("FA4", "VANILLA"), ("TRITON", "CUTLASS")),
    "h200": GpuProfile("h200", "hopper", 90, 141, ("FA4", "VANILLA"), ("TRITON", "CUTLASS")),
    "b200": GpuProfile("b200", "blackwell", 100, 180, ("TRTLLM",), ("TRTLLM", "CUTLASS")),
    "gb200": GpuProfile("gb200", "blackwell", 100, 186, ("TRTLLM",), ("TRTLLM", "CUTLASS")),
    "b300": GpuProfile("b300", "blackwell", 103, 288, ("TRTLLM",), ("TRTLLM", "CUTLASS")),
    # No TensorRT-LLM on CPU: only our torch runtime runs there.
    "cpu": GpuProfile("cpu", "cpu", None, 0, (), ()),
}

# Targets whose TensorRT-LLM model class captures hidden states for DFlash (matrix says "Yes").
TRTLLM_DFLASH_ARCHITECTURES = ("GptOssForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM")
# Target attention must be TRTLLM: FlashInfer's decode path assumes one token per sequence.
TARGET_ATTN_BACKEND = "TRTLLM"


def gpu_profile(name: str) -> GpuProfile:
    if name not in GPUS:
        raise DFlashError("gpu", f"unknown GPU {name!r}", f"use one of {', '.join(GPUS)}")
    return GPUS[name]


def is_moe(target_cfg: dict) -> bool:
    return bool(num_experts(target_cfg))


def num_experts(target_cfg: dict) -> int:
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if target_cfg.get(key):
            return int(target_cfg[key])
    return 0


def architecture(target_cfg: dict) -> str:
    archs = target_cfg.get("architectures") or []
    if len(archs) != 1:
        raise DFlashError("target config.json: architectures", f"expected one architecture, got {archs}",
                          "pass a Hugging Face causal-LM checkpoint")
    return archs[0]


def check_backend(backend: str, gpu: GpuProfile, arch: str) -> None:
    """The backend exists on this GPU and runs this target architecture."""
    if backend == "trtllm":
        if gpu.family == "cpu":
            raise DFlashError("backend", "trtllm needs an NVIDIA GPU (Hopper or Blackwell)",
                              "use --backend torch with --gpu cpu, or pick --gpu h100/h200/b200/b300/gb200")
        if arch not in TRTLLM_DFLASH_ARCHITECTURES:
            raise DFlashError("target architecture", f"{arch} has no DFlash support in TensorRT-LLM",
                              f"use a target of {', '.join(TRTLLM_DFLASH_ARCHITECTURES)}")
    elif backend == "torch":
        if arch not in TORCH_RUNTIME_ARCHITECTURES:
            raise DFlashError("target architecture", f"the torch runtime does not support {arch} yet",
                              "use --backend trtllm (TensorRT-LLM) for this target")
    else:
        raise DFlashError("backend", f"unknown backend {backend!r}", "use trtllm or torch")


def pick_drafter_attention(gpu: GpuProfile, requested: str | None) -> str | None:
    """The drafter's attention_backend for TensorRT-LLM; None on CPU."""
    if gpu.family == "cpu":
        return None
    if requested is None:
        return gpu.drafter_attention[0]
    if requested not in gpu.drafter_attention:
        why = ("TRTLLM drafter attention is Blackwell-only (SM100/SM103)" if requested == "TRTLLM"
               else f"{requested} is not a DFlash drafter attention backend for {gpu.family}")
        raise DFlashError("attention_backend", f"{why} ({gpu.name})",
                          f"use one of {', '.join(gpu.drafter_attention)} on {gpu.name}")
    return requested


def pick_moe_backend(gpu: GpuProfile, target_cfg: dict, requested: str | None) -> str | None:
    """moe_config.backend for MoE targets; None for dense targets or CPU."""
    if not is_moe(target_cfg):
        if requested is not None:
            raise DFlashError("moe_backend", "the target is dense (no experts)", "drop --moe_backend")
        return None
    if gpu.family == "cpu":
        return None
    if requested is None:
        return gpu.moe_backends[0]
    if requested not in gpu.moe_backends:
        raise DFlashError("moe_backend", f"{requested} does not fit {gpu.name} ({gpu.family})",
                          f"use one of {', '.join(gpu.moe_backends)} on {gpu.name}")
    return requested


# ModelOpt PTQ (quantize.py): the lowest compute capability with tensor cores for each format (FP8: Ada/Hopper,
# NVFP4: Blackwell), and the dense targets it is wired for (gpt-oss already ships MXFP4 experts).
QUANT_MIN_SM = {"fp8": 89, "nvfp4": 100}
QUANT_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


def check_quant(quant: str | None, gpu: GpuProfile, arch: str) -> None:
    """The GPU runs the format natively; CPU builds are allowed (tests; the torch runtime dequantises)."""
    if quant is None:
        return
    if arch not in QUANT_ARCHITECTURES:
        why = " (its checkpoints already ship MXFP4 experts)" if arch == "GptOssForCausalLM" else ""
        raise DFlashError("quant", f"ModelOpt PTQ of {arch} targets is not supported{why}",
                          f"drop --quant, or quantize a {' or '.join(QUANT_ARCHITECTURES)} target")
    need = QUANT_MIN_SM[quant]
    if gpu.sm is not None and gpu.sm < need:
        fix = ("use --quant fp8 on Hopper, or build for --gpu b200, b300 or gb200" if quant == "nvfp4"
               else "build for a Hopper or Blackwell --gpu")
        raise DFlashError("quant", f"{quant.upper()} needs SM{need}+ tensor cores"
                          f"{' (Blackwell)' if need >= 100 else ''}; {gpu.name} is {gpu.family.capitalize()} "
                          f"(SM{gpu.sm})", fix)


def check_parallel(target_cfg: dict, tp_size: int, ep_size: int) -> None:
    """Expert parallelism: only for MoE targets, a divisor of tp_size and of the expert count."""
    if ep_size == 1:
        return
    experts = num_experts(target_cfg)
    if not experts:
        raise DFlashError("ep_size", f"ep_size={ep_size} but the target is dense (no experts)", "use --ep_size 1")
    if tp_size % ep_size:
        # TensorRT-LLM splits the TP ranks into moe_tp x moe_ep, so ep must divide tp.
        raise DFlashError("ep_size", f"ep_size={ep_size} does not divide tp_size={tp_size}",
                          "pick an ep_size that divides tp_size")
    if experts % ep_size:
        raise DFlashError("ep_size", f"{experts} experts are not divisible by ep_size={ep_size}",
                          "pick an ep_size that divides the expert count")


def check_runtime_sizes(target_cfg: dict, *, max_seq_len: int, max_batch_size: int, max_num_tokens: int,
                        max_draft_len: int) -> None:
    """Sizes TensorRT-LLM would reject (or silently cap) at start-up."""
    limit = target_cfg.get("max_position_embeddings")
    if limit and max_seq_len > limit:
        raise DFlashError("max_seq_len", f"{max_seq_len} exceeds the target's max_position_embeddings {limit}",
                          f"use --max_seq_len <= {limit}")
    step_tokens = max_batch_size * (max_draft_len + 1)
    if max_num_tokens < step_tokens:
        # Every generating request verifies max_draft_len + 1 tokens in the same step.
        raise DFlashError("max_num_tokens", f"{max_num_tokens} < max_batch_size x (max_draft_len + 1) = {step_tokens}",
                          f"use --max_num_tokens >= {step_tokens} or a smaller --max_batch_size")
