# SPDX-License-Identifier: Apache-2.0
"""Plain dataclasses for our own settings (TensorRT-LLM's settings keep their own names elsewhere)."""
from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field

from .errors import DFlashError

# Temperatures below this sample like greedy decoding and are stored as 0: logits / 1e-38 overflow float32
# (inf - inf = nan), and at 1e-5 a logit gap of 1e-3 is already a factor e^100, so the draw is the argmax anyway.
GREEDY_TEMPERATURE = 1e-5
SEED_RANGE = (-(2**63), 2**64)  # int64 or uint64 (Triton's sampling_param_seed is UINT64)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature < GREEDY_TEMPERATURE`` (0 included) is greedy and stored as 0;
    ``seed`` (any int64 or uint64) makes sampling reproducible."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0            # 0 = off
    top_p: float = 1.0        # 1.0 = off
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_new_tokens <= 0:
            raise DFlashError("max_new_tokens", f"must be > 0, got {self.max_new_tokens}", "pass a positive count")
        if not self.temperature >= 0:  # also refuses nan
            raise DFlashError("temperature", f"must be >= 0, got {self.temperature}", "use 0 for greedy")
        if self.temperature < GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]:
            raise DFlashError("seed", f"{self.seed} is outside int64/uint64", "pass a seed in [-2**63, 2**64)")
        if self.top_k < 0:
            raise DFlashError("top_k", f"must be >= 0, got {self.top_k}", "use 0 to disable top-k")
        if not 0.0 < self.top_p <= 1.0:
            raise DFlashError("top_p", f"must be in (0, 1], got {self.top_p}", "use 1.0 to disable top-p")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the torch runtime is laid out in memory. Caches are allocated once for these sizes."""

    max_batch_size: int = 8
    max_seq_len: int = 2048
    block_size: int | None = None   # None = the drafter's block_size; 1 = autoregressive
    # Tokens one step may run through the target (TensorRT-LLM's max_num_tokens): the running requests' verify
    # blocks first, arriving prompts share the rest in chunks (chunked prefill mixed with decode).
    max_num_tokens: int = 8192
    dtype: str = "auto"             # auto = bfloat16 on CUDA, float32 on CPU
    device: str = "auto"            # auto = cuda if available
    cuda_graphs: bool = True        # only used on CUDA
    # Capture every graph a step can replay (decode: batch x KV-length buckets for the policy's blocks, greedy and
    # plain sampling; prefill: rows x tokens buckets within max_num_tokens) when the engine starts, so no request
    # waits for a capture. False captures each shape on first use (benchmarks that only time steady steps).
    capture_graphs_at_start: bool = True
    # Keep a ModelOpt FP8 target's weights in FP8 and run torch._scaled_mm (CUDA compute capability >= 8.9,
    # bfloat16). None = auto: on wherever it runs, since it measured faster than the dequantised bf16 GEMMs
    # (H100, Qwen3-8B shapes: 1.04-1.14x per decode step; benchmarks/results/fp8_gemm_h100.json). True insists
    # (one-line error elsewhere); False always dequantises on load.
    fp8_gemm: bool | None = None
    # gpt-oss MXFP4 experts: "triton" keeps them MXFP4 on the GPU and runs the fused routed-expert kernels
    # (runtime/mxfp4_moe.py); "triton_kernels" the same for one-token steps and the triton_kernels library (the
    # Triton MoE kernels vLLM runs gpt-oss on; sm90+, importable; twice the experts' memory) for steps of 2+ tokens
    # (runtime/models/gpt_oss.TritonKernelsExperts); "dequant" dequantises them to dtype on load (CPU, the reference;
    # 4x the memory); "auto" = triton for MXFP4 checkpoints on CUDA, else dequant. An explicit choice that cannot
    # run is an error.
    mxfp4_moe: str = "auto"
    # The decode path's kernels (runtime/kernels/, chosen once per model: runtime.kernels.Kernels): "triton" = q/k
    # norm + RoPE + cache write in one kernel,
    # short-query GQA attention against the cache (gpt-oss: sinks and sliding window inside it), the decode GEMMs
    # with their epilogues (gate_up + SiLU, o_proj / down + residual, lm_head), sampling + acceptance in two
    # kernels, gpt-oss's top-k router; "torch" = the compiled chains, index_put, SDPA/matmul attention, cuBLAS
    # (the reference; the only path on CPU); "auto" = triton on CUDA, else torch. An explicit "triton" off CUDA, or
    # Triton failing to import, is an error naming this field. auto by default: on an H100 the kernels took the
    # AR step at batch 1 from 1.61 to 0.97 ms (SmolLM2-135M), 7.47 to 6.17 ms (Qwen3-8B), 7.06 to 6.03 ms
    # (Llama-3.1-8B), with the same tokens (benchmarks/results/step_bench_h100_v5_torch.json, _v6_*.json).
    kernels: str = "auto"
    # Batch-invariant numerics (DESIGN.md decision 10): every op of the prefill / decode / verify path computes a
    # row in an order that depends on that row alone, so greedy DFlash == AR token for token in bfloat16 and a
    # request's tokens do not depend on who shares its batch or how its prompt was chunked. On the Triton kernels:
    # the Triton GEMM for every row count (prefill included, no cuBLAS; tl.dot tiles, no split-K: kernels/gemm.py),
    # attention in fixed key chunks merged in key order for any block (prefill included), row-wise Triton norms
    # (runtime/kernels/). On the CPU's torch path in bfloat16 / float16: matmul attention for prefill as for decode,
    # its two products in float64 (no SDPA, and the CPU's half-precision batched matmul sums in an order that depends
    # on the batch; prefill attention 3-20x slower there); float32 on the CPU is left as it is (its BLAS is not
    # row-invariant). gpt-oss's MXFP4 experts (mxfp4_moe='triton'): one tile for every token count
    # (mxfp4_moe.invariant_tiles: the mma variant, no split-K) and the router on the Triton GEMM; checked in Triton's
    # interpreter and on an H200 (benchmarks/results/gpu_tests_moe_invariant_h200.json). Not on the torch path on
    # CUDA (cuBLAS and SDPA pick their tiling by shape; the dequantised experts are such a path). False: the fastest
    # kernels per shape. Off by default for its cost at larger batches: a decode step 1.01-1.05x at batch 1 but 1.38x
    # at batch 64 on an H200 (Qwen3-8B shapes; every prefill GEMM leaves cuBLAS for the Triton GEMM;
    # benchmarks/results/bit_exact_h200.json). What it buys, measured: under a 64-stream load on an
    # H100 every greedy answer equalled the same request alone (21,945 of 21,945; 44% differed with it off:
    # benchmarks/results/soak_batch_invariant_h100/). A deployment turns it on with dflash-build --batch_invariant
    # (runtime.batch_invariant in its manifest).
    batch_invariant: bool = False
    # Tensor parallelism's all-reduce (TensorRT-LLM's allreduce_strategy, lower case; runtime/allreduce.py): "oneshot"
    # = messages up to 512 KB (a decode layer's) over CUDA peer memory (PyTorch symmetric memory; decode-sized rows
    # on our Lamport kernel, fused with the residual add + RMSNorm after it: 5.3 us a call on 2 H200s), larger NCCL;
    # "nccl" = every message on NCCL; "auto" = oneshot where the GPUs map each other's memory, else NCCL. An explicit
    # "oneshot" that cannot run (CPU / gloo, no peer access) is an error naming this field. auto by default, as
    # TensorRT-LLM's AUTO: on 2 and 4 H200s the one-shot call took 6.4-8.6 us where NCCL took 15-28 us up to 64 KB,
    # and the tokens equal NCCL's (tests/gpu/test_allreduce_cuda.py; benchmarks/results/tp_h200x4/).
    allreduce_strategy: str = "auto"
    # The old name of ``kernels`` (it switches far more than attention), still accepted because deployment
    # directories and scripts written before the rename carry it; it warns, and disagreeing with kernels is an error.
    attention_kernel: InitVar[str | None] = None

    def __post_init__(self, attention_kernel: str | None = None):
        if attention_kernel is not None:
            if self.kernels not in ("auto", attention_kernel):
                raise DFlashError("attention_kernel", f"{attention_kernel!r} contradicts kernels {self.kernels!r}",
                                  "drop attention_kernel (the old name of kernels)")
            warnings.warn("RuntimeConfig.attention_kernel is deprecated: it is now 'kernels' (it also switches the "
                          "GEMMs, the router and sampling); rename runtime.attention_kernel to runtime.kernels in "
                          "manifest.json", FutureWarning, stacklevel=3)
            object.__setattr__(self, "kernels", attention_kernel)
        if self.max_batch_size <= 0:
            raise DFlashError("max_batch_size", f"must be > 0, got {self.max_batch_size}", "pass a positive size")
        if self.max_seq_len <= 1:
            raise DFlashError("max_seq_len", f"must be > 1, got {self.max_seq_len}", "pass e.g. 2048")
        if self.block_size is not None and self.block_size < 1:
            raise DFlashError("block_size", f"must be >= 1, got {self.block_size}", "use 1 for AR decoding")
        if self.mxfp4_moe not in ("auto", "triton", "triton_kernels", "dequant"):
            raise DFlashError("mxfp4_moe", f"unknown value {self.mxfp4_moe!r}",
                              "use auto, triton, triton_kernels or dequant")
        if self.kernels not in ("auto", "triton", "torch"):
            raise DFlashError("kernels", f"unknown value {self.kernels!r}", "use auto, triton or torch")
        if self.allreduce_strategy not in ("auto", "nccl", "oneshot"):
            raise DFlashError("allreduce_strategy", f"unknown value {self.allreduce_strategy!r}",
                              "use auto, nccl or oneshot")
        if self.max_num_tokens < 1:
            raise DFlashError("max_num_tokens", f"must be >= 1, got {self.max_num_tokens}", "pass e.g. 8192")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "float64"):
            raise DFlashError("dtype", f"unknown dtype {self.dtype!r}", "use auto, float32, bfloat16 or float16")


@dataclass
class RequestStats:
    """What one request measured. Times in seconds; lengths in tokens."""

    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens committed per target forward
    num_draft_tokens: int = 0           # drafts proposed to the target (Triton's total_draft_tokens)
    num_accepted_draft_tokens: int = 0  # drafts the target accepted (total_accepted_draft_tokens)
    ttft_s: float = 0.0
    decode_s: float = 0.0           # first token -> last token

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (accepted drafts + 1 bonus)."""
        a = self.acceptance_lengths
        return sum(a) / len(a) if a else 0.0

    @property
    def tpot_s(self) -> float:
        n = self.num_output_tokens - 1
        return self.decode_s / n if n > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_steps": len(self.acceptance_lengths),
            "tau": round(self.tau, 4),
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
        }
