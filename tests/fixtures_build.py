# SPDX-License-Identifier: Apache-2.0
"""Tiny stand-in checkpoints for dflash-build tests: random targets of every preset architecture
(Llama, Qwen3, GptOss, saved by transformers' own save_pretrained) and their drafters in each known format."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.testing import VOCAB, write_tiny_target
from trtllm_dflash.checkpoints.drafter_init import write_random_drafter

ARCHS = ("llama", "qwen3", "gpt_oss")


def write_tiny_gpt_oss(out: Path, *, seed: int = 0) -> Path:
    """A 4-layer GptOssForCausalLM with 8 experts and 8 heads / 8 KV heads (so tp 8 and ep 4/8 divide)."""
    import transformers

    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=8, head_dim=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2, tie_word_embeddings=False,
        eos_token_id=VOCAB - 2, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).float()
    model.config.architectures = ["GptOssForCausalLM"]
    model.save_pretrained(out)
    return out


def write_target(out: Path, arch: str, **kw) -> Path:
    if arch == "gpt_oss":
        return write_tiny_gpt_oss(out, **kw)
    if arch == "qwen3":
        # 8 heads / 8 KV heads so a tp 8 stand-in divides as well as tp 1 and 2.
        return write_tiny_target(out, "qwen3", heads=8, kv_heads=8, **kw)
    return write_tiny_target(out, arch, **kw)


def write_zlab(target: Path, out: Path, *, block_size: int = 16, layers: int = 2, ids=(0, 2, 3), seed: int = 1) -> Path:
    return write_random_drafter(target, out, num_layers=layers, block_size=block_size, target_layer_ids=list(ids),
                                mask_token_id=VOCAB - 1, seed=seed)


def _read(d: Path) -> tuple[dict, dict]:
    return json.loads((d / "config.json").read_text()), load_file(str(d / "model.safetensors"))


def _write(out: Path, cfg: dict, sd: dict, extra: dict | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(out / "model.safetensors"))
    for name, text in (extra or {}).items():
        (out / name).write_text(text)
    return out


def to_modelopt(zlab: Path, out: Path) -> Path:
    """ModelOpt export_speculative_decoding: the z-lab config plus dflash_config.causal."""
    cfg, sd = _read(zlab)
    cfg["dflash_config"]["causal"] = False
    cfg.pop("dflash_trained", None)
    return _write(out, cfg, sd)


def _target_tensors(target: Path) -> dict:
    sd = load_file(str(target / "model.safetensors"))
    lm_head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return {"embed_tokens.weight": sd["model.embed_tokens.weight"], "lm_head.weight": lm_head,
            "verifier_lm_head.weight": lm_head, "verifier_norm.weight": sd["model.norm.weight"]}


def to_speculators(zlab: Path, target: Path, out: Path, *, own_lm_head: bool = False,
                   draft_vocab: int | None = None) -> Path:
    """vLLM speculators: transformer_layer_config, aux ids = z-lab ids + 1, copies of the target's tensors."""
    cfg, sd = _read(zlab)
    dflash = cfg.pop("dflash_config")
    layer_cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "block_size", "num_target_layers",
                                                           "dflash_trained")}
    spec_cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
                "transformer_layer_config": layer_cfg, "draft_vocab_size": draft_vocab or cfg["vocab_size"],
                "block_size": cfg["block_size"], "mask_token_id": dflash["mask_token_id"],
                "aux_hidden_state_layer_ids": [i + 1 for i in dflash["target_layer_ids"]],
                "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                       "verifier": {"name_or_path": str(target)}}}
    sd.update(_target_tensors(target))
    sd["d2t"] = torch.zeros(cfg["vocab_size"], dtype=torch.long)
    sd["t2d"] = torch.ones(cfg["vocab_size"], dtype=torch.bool)
    if own_lm_head:
        sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    return _write(out, spec_cfg, sd)


def to_specforge(zlab: Path, target: Path, out: Path) -> Path:
    """SpecForge train_dflash.py: the target's config (its model_type) + dflash fields, optimizer pickle."""
    cfg, sd = _read(zlab)
    tcfg = json.loads((target / "config.json").read_text())
    sf = {**tcfg, "architectures": ["DFlashDraftModel"], "num_hidden_layers": cfg["num_hidden_layers"],
          "block_size": cfg["block_size"], "num_target_layers": tcfg["num_hidden_layers"],
          "dflash_config": cfg["dflash_config"], "head_dim": cfg["head_dim"], "attention_bias": False,
          "num_key_value_heads": cfg["num_key_value_heads"]}
    _write(out, sf, sd, {"dflash.py": "# SpecForge modeling file (copied by train_dflash.py)\n"})
    torch.save({"epoch": 1, "global_step": 10}, out / "training_state.pt")
    return out


def write_drafter(fmt: str, target: Path, root: Path, **kw) -> Path:
    """A tiny drafter for ``target`` in format ``fmt`` (z-lab, modelopt, speculators, specforge)."""
    zlab = write_zlab(target, root / "zlab", **kw)
    if fmt == "z-lab":
        return zlab
    if fmt == "modelopt":
        return to_modelopt(zlab, root / "modelopt")
    if fmt == "speculators":
        return to_speculators(zlab, target, root / "speculators")
    if fmt == "specforge":
        return to_specforge(zlab, target, root / "specforge")
    raise ValueError(fmt)
