# SPDX-License-Identifier: Apache-2.0
"""Settings of ``dflash-build``: one frozen dataclass, filled from dataclass defaults, then a preset YAML
(``build_configs/<model>_<gpu>_tp<N>.yaml``, section ``build:``; given with --config, or the one whose name
matches --target, --gpu and --tp), then explicit command-line flags."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from .config import RuntimeConfig
from .errors import DFlashError

BACKENDS = ("torch", "trtllm")
GPU_NAMES = ("h100", "h200", "b200", "b300", "gb200", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
# ModelOpt PTQ of the target (quantize.py); "none" keeps its weights (the same as leaving quant unset).
QUANTS = ("fp8", "nvfp4", "none")
DRAFT_POLICIES = ("auto", "adaptive", "fixed")
MXFP4_MOE = ("auto", "triton", "triton_kernels")   # RuntimeConfig.mxfp4_moe on GPUs (dequant: CPU / reference only)
# A preset file may hold one section per stage; dflash-build reads only `build:`.
STAGE_SECTIONS = ("build", "serve", "sweep")


@dataclass(frozen=True)
class BuildConfig:
    """Everything that decides what dflash-build writes (TensorRT-LLM names where TensorRT-LLM has one)."""

    target: str = ""                        # short name, local folder or HF hub id
    drafter: str | None = None              # None = the target's known drafter; "untrained" = random (demo)
    drafter_format: str | None = None       # None = detect from config.json
    target_revision: str | None = None      # hub branch/tag/commit to fetch
    drafter_revision: str | None = None
    out: str | None = None                  # deployment directory (required unless dry_run)
    backend: str = "torch"
    gpu: str = "h100"
    tp_size: int = 1
    ep_size: int = 1
    # The runtime sizes a deployment is built for: RuntimeConfig owns their defaults (the manifest's runtime section
    # and TensorRT-LLM's options carry these values)
    dtype: str = RuntimeConfig.dtype
    max_batch_size: int = RuntimeConfig.max_batch_size
    max_seq_len: int = RuntimeConfig.max_seq_len
    max_num_tokens: int = RuntimeConfig.max_num_tokens
    max_draft_len: int | None = None        # None = drafter block_size - 1
    free_gpu_memory_fraction: float = 0.8   # KV-cache share; the DFlash context arena is outside it
    attention_backend: str | None = None    # drafter attention in TensorRT-LLM; None = the GPU's default
    moe_backend: str | None = None          # MoE targets only; None = the GPU's default
    # TensorRT-LLM: {batch sizes up to k: draft length}, none above the largest key, starting {1: max_draft_len};
    # None = derived from the measured step costs where we have them (draft_schedule.py); {} ("none") = off
    draft_len_schedule: dict | None = None
    max_concurrency: int | None = None      # TensorRT-LLM turns speculation off above this many requests
    draft_acceptance_rate: float = 0.7      # per draft position, assumed by the derived schedule
    # Our torch runtime: how the block is chosen per step. auto = adaptive on CPU (tp 1), fixed on GPUs (why: the
    # --draft_policy help in build.py)
    draft_policy: str = "auto"
    use_rejection_sampling: bool = False    # TensorRT-LLM's rejection sampler for sampled requests (prototype)
    batch_invariant: bool = False           # our torch runtime: RuntimeConfig.batch_invariant (bit-exact bf16)
    mxfp4_moe: str = "auto"                 # our torch runtime: RuntimeConfig.mxfp4_moe (gpt-oss MXFP4 experts)
    enable_block_reuse: bool = False        # prefix-cache reuse; DFlash then recomputes a context tail
    context_recompute_tail: int | None = None   # prompt tokens recomputed on a cache hit; None = 32 with reuse
    presharded: bool = False                # torch backend: write ranks/rank{r}.safetensors
    copy_target: bool = False               # copy target files instead of linking them
    allow_pickle: bool = False
    quant: str | None = None                # fp8 | nvfp4 = ModelOpt PTQ of the target; None / "none" = as is
    calib_data: str = "sharegpt"            # sharegpt | humaneval | mtbench | random | path to a .jsonl file
    calib_size: int = 128                   # calibration prompts (each cut to quantize.CALIB_MAX_LEN tokens)

    def __post_init__(self):
        if not self.target:
            raise DFlashError("target", "missing", "pass --target (short name, folder or hub id) or --config")
        _choice("backend", self.backend, BACKENDS)
        _choice("gpu", self.gpu, GPU_NAMES)
        _choice("dtype", self.dtype, DTYPES)
        for name in ("tp_size", "ep_size", "max_batch_size", "max_num_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise DFlashError(name, f"must be an integer >= 1, got {getattr(self, name)!r}", "pass e.g. 1")
        if self.max_seq_len < 2:
            raise DFlashError("max_seq_len", f"must be >= 2, got {self.max_seq_len}", "pass e.g. 2048")
        if self.max_draft_len is not None and self.max_draft_len < 1:
            raise DFlashError("max_draft_len", f"must be >= 1, got {self.max_draft_len}",
                              "DFlash drafts at least one token; omit it to use the drafter's block_size - 1")
        if not 0.0 < self.free_gpu_memory_fraction < 1.0:
            raise DFlashError("free_gpu_memory_fraction", f"must be in (0, 1), got {self.free_gpu_memory_fraction}",
                              "pass e.g. 0.8")
        if self.draft_len_schedule is not None:
            object.__setattr__(self, "draft_len_schedule", parse_schedule(self.draft_len_schedule))
        if self.draft_len_schedule and self.max_concurrency is not None:
            raise DFlashError("max_concurrency", "and draft_len_schedule are mutually exclusive in TensorRT-LLM",
                              "drop --max_concurrency: batch sizes above the schedule's largest key draft 0")
        if not (isinstance(self.draft_acceptance_rate, float) and 0.0 < self.draft_acceptance_rate < 1.0):
            raise DFlashError("draft_acceptance_rate", f"must be in (0, 1), got {self.draft_acceptance_rate!r}",
                              "pass e.g. 0.7 (the chance a draft is accepted given the previous one was)")
        _choice("draft_policy", self.draft_policy, DRAFT_POLICIES)
        if self.batch_invariant and self.backend != "torch":
            raise DFlashError("batch_invariant", "is our torch runtime's setting (TensorRT-LLM has none)",
                              "drop --batch_invariant, or use --backend torch")
        _choice("mxfp4_moe", self.mxfp4_moe, MXFP4_MOE)
        if self.mxfp4_moe != "auto" and self.backend != "torch":
            raise DFlashError("mxfp4_moe", "is our torch runtime's setting; TensorRT-LLM's is moe_backend",
                              "drop --mxfp4_moe, or use --backend torch")
        if self.mxfp4_moe == "triton_kernels" and (self.ep_size > 1 or self.batch_invariant):
            raise DFlashError("mxfp4_moe", "triton_kernels runs whole experts on each rank and is not batch invariant",
                              "use --ep_size 1 without --batch_invariant, or --mxfp4_moe triton")
        if self.draft_policy == "adaptive" and self.backend != "torch":
            raise DFlashError("draft_policy", "is our torch runtime's setting; TensorRT-LLM's is draft_len_schedule",
                              "drop --draft_policy, or use --backend torch")
        if self.draft_policy == "adaptive" and self.tp_size > 1:
            raise DFlashError("draft_policy", "adaptive measures step costs on rank 0 alone, so it needs tp_size 1",
                              "use --draft_policy fixed with tensor parallelism")
        if self.max_concurrency is not None and (not isinstance(self.max_concurrency, int) or self.max_concurrency < 1):
            raise DFlashError("max_concurrency", f"must be an integer >= 1, got {self.max_concurrency!r}",
                              "pass e.g. 32, or omit it to speculate at every load")
        if self.context_recompute_tail is not None:
            if not self.enable_block_reuse:
                raise DFlashError("context_recompute_tail", "only applies with block reuse",
                                  "add --enable_block_reuse, or drop --context_recompute_tail")
            if not isinstance(self.context_recompute_tail, int) or self.context_recompute_tail < 1:
                raise DFlashError("context_recompute_tail", f"must be an integer >= 1, got "
                                  f"{self.context_recompute_tail!r} (0 starves the drafter on a cache hit)",
                                  "pass e.g. 32")
        elif self.enable_block_reuse:
            object.__setattr__(self, "context_recompute_tail", DEFAULT_RECOMPUTE_TAIL)
        if self.presharded and self.backend != "torch":
            raise DFlashError("presharded", "ranks/ are for the torch backend only", "drop --presharded")
        if self.backend == "trtllm" and self.gpu == "cpu":
            raise DFlashError("backend", "trtllm needs an NVIDIA GPU", "use --backend torch with --gpu cpu")
        if self.quant == "none":
            object.__setattr__(self, "quant", None)   # one spelling of "not quantized", so fingerprints agree
        if self.quant is not None:
            _choice("quant", self.quant, QUANTS)
            if not isinstance(self.calib_size, int) or self.calib_size < 1:
                raise DFlashError("calib_size", f"must be an integer >= 1, got {self.calib_size!r}", "pass e.g. 128")
            from .quantize import check_calib_data

            check_calib_data(self.calib_data)


# One KV block at TensorRT-LLM's default tokens_per_block (32): reuse is block-aligned, so a shorter tail
# rounds up to a block anyway.
DEFAULT_RECOMPUTE_TAIL = 32


def parse_schedule(value) -> dict[int, int]:
    """``"1:7,16:4,64:2"`` (command line) or ``{1: 7, 16: 4}`` (preset) -> {batch size: draft length};
    ``none`` -> {} (no schedule, not even the derived one)."""
    fix = "write it as batch:draft pairs, e.g. 1:7,16:4,64:2, or none"
    if isinstance(value, str) and value.strip().lower() == "none":
        return {}
    try:
        if isinstance(value, str):
            pairs = [item.split(":") for item in value.replace(" ", "").split(",") if item]
            out = {int(k): int(v) for k, v in pairs}
        elif isinstance(value, dict):
            out = {int(k): int(v) for k, v in value.items()}
        else:
            raise TypeError
    except (TypeError, ValueError):
        raise DFlashError("draft_len_schedule", f"{value!r} is not batch:draft pairs", fix) from None
    if not out:
        raise DFlashError("draft_len_schedule", "is empty", fix)
    return dict(sorted(out.items()))


def _choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise DFlashError(name, f"{value!r} is not one of {', '.join(allowed)}", f"use one of {', '.join(allowed)}")


FIELD_NAMES = tuple(f.name for f in fields(BuildConfig))


def load_preset(path: str | Path) -> dict:
    """The ``build:`` section of a preset file, as a dict of BuildConfig fields (unknown keys are an error)."""
    path = Path(path)
    if not path.is_file():
        raise DFlashError("config", f"{path} does not exist", "pass a file from build_configs/")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise DFlashError("config", f"{path} is not valid YAML ({_yaml_problem(err)})", "fix the YAML syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("build"), dict):
        raise DFlashError("config", f"{path} has no `build:` section", "put the build settings under `build:`")
    unknown = sorted(set(data) - set(STAGE_SECTIONS))
    if unknown:
        raise DFlashError(f"config {path.name}: {unknown[0]}", "is not a stage section",
                          f"use sections {', '.join(STAGE_SECTIONS)}")
    section = data["build"]
    unknown = sorted(set(section) - set(FIELD_NAMES))
    if unknown:
        raise DFlashError(f"config {path.name}: build.{unknown[0]}", "is not a build setting",
                          f"use one of {', '.join(FIELD_NAMES)}")
    return dict(section)


# The presets beside the package (a source checkout or an editable install; a wheel has none).
PRESET_DIR = Path(__file__).resolve().parent.parent / "build_configs"


def preset_path(target: str, gpu: str, tp_size: int, directory: Path = PRESET_DIR) -> Path | None:
    """The preset made for this short-name target on this GPU at this TP size, if there is one."""
    path = directory / f"{target}_{gpu}_tp{tp_size}.yaml"
    return path if path.is_file() else None


def presets_for(target: str, directory: Path = PRESET_DIR) -> list[Path]:
    """Every preset of one short-name target (to name the nearest when none matches)."""
    return sorted(directory.glob(f"{target}_*_tp*.yaml")) if target else []


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's message on one line, with where it started (the context) and where it failed, 1-based."""
    mark, context = getattr(err, "problem_mark", None), getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if context is not None and getattr(err, "context", None):
        where += f"{err.context} at line {context.line + 1}, column {context.column + 1}: "
    return where + problem


def make(preset: dict | None = None, overrides: dict | None = None) -> BuildConfig:
    """Defaults, then the preset's values, then explicit overrides (command-line flags)."""
    values = {**(preset or {}), **(overrides or {})}
    try:
        return BuildConfig(**values)
    except TypeError as err:
        raise DFlashError("config", str(err), f"use only {', '.join(FIELD_NAMES)}") from None
