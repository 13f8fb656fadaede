# SPDX-License-Identifier: Apache-2.0
"""Plain dataclasses for our own settings (TensorRT-LLM's settings keep their own names elsewhere)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import DFlashError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature == 0`` is greedy; ``seed`` makes sampling reproducible."""

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
        if self.temperature < 0:
            raise DFlashError("temperature", f"must be >= 0, got {self.temperature}", "use 0 for greedy")
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
    dtype: str = "auto"             # auto = bfloat16 on CUDA, float32 on CPU
    device: str = "auto"            # auto = cuda if available
    cuda_graphs: bool = True        # only used on CUDA
    # Keep a ModelOpt FP8 target's weights in FP8 and run torch._scaled_mm (CUDA compute capability >= 8.9,
    # bfloat16). None = auto: on wherever it runs, since it measured faster than the dequantised bf16 GEMMs
    # (H100, Qwen3-8B shapes: 1.04-1.14x per decode step; benchmarks/results/fp8_gemm_h100.json). True insists
    # (one-line error elsewhere); False always dequantises on load.
    fp8_gemm: bool | None = None

    def __post_init__(self):
        if self.max_batch_size <= 0:
            raise DFlashError("max_batch_size", f"must be > 0, got {self.max_batch_size}", "pass a positive size")
        if self.max_seq_len <= 1:
            raise DFlashError("max_seq_len", f"must be > 1, got {self.max_seq_len}", "pass e.g. 2048")
        if self.block_size is not None and self.block_size < 1:
            raise DFlashError("block_size", f"must be >= 1, got {self.block_size}", "use 1 for AR decoding")
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
