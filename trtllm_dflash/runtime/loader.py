# SPDX-License-Identifier: Apache-2.0
"""Build the target and drafter modules for one tensor-parallel rank and fill them from checkpoints (a
Deployment's, or a plain target/drafter pair); load the tokenizer and the EOS ids (everything Engine.from_dirs
needs). Each config.json is read once per load and handed down.

Each rank reads only its slices (safetensors lazy slices), fuses q/k/v and gate/up, checks every tensor
is present with the expected shape, and never initialises weights it is about to overwrite (modules are
built on the meta device).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoints import hf, validate
from ..deployment import Deployment
from ..errors import DFlashError
from ..model_config import DrafterConfig, target_config
from . import fp8, quant
from .distributed import TPGroup, init_tp, launcher_rank_and_size
from .kernels import TORCH, Kernels
from .models import mxfp4, target_family
from .models.dflash import DFlashDrafter
from .models.layers import Rotary
from .shard import slice_for_rank

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _read(path: Path, tp: TPGroup, allow_pickle: bool, presharded: dict | None, prefix: str,
          ep_size: int = 1, num_kv_heads: int | None = None) -> dict:
    if presharded is not None:
        return {k[len(prefix):]: v for k, v in presharded.items() if k.startswith(prefix)}
    shapes = hf.tensor_names(path, allow_pickle=allow_pickle)
    sd = hf.load_state_dict(path, allow_pickle=allow_pickle,
                            slicer=lambda n, lazy: slice_for_rank(n, lazy, tp.size, tp.rank, shapes[n], ep_size,
                                                                  num_kv_heads))
    if tp.size > 1 and any(f.suffix != ".safetensors" for f in hf.weight_files(path, allow_pickle=True)):
        # pickle: sliced after loading
        sd = {n: slice_for_rank(n, t, tp.size, tp.rank, ep_size=ep_size, num_kv_heads=num_kv_heads)
              for n, t in sd.items()}
    return sd


def _fuse(raw: dict[str, torch.Tensor], prefix: str, num_layers: int) -> dict[str, torch.Tensor]:
    """HF names -> our names: q/k/v -> qkv_proj, gate/up -> gate_up_proj, ``prefix`` stripped.

    FP8 weights kept for fp8_gemm fuse the same way, their per-row ``weight_scale`` concatenated alongside."""
    out, used = {}, set()

    def take(name: str) -> torch.Tensor | None:
        used.add(name)
        return raw.get(name)

    for i in range(num_layers):
        src, dst = f"{prefix}layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias", "weight_scale"):
            qkv = [take(f"{src}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if all(t is not None for t in qkv):
                out[f"{dst}self_attn.qkv_proj.{kind}"] = torch.cat(qkv)
            elif kind == "weight":
                missing = [f"{src}self_attn.{p}_proj.weight" for p, t in zip("qkv", qkv) if t is None]
                hf.missing_tensors([], missing, "checkpoint")
        gate, up = take(f"{src}mlp.gate_proj.weight"), take(f"{src}mlp.up_proj.weight")
        if gate is None or up is None:
            hf.missing_tensors([], [f"{src}mlp.gate_proj.weight" if gate is None else f"{src}mlp.up_proj.weight"], "checkpoint")
        out[f"{dst}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        scales = [take(f"{src}mlp.{p}_proj.weight_scale") for p in ("gate", "up")]
        if all(t is not None for t in scales):
            out[f"{dst}mlp.gate_up_proj.weight_scale"] = torch.cat(scales)
    for name, t in raw.items():
        if name in used or name.endswith(_IGNORED_SUFFIXES):
            continue
        key = name[len(prefix):] if name.startswith(prefix) else name
        out[key] = t
    return out


def _assign(module: nn.Module, sd: dict[str, torch.Tensor], where: str, device, dtype) -> None:
    """Replace the meta parameters by checkpoint tensors, checking names and shapes first."""
    expected = dict(module.named_parameters())
    hf.missing_tensors(sd.keys(), list(expected), where)
    extra = sorted(set(sd) - set(expected))
    if extra:
        raise DFlashError(f"{where}: tensor {extra[0]}", f"is not part of this architecture ({len(extra)} unexpected)",
                          "normalise the checkpoint with dflash-build (it converts known drafter formats)")
    for name, p in expected.items():
        if name in sd and tuple(sd[name].shape) != tuple(p.shape):
            raise DFlashError(f"{where}: tensor {name}", f"has shape {tuple(sd[name].shape)}, expected {tuple(p.shape)}",
                              "the checkpoint does not match its config.json (or the tp_size); re-export it")
    # FP8 weights and their float32 per-row scales (fp8_gemm), and packed MXFP4 experts (uint8) keep their
    # dtypes; everything else is cast.
    def cast(name: str, t: torch.Tensor) -> torch.Tensor:
        keep = t.dtype in (fp8.FP8, torch.uint8) or name.endswith(".weight_scale")
        return t.to(device=device, dtype=None if keep else dtype)

    module.load_state_dict({k: cast(k, v) for k, v in sd.items()}, strict=False, assign=True)


def load_target(path: Path, tp: TPGroup, device, dtype, max_positions: int, capture: tuple[int, ...] = (),
                allow_pickle: bool = False, presharded: dict | None = None, ep_size: int = 1,
                fp8_gemm: bool | None = False, mxfp4_moe: str = "dequant", hf_cfg: dict | None = None,
                kernels: Kernels = TORCH):
    """The target model for this rank; its class comes from config.json ``architectures`` (models.TARGETS).
    ``hf_cfg``: its config.json when the caller has read it already (read here otherwise).

    ``fp8_gemm``: FP8 linears of Llama-family targets become fp8.Fp8Linear (None = where the device runs them).
    ``mxfp4_moe``: how MoE targets run MXFP4 experts (models/mxfp4.resolve_backend: auto, triton, dequant).
    ``kernels``: what its modules run (Kernels.choose)."""
    hf_cfg = hf_cfg if hf_cfg is not None else hf.read_config(path)
    family = target_family(hf_cfg)
    cfg = family.config.from_hf(hf_cfg)
    moe_backend = mxfp4.resolve_backend(mxfp4_moe, hf_cfg, torch.device(device)) if family.moe else "dequant"
    with torch.device("meta"):
        model = family.build(cfg, tp, max_positions, capture, ep_size, moe_backend, kernels)
    # ModelOpt FP8 / NVFP4 linears -> plain weights of this rank (runtime/quant.py); scales consumed. For fp8_gemm
    # FP8 weights stay FP8; families with their own tensor mapping (gpt-oss: MXFP4 experts) are always dequantised.
    asked = fp8_gemm
    if fp8_gemm is None:   # auto; an explicit True was checked against the device by the engine
        fp8_gemm = fp8.effective(None, torch.device(device), dtype)
    keep_fp8 = fp8_gemm and family.to_module is None
    kv_heads = hf_cfg.get("num_key_value_heads") or hf_cfg["num_attention_heads"]
    raw = quant.dequantize(_read(path, tp, allow_pickle, presharded, "target.", ep_size, kv_heads), dtype, keep_fp8)
    sd = (family.to_module(raw, model, device, dtype) if family.to_module is not None
          else _fuse(raw, "model.", cfg.num_layers))
    if fp8_gemm:
        in_fp8 = fp8.convert(model, sd, device, dtype, log=tp.rank == 0)
        if in_fp8 == 0 and asked and tp.rank == 0:   # not an error: one setting serves quantized and plain targets
            print(f"[trtllm_dflash] note: fp8_gemm: target {path} has no FP8 linears to run in FP8; "
                  f"it runs in {str(dtype).removeprefix('torch.')}", file=sys.stderr)
    if "lm_head.weight" not in sd:
        if not cfg.tie_word_embeddings:
            hf.missing_tensors([], ["lm_head.weight"], f"target {path}")
        full = sd["embed_tokens.weight"]  # replicated, so slice this rank's vocab rows from it
        sd["lm_head.weight"] = slice_for_rank("lm_head.weight", full, tp.size, tp.rank)
    _assign(model, sd, f"target {path}", device, dtype)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()


def load_drafter(path: Path, target_hidden: int, tp: TPGroup, device, dtype, max_positions: int,
                 allow_pickle: bool = False, presharded: dict | None = None,
                 hf_cfg: dict | None = None, kernels: Kernels = TORCH) -> DFlashDrafter:
    cfg = DrafterConfig.from_hf(hf_cfg if hf_cfg is not None else hf.read_config(path))
    with torch.device("meta"):
        model = DFlashDrafter(cfg, target_hidden, tp, max_positions, kernels)
    sd = _fuse(_read(path, tp, allow_pickle, presharded, "drafter.", num_kv_heads=cfg.num_kv_heads), "",
               cfg.num_layers)
    _assign(model, sd, f"drafter {path}", device, dtype)
    model.rotary = Rotary(cfg.rope, cfg.head_dim, max_positions, cfg.max_position_embeddings).to(device)
    return model.eval()


# ---- what Engine.from_dirs / from_deployment load ---------------------------------------------------
def resolve_device(cfg) -> tuple[torch.device, torch.dtype]:
    """RuntimeConfig device/dtype ('auto' included) -> torch device and dtype."""
    dev = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                       "cpu" if cfg.device == "auto" else cfg.device)
    dtype = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[cfg.dtype]
    if cfg.fp8_gemm:   # asked for explicitly: refuse off Hopper/Ada before loading (None = auto, in load_target)
        fp8.check_device(dev, dtype)
    return dev, dtype


@dataclass
class Loaded:
    target: nn.Module
    drafter: DFlashDrafter | None
    tokenizer: object | None
    tp: TPGroup
    eos_ids: set[int]


def load_pair(target_dir, drafter_dir, cfg, *, tp_size: int = 1, allow_pickle: bool = False,
              presharded: dict | None = None, ep_size: int = 1) -> Loaded:
    """Check the pair's configs (before any rank or weight is touched), join the tensor-parallel group,
    then load this rank's target, drafter (None for block_size 1), tokenizer and EOS ids."""
    device, dtype = resolve_device(cfg)
    target_dir = Path(target_dir)
    tcfg = hf.read_config(target_dir)
    dcfg = hf.read_config(drafter_dir) if drafter_dir is not None and cfg.block_size != 1 else None
    if dcfg is not None:
        validate.check_pair(tcfg, dcfg, tp_size=tp_size, block_size=cfg.block_size)
    else:
        validate.check_tp(tcfg, tp_size, "target")
    target_config(tcfg)  # an architecture the runtime lacks fails here, before any rank starts
    tp = init_tp(tp_size, device, allreduce_strategy=cfg.allreduce_strategy)
    if device.type == "cuda" and tp.size > 1:
        device = torch.device("cuda", torch.cuda.current_device())
    positions = cfg.max_seq_len
    kernels = Kernels.choose(cfg.kernels, cfg.batch_invariant, device, dtype)
    drafter = (load_drafter(Path(drafter_dir), tcfg["hidden_size"], tp, device, dtype, positions, allow_pickle,
                            presharded, hf_cfg=dcfg, kernels=kernels) if dcfg is not None else None)
    capture = drafter.config.target_layer_ids if drafter is not None else ()
    target = load_target(target_dir, tp, device, dtype, positions, capture, allow_pickle, presharded, ep_size,
                         fp8_gemm=cfg.fp8_gemm, mxfp4_moe=cfg.mxfp4_moe, hf_cfg=tcfg, kernels=kernels)
    tokenizer = load_tokenizer(target_dir)
    return Loaded(target, drafter, tokenizer, tp, eos_ids(target_dir, tcfg, tokenizer))


