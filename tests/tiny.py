# SPDX-License-Identifier: Apache-2.0
"""Tiny random checkpoints in real Hugging Face layouts, written with transformers itself."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.checkpoints.drafter_init import write_random_drafter

VOCAB = 96
GPT_OSS_WINDOW = 8  # tiny gpt-oss sliding window: prompts of 30 tokens cross it


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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def write_tiny_pair_with_tokenizer(root: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    """(target, drafter): a 2-layer random Llama with the vocabulary and tokenizer of ``tokenizer_dir`` (SmolLM2's:
    text works and a server takes seconds), plus an untrained 1-layer drafter (greedy output = the target's)."""
    import shutil

    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    target = write_tiny_target(root / "target", num_layers=2, vocab=vocab)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    drafter = write_random_drafter(target, root / "drafter", num_layers=1, block_size=8, target_layer_ids=[0, 1],
                                   mask_token_id=vocab - 1, seed=1)
    return target, drafter


def write_tiny_gpt_oss(out: Path, *, heads=4, kv_heads=2, intermediate=64, mxfp4=False, seed=0) -> Path:
    """A random 4-layer GptOssForCausalLM (sliding window 8 / full alternating, 4 experts top-2, YaRN) saved by
    transformers. mxfp4=True stores the experts as MXFP4 blocks/scales instead, with the HF reference weights
    being transformers' own dequantisation of them (so the MXFP4 layout is checked against transformers)."""
    import transformers
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=4, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=GPT_OSS_WINDOW, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=VOCAB - 2, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(seed)
    blocks = {}
    with torch.no_grad():  # larger than HF's init: peaked logits, varied routing, sinks that matter
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() < 2 or "router" in name else 0.2))
        if mxfp4:
            for i, layer in enumerate(model.model.layers):
                for proj, rows, cols in (("gate_up_proj", 2 * intermediate, 64), ("down_proj", 64, intermediate)):
                    b = torch.randint(0, 256, (4, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
                    s = torch.randint(121, 124, (4, rows, cols // 32), dtype=torch.uint8, generator=g)
                    getattr(layer.mlp.experts, proj).copy_(convert_moe_packed_tensors(b, s, dtype=torch.float32))
                    blocks[f"model.layers.{i}.mlp.experts.{proj}"] = (b, s)
    model.config.architectures = ["GptOssForCausalLM"]
    model.save_pretrained(out / "hf")
    if not mxfp4:
        return out / "hf"
    q = out / "mxfp4"  # the published layout: experts as *_blocks + *_scales, quantization_config mxfp4
    q.mkdir()
    sd = load_file(str(out / "hf" / "model.safetensors"))
    for name, (b, s) in blocks.items():
        del sd[name]
        sd[name + "_blocks"], sd[name + "_scales"] = b, s
    save_file(sd, str(q / "model.safetensors"))
    c = json.loads((out / "hf" / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (q / "config.json").write_text(json.dumps(c))
    return q


def write_gpt_oss_drafter(target: Path, out: Path, *, block_size=8, seed=1) -> Path:
    """A random drafter shaped like z-lab's gpt-oss ones: model_type gpt_oss, attention_bias (q/k/v/o biases),
    no rope_scaling in config.json (so the gpt-oss YaRN default applies)."""
    d = write_random_drafter(target, out, num_layers=2, block_size=block_size, target_layer_ids=[0, 2, 3],
                             mask_token_id=VOCAB - 1, seed=seed)
    c = json.loads((d / "config.json").read_text())
    c.pop("rope_parameters", None)
    c.update(model_type="gpt_oss", attention_bias=True, rope_theta=150000)
    (d / "config.json").write_text(json.dumps(c))
    sd = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for i in range(2):
        for p in "qkvo":
            w = sd[f"layers.{i}.self_attn.{p}_proj.weight"]
            sd[f"layers.{i}.self_attn.{p}_proj.bias"] = torch.randn(w.shape[0], generator=g) * 0.1
    save_file(sd, str(d / "model.safetensors"))
    return d
