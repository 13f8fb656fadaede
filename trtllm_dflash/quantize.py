# SPDX-License-Identifier: Apache-2.0
"""ModelOpt post-training quantization of the target: FP8 (Hopper and newer) or NVFP4 (Blackwell).

Consumes: a Hugging Face target folder and calibration prompts (a packaged prompt set, a JSONL file, or
random token ids for tokenizer-less test models).
Produces: the quantized target in ModelOpt's unified Hugging Face layout (``export_hf_checkpoint``):
``model.safetensors`` + ``hf_quant_config.json`` (which TensorRT-LLM reads from the checkpoint folder itself),
the source's config.json with ModelOpt's ``quantization_config`` added, and the source's tokenizer files.

NVIDIA ModelOpt is imported here only, lazily: ``pip install 'trtllm-dflash[modelopt]'``.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import data
from .errors import DFlashError

# --quant -> the ModelOpt recipe (modelopt.torch.quantization.<name>)
RECIPES = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}
CALIB_SETS = (*data.DATASETS, "random")   # or a path to a .jsonl file
CALIB_MAX_LEN = 512         # tokens per calibration prompt; longer ones are cut (amax needs coverage, not length)
RANDOM_LEN = 64             # tokens per prompt of --calib_data random
INSTALL = "pip install 'trtllm-dflash[modelopt]'"
# Files of the source folder that the export replaces or that must not be carried over.
_NOT_COPIED = ("config.json", "hf_quant_config.json", "model.safetensors.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class QuantRecord:
    """What the manifest says about a quantized target (``Deployment.quant``)."""

    quant: str                          # fp8 | nvfp4 (the --quant value)
    quant_algo: str                     # hf_quant_config.json quantization.quant_algo: FP8 | NVFP4
    kv_cache_quant_algo: str | None     # None: the KV cache stays in the model dtype
    group_size: int | None              # NVFP4: 16 inputs per block scale
    exclude_modules: list[str]          # left unquantized (lm_head, embeddings)
    recipe: str                         # modelopt.torch.quantization config name
    calib_data: str
    calib_size: int                     # prompts actually used
    calib_tokens: int
    calib_max_len: int
    calib_s: float                      # calibration forward passes + quantizer insertion, seconds
    export_s: float
    device: str                         # where calibration ran
    modelopt: str                       # nvidia-modelopt version
    config: str = "target/hf_quant_config.json"


def require_modelopt():
    """(mtq, export_hf_checkpoint), or a one-line DFlashError naming the extra to install."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as err:
        # modelopt 0.47 imports `requests` without declaring it; the extra installs both.
        raise DFlashError("quant", f"NVIDIA ModelOpt is not importable ({err})", INSTALL) from None
    return mtq, export_hf_checkpoint


def check_calib_data(calib_data: str) -> None:
    """A known prompt set, ``random``, or an existing .jsonl file."""
    if calib_data in CALIB_SETS:
        return
    path = Path(calib_data).expanduser()
    if path.suffix != ".jsonl":
        raise DFlashError("calib_data", f"{calib_data!r} is not a prompt set or a .jsonl file",
                          f"use one of {', '.join(CALIB_SETS)} or a path to a .jsonl file")
    if not path.is_file():
        raise DFlashError("calib_data", f"{path} does not exist", "pass an existing .jsonl file")


# ---- calibration prompts ------------------------------------------------------------------------
def calibration_ids(calib_data: str, calib_size: int, target_dir: Path, *, vocab_size: int,
                    max_len: int = CALIB_MAX_LEN, log=print) -> list[list[int]]:
    """Token ids of ``calib_size`` prompts, chat-templated with the target's tokenizer, each cut to ``max_len``."""
    check_calib_data(calib_data)
    if calib_data == "random":
        import torch

        gen = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab_size, (calib_size, min(RANDOM_LEN, max_len)), generator=gen).tolist()
    tokenizer = _tokenizer(target_dir)
    if calib_data in data.DATASETS:
        prompts = [list(p.messages) for p in data.load_prompts(calib_data, calib_size)]
    else:
        prompts = _read_jsonl(Path(calib_data).expanduser(), calib_size)
    if len(prompts) < calib_size:
        log(f"note: {calib_data} has {len(prompts)} prompts, fewer than calib_size {calib_size}: using all of them")
    if not getattr(tokenizer, "chat_template", None) and any(isinstance(p, list) for p in prompts):
        log("note: the target's tokenizer has no chat template: calibrating on the raw message texts")
    return [_encode(tokenizer, p)[:max_len] for p in prompts]