def read_deployment(deployment: Deployment, overrides: dict) -> dict:
    """A torch deployment -> load_pair's arguments, with this rank's presharded slices when the build wrote them."""
    deployment.require_backend("torch", "the torch runtime",
                               "serve it with TensorRT-LLM (trtllm-serve) or rebuild with --backend torch")
    cfg = deployment.runtime_config(overrides)
    tp_size = deployment.tp_size
    presharded = None
    rank_file = deployment.rank_file(launcher_rank_and_size()[0] if tp_size > 1 else 0)
    if rank_file is not None:
        from safetensors.torch import load_file
        presharded = load_file(str(rank_file))
    return dict(target_dir=deployment.target_dir, drafter_dir=deployment.drafter_dir, cfg=cfg, tp_size=tp_size,
                presharded=presharded, ep_size=deployment.ep_size)


def load_tokenizer(target_dir: Path):
    """The target's tokenizer, or None for a weights-only folder (token-id requests still work)."""
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(target_dir))


def eos_ids(target_dir: Path, cfg: dict, tokenizer) -> set[int]:
    """Stop ids from config.json, generation_config.json and the tokenizer (all of them count)."""
    ids: set[int] = set()
    sources = [cfg.get("eos_token_id")]
    gen = target_dir / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    if tokenizer is not None:
        sources.append(tokenizer.eos_token_id)
    for s in sources:
        ids.update(s if isinstance(s, list) else [s] if s is not None else [])
    return ids
