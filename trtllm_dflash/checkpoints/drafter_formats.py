# SPDX-License-Identifier: Apache-2.0
"""DFlash drafter checkpoints in any known format -> the canonical z-lab layout.

Canonical (what TensorRT-LLM and our runtime load): ``config.json`` = Qwen3 fields + ``architectures:
["DFlashDraftModel"]``, ``model_type: qwen3``, top-level ``block_size``, ``num_target_layers``,
``dflash_config: {mask_token_id, target_layer_ids}`` (z-lab ids: layer i output = HF hidden_states[i+1]);
weights ``layers.N.*``, ``fc.weight``, ``hidden_norm.weight``, ``norm.weight`` and no embeddings / lm_head.

Known formats (each from its producer's public code: github.com/z-lab/dflash, NVIDIA/Model-Optimizer,
vllm-project/speculators, sgl-project/SpecForge):
  z-lab        the reference checkpoints (z-lab/*-DFlash*)
  modelopt     NVIDIA ModelOpt ``export_speculative_decoding``: z-lab plus ``dflash_config.causal``
  speculators  vLLM speculators: ``transformer_layer_config``, ``aux_hidden_state_layer_ids`` (= z-lab ids + 1),
               its own embed_tokens / lm_head (dropped only when identical to the target's)
  specforge    SpecForge ``train_dflash.py`` checkpoints: the target's config (its model_type) + dflash fields,
               weights maybe under ``draft_model.``, a pickled ``training_state.pt`` that is never read
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DFlashError

KNOWN_FORMATS = ("z-lab", "modelopt", "speculators", "specforge")
_LAYER_TENSOR = re.compile(
    r"^layers\.\d+\.(self_attn\.[qkvo]_proj\.(weight|bias)|self_attn\.[qk]_norm\.weight|"
    r"mlp\.(gate|up|down)_proj\.weight|(input|post_attention)_layernorm\.weight)$")
_TOP_TENSORS = ("fc.weight", "hidden_norm.weight", "norm.weight")
# speculators keeps copies of target tensors; each maps to the target tensor it must equal.
_SPECULATORS_COPIES = {"embed_tokens.weight": "embed", "lm_head.weight": "lm_head",
                       "verifier_lm_head.weight": "lm_head", "verifier_norm.weight": "norm"}
_TARGET_NAMES = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight", "norm": "model.norm.weight"}


@dataclass
class Normalised:
    """A canonical drafter config (and weights, unless config-only) plus what was changed, for the manifest."""

    format: str
    config: dict
    notes: list[str] = field(default_factory=list)


def detect(cfg: dict, files: set[str]) -> str:
    """Which known format a drafter folder is in (from config.json content and its file list)."""
    dflash = cfg.get("dflash_config") or {}
    if "speculators_config" in cfg or cfg.get("speculators_model_type"):
        return "speculators"
    if "causal" in dflash:
        return "modelopt"
    if dflash and ("training_state.pt" in files or cfg.get("model_type") != "qwen3"
                   or cfg.get("architectures") != ["DFlashDraftModel"]):
        return "specforge"
    if dflash and cfg.get("architectures") == ["DFlashDraftModel"]:
        return "z-lab"
    raise DFlashError("drafter", "config.json is not a DFlash drafter in any known format",
                      f"pass a drafter in one of: {', '.join(KNOWN_FORMATS)} (or name it with --drafter_format)")


def canonical_config(cfg: dict, fmt: str, target_cfg: dict) -> Normalised:
    """The canonical config.json for a drafter config in format ``fmt`` (no weights needed: dry runs use it)."""
    if fmt not in KNOWN_FORMATS:
        raise DFlashError("drafter_format", f"unknown format {fmt!r}", f"use one of {', '.join(KNOWN_FORMATS)}")
    notes: list[str] = []
    if fmt == "speculators":
        out = _from_speculators(cfg, target_cfg, notes)
    else:
        out = json.loads(json.dumps(cfg))
        dflash = out.setdefault("dflash_config", {})
        if fmt == "modelopt":
            if dflash.pop("causal"):
                raise DFlashError("drafter dflash_config.causal", "is true: DFlash drafters attend non-causally",
                                  "re-export the drafter with causal=false")
            notes.append("dropped dflash_config.causal (false)")
    dflash = out.setdefault("dflash_config", {})
    if "block_size" not in out and "block_size" in dflash:
        # Qwen3.5+ drafters keep it in dflash_config; TensorRT-LLM before PR #17935 reads only the top level.
        out["block_size"] = dflash["block_size"]
        notes.append("copied dflash_config.block_size to the top level")
    for key, where in (("mask_token_id", "dflash_config.mask_token_id"),
                       ("target_layer_ids", "dflash_config.target_layer_ids")):
        if dflash.get(key) is None:
            raise DFlashError(f"drafter {where}", "missing", "use a drafter checkpoint that records it")
    if out.get("block_size") is None:
        raise DFlashError("drafter block_size", "missing from config.json", "use a drafter checkpoint that records it")
    if out.get("model_type") != "qwen3" or out.get("architectures") != ["DFlashDraftModel"]:
        notes.append(f"model_type {out.get('model_type')} / architectures {out.get('architectures')} -> "
                     "qwen3 / DFlashDraftModel (DFlash draft layers are Qwen3 layers)")
    out["architectures"], out["model_type"] = ["DFlashDraftModel"], "qwen3"
    out.setdefault("head_dim", out["hidden_size"] // out["num_attention_heads"])
    out.setdefault("num_target_layers", target_cfg.get("num_hidden_layers"))
    out["tie_word_embeddings"] = False
    for key in ("dtype", "torch_dtype"):
        if key in cfg:
            out[key] = cfg[key]
    return Normalised(fmt, out, notes)


def _from_speculators(cfg: dict, target_cfg: dict, notes: list[str]) -> dict:
    if cfg.get("projector_type", "dflash") != "dflash":
        raise DFlashError("drafter projector_type", f"{cfg['projector_type']!r} is not plain DFlash",
                          "use a DFlash (projector_type: dflash) speculators checkpoint")
    layer_cfg = dict(cfg.get("transformer_layer_config") or {})
    if not layer_cfg:
        raise DFlashError("drafter transformer_layer_config", "missing", "re-save the speculators checkpoint")
    vocab = target_cfg.get("vocab_size")
    if cfg.get("draft_vocab_size", vocab) != vocab:
        raise DFlashError("drafter draft_vocab_size",
                          f"{cfg['draft_vocab_size']} != target vocab {vocab}: a reduced draft vocab (d2t) has no "
                          "z-lab form", "train the drafter with the full target vocabulary")
    aux = cfg.get("aux_hidden_state_layer_ids")
    if not aux:
        raise DFlashError("drafter aux_hidden_state_layer_ids", "missing", "re-save the speculators checkpoint")
    out = {k: v for k, v in layer_cfg.items() if k not in ("architectures", "auto_map")}
    out["block_size"] = cfg.get("block_size")
    # speculators captures the input of layer j (= output of layer j-1): z-lab id = speculators id - 1.
    out["dflash_config"] = {"mask_token_id": cfg.get("mask_token_id"), "target_layer_ids": [i - 1 for i in aux]}
    notes.append(f"target_layer_ids = aux_hidden_state_layer_ids - 1: {aux} -> {[i - 1 for i in aux]}")
    return out


def canonical_weights(sd: dict, fmt: str, cfg: dict, target_tensors, notes: list[str]) -> dict:
    """The canonical state dict. ``target_tensors(keys)`` returns target tensors by role (embed/lm_head/norm)."""
    import torch

    prefixes = {name.split(".", 1)[0] + "." for name in sd}
    for prefix in ("draft_model.", "dflash_module.", "model."):
        if prefixes == {prefix}:
            sd = {name[len(prefix):]: t for name, t in sd.items()}
            notes.append(f"stripped the {prefix!r} prefix from every tensor name")
    if fmt == "speculators":
        roles = {name: role for name, role in _SPECULATORS_COPIES.items() if name in sd}
        target = target_tensors(set(roles.values())) if roles else {}
        for name, role in roles.items():
            mine, theirs = sd.pop(name), target[role]
            if mine.shape != theirs.shape or not torch.equal(mine, theirs.to(mine.dtype)):
                raise DFlashError(f"drafter tensor {name}", "differs from the target's: the drafter has its own "
                                  f"{role}, which the z-lab layout cannot hold",
                                  "use a drafter trained with the target's frozen embeddings and lm_head")
            notes.append(f"dropped {name} (identical to the target's {role})")
        for name in ("d2t", "t2d"):
            if name in sd:
                mapping = sd.pop(name)
                identity = not mapping.any() if name == "d2t" else bool(mapping.all())
                if not identity:
                    raise DFlashError(f"drafter tensor {name}", "maps a reduced draft vocab",
                                      "train the drafter with the full target vocabulary")
                notes.append(f"dropped {name} (identity vocab mapping)")
    unknown = [n for n in sd if n not in _TOP_TENSORS and not _LAYER_TENSOR.match(n)]
    if unknown:
        raise DFlashError(f"drafter tensor {unknown[0]}", f"is not part of a DFlash drafter ({len(unknown)} unknown)",
                          f"pass a drafter in one of: {', '.join(KNOWN_FORMATS)}")
    required = list(_TOP_TENSORS) + [f"layers.{i}.self_attn.{p}_proj.weight" for i in range(cfg["num_hidden_layers"])
                                     for p in "qkvo"]
    lost = [r for r in required if r not in sd]
    if lost:
        raise DFlashError(f"drafter tensor {lost[0]}", f"missing ({len(lost)} missing in all)",
                          "the drafter checkpoint is incomplete; re-export it")
    return sd


def normalise(src: Path, dst: Path, target_dir: Path, target_cfg: dict, *, fmt: str | None = None,
              allow_pickle: bool = False) -> Normalised:
    """Write the canonical z-lab drafter from folder ``src`` into ``dst`` (config.json + model.safetensors)."""
    from . import hf

    raw = hf.read_config(src)
    files = {p.name for p in src.iterdir()}
    fmt = fmt or detect(raw, files)
    result = canonical_config(raw, fmt, target_cfg)
    if fmt == "specforge" and not any(src.glob("*.safetensors")):
        # training_state.pt is a pickle of optimizer state, not weights: never read it.
        raise DFlashError(str(src), "has no *.safetensors drafter weights (training_state.pt is optimizer state)",
                          "point --drafter at a SpecForge epoch_*_step_* folder saved with save_pretrained")
    sd = hf.load_state_dict(src, allow_pickle=allow_pickle)

    def target_tensors(roles: set[str]) -> dict:
        names = {role: _target_name(role, target_cfg) for role in roles}
        loaded = hf.load_state_dict(target_dir, allow_pickle=allow_pickle, select=lambda n: n in names.values())
        lost = [n for n in names.values() if n not in loaded]
        if lost:
            raise DFlashError(f"target tensor {lost[0]}", "missing, so the drafter's copy cannot be compared",
                              "pass the full target checkpoint")
        return {role: loaded[name] for role, name in names.items()}

    sd = canonical_weights(sd, fmt, result.config, target_tensors, result.notes)
    dst.mkdir(parents=True, exist_ok=True)
    hf.save_state_dict(sd, dst)
    for code in src.glob("*.py"):
        shutil.copy2(code, dst / code.name)   # remote code named by auto_map (z-lab ships dflash.py)
    auto_map = result.config.get("auto_map") or {}
    if any(not (dst / (ref.split(".")[0] + ".py")).exists() for ref in auto_map.values()):
        result.config.pop("auto_map")
        result.notes.append("dropped auto_map (its remote-code file is not in the checkpoint)")
    (dst / "config.json").write_text(json.dumps(result.config, indent=2, sort_keys=True) + "\n")
    return result


def _target_name(role: str, target_cfg: dict) -> str:
    if role == "lm_head" and target_cfg.get("tie_word_embeddings"):
        return _TARGET_NAMES["embed"]
    return _TARGET_NAMES[role]