def _tokenizer(target_dir: Path):
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise DFlashError("calib_data", f"the target {target_dir} has no tokenizer to encode calibration prompts",
                          "add its tokenizer files, or pass --calib_data random (plumbing tests only)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir))


def _read_jsonl(path: Path, n: int) -> list:
    """Lines of ``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": "..."}`` (one user turn; dflash-train's
    prompt files), both chat-templated, or ``{"text": "..."}`` (as is)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if len(out) == n:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DFlashError(f"calib_data {path}:{lineno}", f"is not JSON ({err})", "write one object per line") \
                    from None
            if isinstance(row, dict) and isinstance(row.get("messages"), list) and row["messages"]:
                out.append(row["messages"])
            elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and row["prompt"]:
                out.append([{"role": "user", "content": row["prompt"]}])
            elif isinstance(row, dict) and isinstance(row.get("text"), str) and row["text"]:
                out.append(row["text"])
            else:
                raise DFlashError(f"calib_data {path}:{lineno}", "has no non-empty 'messages' list, 'prompt' or 'text'",
                                  'write {"messages": [{"role": "user", "content": "..."}]} or {"text": "..."}')
    if not out:
        raise DFlashError("calib_data", f"{path} holds no prompts", "add at least one line")
    return out


def _encode(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if getattr(tokenizer, "chat_template", None):
        return data.apply_chat_template(tokenizer, prompt)
    return list(tokenizer("\n".join(m["content"] for m in prompt))["input_ids"])


# ---- quantize + export --------------------------------------------------------------------------
def quantize_target(src: Path, dst: Path, *, quant: str, calib_data: str, calib_size: int,
                    max_len: int = CALIB_MAX_LEN, log=print) -> QuantRecord:
    """PTQ of the target in ``src`` with ModelOpt, exported into ``dst`` (created; must not exist)."""
    if quant not in RECIPES:
        raise DFlashError("quant", f"{quant!r} is not one of {', '.join(RECIPES)}", f"use one of {', '.join(RECIPES)}")
    mtq, export_hf_checkpoint = require_modelopt()
    import modelopt
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    src_cfg = json.loads((src / "config.json").read_text())
    ids = calibration_ids(calib_data, calib_size, src, vocab_size=int(src_cfg["vocab_size"]), max_len=max_len,
                          log=log)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = _checkpoint_dtype(src_cfg)
    # bf16 matmuls are slow on many CPUs: calibrate in float32 there, then cast back before exporting.
    calib_dtype = dtype if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=calib_dtype,
                                                 device_map="auto" if device == "cuda" else None).eval()
    # export_hf_checkpoint walks config.architectures (None for a model built from a bare config).
    model.config.architectures = src_cfg["architectures"]
    first = next(model.parameters()).device

    def forward_loop(m):
        for x in tqdm(ids, desc=f"calibrate {quant}", unit="prompt", file=sys.stderr,
                      disable=len(ids) < 8):
            m(torch.tensor([x], device=first))

    t0 = time.perf_counter()
    with torch.no_grad():
        mtq.quantize(model, getattr(mtq, RECIPES[quant]), forward_loop)
    calib_s = time.perf_counter() - t0
    if calib_dtype != dtype:
        model.to(dtype)
    t0 = time.perf_counter()
    with torch.no_grad():
        export_hf_checkpoint(model, dtype=dtype, export_dir=str(dst))
    export_s = time.perf_counter() - t0
    _finish_folder(src, dst, src_cfg)
    q = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]
    log(f"quantized the target to {q['quant_algo']} on {device} ({len(ids)} calibration prompts, {calib_s:.1f} s)")
    return QuantRecord(quant=quant, quant_algo=q["quant_algo"], kv_cache_quant_algo=q.get("kv_cache_quant_algo"),
                       group_size=q.get("group_size"), exclude_modules=list(q.get("exclude_modules") or []),
                       recipe=RECIPES[quant], calib_data=calib_data, calib_size=len(ids),
                       calib_tokens=sum(map(len, ids)), calib_max_len=max_len, calib_s=round(calib_s, 2),
                       export_s=round(export_s, 2), device=device, modelopt=modelopt.__version__)


def _checkpoint_dtype(cfg: dict):
    import torch

    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise DFlashError("target config.json: torch_dtype", f"{name!r} is not a torch dtype", "fix config.json")
    return value


def _finish_folder(src: Path, dst: Path, src_cfg: dict) -> None:
    """config.json = the source's + ModelOpt's quantization_config; tokenizer and other small files copied.

    The source config is kept verbatim rather than the re-saved one: transformers 5 folds keys such as
    ``rope_theta`` into ``rope_parameters``, and TensorRT-LLM's transformers 4.x reads only the top-level key.
    """
    exported = json.loads((dst / "config.json").read_text())
    cfg = {**src_cfg, "quantization_config": exported["quantization_config"]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.name not in _NOT_COPIED \
                and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copyfile(f, dst / f.name)   # generation_config.json too: the source's own bytes
    for f in dst.iterdir():
        f.chmod(0o644)   # safetensors writes owner-only files; a served deployment is read by other users


def record_dict(record: QuantRecord) -> dict:
    return asdict(record)
