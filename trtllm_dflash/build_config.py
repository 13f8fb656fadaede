# SPDX-License-Identifier: Apache-2.0
"""Settings of ``dflash-build``: one frozen dataclass, filled from dataclass defaults, then a preset YAML
(``build_configs/<model>_<gpu>_tp<N>.yaml``, section ``build:``), then explicit command-line flags."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from .errors import DFlashError

BACKENDS = ("torch", "trtllm")
GPU_NAMES = ("h100", "h200", "b200", "b300", "gb200", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
# ModelOpt PTQ of the target (quantize.py); "none" keeps its weights (the same as leaving quant unset).
QUANTS = ("fp8", "nvfp4", "none")
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
    dtype: str = "auto"
    max_batch_size: int = 8
    max_seq_len: int = 2048
    max_num_tokens: int = 8192
    max_draft_len: int | None = None        # None = drafter block_size - 1
    free_gpu_memory_fraction: float = 0.8   # KV-cache share; the DFlash context arena is outside it
    attention_backend: str | None = None    # drafter attention in TensorRT-LLM; None = the GPU's default
    moe_backend: str | None = None          # MoE targets only; None = the GPU's default
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
        raise DFlashError("config", f"{path} is not valid YAML ({str(err).splitlines()[0]})",
                          "fix the YAML syntax") from None
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


def make(preset: dict | None = None, overrides: dict | None = None) -> BuildConfig:
    """Defaults, then the preset's values, then explicit overrides (command-line flags)."""
    values = {**(preset or {}), **(overrides or {})}
    try:
        return BuildConfig(**values)
    except TypeError as err:
        raise DFlashError("config", str(err), f"use only {', '.join(FIELD_NAMES)}") from None
