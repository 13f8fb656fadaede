# SPDX-License-Identifier: Apache-2.0
"""The HF target wrapped by NVIDIA ModelOpt into a DFlash training model (``mtsp.convert(model, [("dflash", cfg)])``).

ModelOpt 0.47 does the paper's recipe: frozen target (its embeddings and lm_head shared), random anchors on response
tokens, context visible strictly before the anchor, bidirectional attention inside a block, position k of a block
labelled with token ``anchor + k``, loss weight ``exp(-(k-1)/gamma)``, and optionally distillation of the target's
own logits. Two things of 0.47 we work around, and check:

* Every draft size is passed explicitly: fields left out take Qwen3Config defaults (32 heads, head_dim 128,
  intermediate 22016), not the target's.
* RoPE: ModelOpt copies ``rope_theta`` from the target config only if that config has the attribute; transformers 5
  keeps it in ``rope_parameters``, so the draft would train with Qwen3's default theta 10000 while the export writes
  the target's (SmolLM2: 1e5). We pass ``rope_parameters`` ourselves and compare the draft's RoPE frequencies with
  the target theta before training starts.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoints import hf
from ..errors import DFlashError
from ..model_config import build_target_layer_ids, rope_parameters
from ..runtime.models.layers import rope_inv_freq
from ..versions import installed
from . import kd_loss
from .settings import TrainConfig

MODELOPT_TESTED = "0.47.0"
_INSTALL = "pip install 'trtllm-dflash[modelopt]' (nvidia-modelopt==0.47.0 with transformers<5.15)"


def versions() -> dict:
    """Versions of the packages the training path depends on (for the report)."""
    return installed("nvidia-modelopt", "transformers", "torch")


def check_environment() -> None:
    """ModelOpt with DFlash (>= 0.44) and a transformers its DFlash conversion works with (< 5.15)."""
    v = versions()
    if v["nvidia-modelopt"] is None:
        raise DFlashError("nvidia-modelopt", "is not installed (dflash-train trains with ModelOpt)", _INSTALL)
    if _release(v["nvidia-modelopt"]) < (0, 44):
        raise DFlashError("nvidia-modelopt", f"{v['nvidia-modelopt']} has no DFlash (added in 0.44)", _INSTALL)
    if _release(v["transformers"]) >= (5, 15):
        # Seen with 5.23: Qwen3RotaryEmbedding.__init__() got an unexpected keyword argument 'device'.
        raise DFlashError("transformers", f"{v['transformers']} breaks ModelOpt's DFlash conversion (needs < 5.15)",
                          "pip install 'transformers==5.14.1' into the training environment")


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split("+")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def draft_shape(cfg: TrainConfig, target_cfg: dict) -> dict:
    """Every size of the draft, explicit (defaults: the target's), plus the target layers it taps."""
    heads = target_cfg["num_attention_heads"]
    n_target = target_cfg["num_hidden_layers"]
    ids = list(cfg.target_layer_ids) if cfg.target_layer_ids is not None else build_target_layer_ids(
        n_target, cfg.num_layers)
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise DFlashError("--target_layer_ids", f"{bad} out of range for a {n_target}-layer target",
                          f"use 0-based layer ids below {n_target}")
    if len(set(ids)) != len(ids):
        raise DFlashError("--target_layer_ids", f"{ids} repeats a layer (the z-lab rule degenerates for a "
                          f"{n_target}-layer target); ModelOpt needs one distinct layer per draft layer",
                          f"pass {cfg.num_layers} distinct ids, or fewer --num_layers")
    return {
        "num_hidden_layers": cfg.num_layers,
        "intermediate_size": cfg.intermediate_size or target_cfg["intermediate_size"],
        "num_attention_heads": cfg.num_attention_heads or heads,
        "num_key_value_heads": cfg.num_key_value_heads or target_cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.head_dim or target_cfg.get("head_dim") or target_cfg["hidden_size"] // heads,
        "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 4096),
        "hidden_act": "silu",
        "attention_bias": False,
        "target_layer_ids": ids,
        # The draft's own RoPE: plain, with the target's theta (what the z-lab drafters and the export use).
        "rope_parameters": {"rope_type": "default", "rope_theta": float(rope_parameters(target_cfg)["rope_theta"])},
    }


def init_drafter_dir(spec: str) -> Path:
    """The folder of --init_drafter: a shipped drafter by name, or a folder holding config.json + model.safetensors."""
    from ..checkpoints.resolve import SHIPPED_DRAFTERS, shipped_drafter_dir

    path = shipped_drafter_dir(spec) if spec in SHIPPED_DRAFTERS else Path(spec).expanduser()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise DFlashError("--init_drafter", f"{spec} holds no config.json + model.safetensors",
                          "pass an exported drafter folder (dflash-train's <out>/drafter) or smollm2-135m-dflash")
    return path


def check_init_drafter(path: Path, cfg: TrainConfig, shape: dict, mask_token_id: int) -> None:
    """A warm start must describe the drafter this run trains: what ModelOpt's shape check cannot see (the
    block size, the tapped target layers, the mask id) is compared here, the tensor shapes too."""
    import json

    got = json.loads((path / "config.json").read_text())
    dflash = got.get("dflash_config") or {}
    pairs = {"block_size": (got.get("block_size"), cfg.block_size),
             "num_layers": (got.get("num_hidden_layers"), shape["num_hidden_layers"]),
             "target_layer_ids": (dflash.get("target_layer_ids"), list(shape["target_layer_ids"])),
             "mask_token_id": (dflash.get("mask_token_id"), mask_token_id)}
    for name in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        pairs[name] = (got.get(name), shape[name])
    for name, (theirs, ours) in pairs.items():
        if theirs != ours:
            raise DFlashError("--init_drafter", f"{path} has {name} {theirs}, this run trains {ours}",
                              f"pass --{name} {theirs if not isinstance(theirs, list) else ' '.join(map(str, theirs))}"
                              " (or start from random weights: omit --init_drafter)")


def modelopt_config(cfg: TrainConfig, shape: dict, mask_token_id: int) -> dict:
    init = init_drafter_dir(cfg.init_drafter) if cfg.init_drafter else None
    if init is not None:
        check_init_drafter(init, cfg, shape, mask_token_id)
    return {
        "dflash_block_size": cfg.block_size,
        "dflash_num_anchors": cfg.num_anchors,
        "dflash_mask_token_id": mask_token_id,
        "dflash_freeze_base_model": True,
        "dflash_self_logit_distillation": cfg.loss == "kd",
        "dflash_loss_objective": "decay",       # the paper's eq. 4 (0.47's default is D-PACE)
        "dflash_loss_decay_factor": cfg.gamma,
        "dflash_report_acc": True,
        "dflash_use_torch_compile": False,      # stored but unused by 0.47; off so no version compiles on CPU
        "dflash_architecture_config": shape,
        # ModelOpt loads it into the draft module right after building it and refuses any tensor mismatch.
        **({"dflash_init_checkpoint": str(init / "model.safetensors")} if init is not None else {}),
    }


def build(cfg: TrainConfig, target_dir: Path, mask_token_id: int, device: torch.device):
    """(converted model on ``device``, the ModelOpt config used). The draft module is float32 (master weights);
    the frozen target is bfloat16 on CUDA, float32 on CPU."""
    check_environment()
    import modelopt.torch.speculative as mtsp
    from transformers import AutoModelForCausalLM

    target_cfg = hf.read_config(target_dir)
    shape = draft_shape(cfg, target_cfg)
    mo_cfg = modelopt_config(cfg, shape, mask_token_id)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).to(device)
    model.config.architectures = model.config.architectures or [type(model).__name__]
    mtsp.convert(model, [("dflash", mo_cfg)])
    model.dflash_module.float()
    if cfg.loss == "kd" and cfg.kd_impl == "fused":
        kd_loss.install(model)
    check_rope(model, shape["rope_parameters"], shape["head_dim"], device)
    return model, mo_cfg


def check_rope(model, rope: dict, head_dim: int, device) -> None:
    """The draft's RoPE frequencies must be the ones its exported config will describe."""
    model.dflash_module._maybe_init_rotary_emb(device=device)
    got = model.dflash_module.rotary_emb.inv_freq.double().cpu()
    want, _ = rope_inv_freq(rope, head_dim, 0)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5):
        raise DFlashError("ModelOpt draft RoPE", f"trains with frequencies of theta != {rope['rope_theta']} "
                          "(this ModelOpt/transformers pair ignores rope_parameters)",
                          f"use nvidia-modelopt=={MODELOPT_TESTED} with transformers 5.14")


def trainable(model) -> list[torch.nn.Parameter]:
    params = [p for p in model.dflash_module.parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("dflash_module.")]
    if frozen:
        raise DFlashError("ModelOpt model", f"target parameter {frozen[0]} is trainable", "the target must stay frozen")
    return params
