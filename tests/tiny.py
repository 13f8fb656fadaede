# SPDX-License-Identifier: Apache-2.0
"""Tiny random checkpoints in real Hugging Face layouts, written with transformers itself."""
from __future__ import annotations

from pathlib import Path

import torch

from trtllm_dflash.checkpoints.drafter_init import write_random_drafter

VOCAB = 96


def write_tiny_target(out: Path, arch: str = "llama", *, seed: int = 0, tie: bool = False, rope=None,
                      num_layers: int = 4, heads: int = 4, kv_heads: int = 2, hidden: int = 64,
                      vocab: int = VOCAB) -> Path:
    """A small random target saved by transformers' own save_pretrained (safetensors)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                  tie_word_embeddings=tie, eos_token_id=vocab - 2, bos_token_id=1, pad_token_id=0)
    if rope is not None:
        common["rope_parameters"] = rope
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=hidden // heads * 2, **common), transformers.Qwen3ForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg).float()
    with torch.no_grad():  # larger weights than HF's init so logits are peaked and tokens vary
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2 if p.shape[0] != vocab else 0.5)
    model.config.architectures = [cls.__name__]
    model.save_pretrained(out)
    return out


def write_tiny_pair(root: Path, arch: str = "llama", *, block_size: int = 8, drafter_layers: int = 2,
                    target_layer_ids=(0, 2, 3), seed: int = 0, **kw) -> tuple[Path, Path]:
    target = write_tiny_target(root / "target", arch, seed=seed, **kw)
    drafter = write_random_drafter(target, root / "drafter", num_layers=drafter_layers, block_size=block_size,
                                   target_layer_ids=list(target_layer_ids), mask_token_id=kw.get("vocab", VOCAB) - 1,
                                   seed=seed + 1)
    return target, drafter
