# SPDX-License-Identifier: Apache-2.0
"""Do the weights and the KV cache fit the GPUs of the hardware profile? Estimated from config.json alone
(a dry run downloads nothing), at the precision the GPU runtimes keep the weights in.

Weights: every linear layer, embedding and lm_head of the target and the drafter, counted from the config.
gpt-oss routed experts ship as MXFP4 (4.25 bits a weight: 4-bit values plus one 8-bit scale per 32, the OCP
microscaling format). Both GPU runtimes keep them that way: TensorRT-LLM, and our torch runtime on CUDA
(RuntimeConfig.mxfp4_moe auto = the fused MXFP4 kernels of runtime/mxfp4_moe.py). Only the CPU, which this
check does not cover, and an explicit mxfp4_moe="dequant" expand them to the model dtype.
KV cache: K and V of every attention layer of both models, per token, split over the tensor-parallel ranks;
sliding-window layers hold at most their window.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DFlashError

GIB = 2 ** 30
# Bits per routed-expert weight of an MXFP4 checkpoint on a GPU, whichever backend runs it.
MXFP4_BITS = 4.25
# ModelOpt PTQ formats (quantize.py): bits per linear weight, scales included (NVFP4: one FP8 scale per 16).
QUANT_BITS = {"fp8": 8.0, "nvfp4": 4.5}
DTYPE_BITS = {"auto": 16, "bfloat16": 16, "float16": 16, "float32": 32}
# What the weights may take of a GPU: activations, CUDA graphs and the DFlash context arena need the rest.
WEIGHT_SHARE = 0.9


@dataclass(frozen=True)
class Fit:
    weights_gib: float          # per GPU
    kv_gib_per_seq: float       # per GPU, one sequence of max_seq_len tokens
    kv_budget_gib: float        # per GPU: free_gpu_memory_fraction of what the weights leave
    full_batches: int           # sequences of max_seq_len that fit the budget


def _heads(c: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) with config.json's defaults."""
    heads = c["num_attention_heads"]
    return heads, c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads


def _attention_params(c: dict) -> int:
    heads, kv, head_dim = _heads(c)
    return 2 * c["hidden_size"] * (heads + kv) * head_dim    # q and o over heads, k and v over kv heads


def _experts(c: dict) -> int:
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if c.get(key):
            return int(c[key])
    return 0


def weight_bits(c: dict, *, dtype_bits: float, expert_bits: float | None, quant: str | None) -> float:
    """Total bits of a causal LM's (or DFlash drafter's) weights; norms and biases are negligible."""
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    linear = QUANT_BITS.get(quant, dtype_bits) if quant else dtype_bits
    experts = _experts(c)
    per_layer = _attention_params(c) * linear
    if experts:
        inter = c.get("moe_intermediate_size") or c["intermediate_size"]
        per_layer += experts * 3 * hidden * inter * (expert_bits or dtype_bits) + hidden * experts * dtype_bits
    else:
        per_layer += 3 * hidden * c["intermediate_size"] * linear
    total = layers * per_layer
    if "dflash_config" in c:   # drafter: fc over the captured target layers; embeddings and lm_head are the target's
        total += len(c["dflash_config"]["target_layer_ids"]) * hidden * hidden * dtype_bits
    else:
        total += c["vocab_size"] * hidden * dtype_bits * (1 if c.get("tie_word_embeddings") else 2)
    return total


def kv_bytes_per_token(c: dict, *, tp_size: int, max_seq_len: int, dtype_bits: float) -> float:
    """K and V bytes per token of a max_seq_len sequence on one tensor-parallel rank."""
    _, kv, head_dim = _heads(c)
    kv_per_rank = max(1, kv // tp_size)        # KV heads are split, or replicated when there are fewer than ranks
    types = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    window = c.get("sliding_window") or max_seq_len
    tokens = sum(min(window, max_seq_len) if t == "sliding_attention" else max_seq_len for t in types)
    return 2 * kv_per_rank * head_dim * dtype_bits / 8 * tokens / max_seq_len


def check(target_cfg: dict, drafter_cfg: dict, *, gpu_name: str, memory_gib: float, tp_size: int,
          dtype: str, quant: str | None, max_batch_size: int, max_seq_len: int,
          free_gpu_memory_fraction: float, expert_copies: int = 1) -> Fit:
    """Raise DFlashError when the weights, or one max_seq_len sequence's KV cache, do not fit. ``expert_copies``:
    2 where the runtime holds a second copy of the MXFP4 experts (mxfp4_moe="triton_kernels")."""
    bits = DTYPE_BITS[dtype]
    # gpt-oss checkpoints ship their routed experts as MXFP4.
    mxfp4 = target_cfg.get("model_type") == "gpt_oss" and _experts(target_cfg) > 0
    expert_bits = MXFP4_BITS * expert_copies if mxfp4 else None
    total = (weight_bits(target_cfg, dtype_bits=bits, expert_bits=expert_bits, quant=quant)
             + weight_bits(drafter_cfg, dtype_bits=bits, expert_bits=None, quant=None)) / 8
    per_gpu = total / tp_size / GIB
    if per_gpu > WEIGHT_SHARE * memory_gib:
        need = next((n for n in (2, 4, 8, 16, 32, 64) if total / n / GIB <= WEIGHT_SHARE * memory_gib), 64)
        how = (("MXFP4 experts kept 4-bit" + (", twice (--mxfp4_moe triton_kernels)" if expert_copies > 1 else ""))
               if mxfp4 else f"{quant or str(bits) + '-bit'} weights")
        raise DFlashError("memory", f"the weights need {total / GIB:.0f} GiB ({how}), {per_gpu:.0f} GiB per GPU at "
                          f"tp_size {tp_size}; a {gpu_name} has {memory_gib} GiB",
                          f"use --tp_size {need} or more (more GPUs) or a GPU with more memory")
    kv_token = sum(kv_bytes_per_token(c, tp_size=tp_size, max_seq_len=max_seq_len, dtype_bits=bits)
                   for c in (target_cfg, drafter_cfg))
    kv_seq = kv_token * max_seq_len / GIB
    budget = (memory_gib - per_gpu) * free_gpu_memory_fraction
    if kv_seq > budget:
        raise DFlashError("max_seq_len", f"one {max_seq_len}-token sequence needs {kv_seq:.1f} GiB of KV cache per GPU;"
                          f" {budget:.1f} GiB are left beside the weights ({per_gpu:.0f} GiB)",
                          "use a smaller --max_seq_len, a larger --tp_size, or a GPU with more memory")
    return Fit(per_gpu, kv_seq, budget, int(budget // kv_seq))
