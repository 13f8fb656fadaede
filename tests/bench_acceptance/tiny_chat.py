# SPDX-License-Identifier: Apache-2.0
"""A tiny random Llama *with a chat tokenizer*: byte-level BPE with no merges (every byte one token) plus ChatML
specials, so real text prompts (ShareGPT, HumanEval, MT-Bench) run through the same code paths as SmolLM2."""
from __future__ import annotations

from pathlib import Path

from trtllm_dflash.testing import write_tiny_target

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<empty_output>")  # ids 256..259
VOCAB = 256 + len(SPECIALS)
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenisation emits)
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars)))


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: b for b, c in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def write_tiny_chat_target(out: Path, *, seed: int = 0, num_layers: int = 4) -> Path:
    write_tiny_target(out, "llama", seed=seed, vocab=VOCAB, num_layers=num_layers)
    import json

    cfg = json.loads((out / "config.json").read_text())
    cfg.update(eos_token_id=258, bos_token_id=257, pad_token_id=256)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = out / "generation_config.json"
    if gen.is_file():
        g = json.loads(gen.read_text())
        g.update(eos_token_id=258, bos_token_id=257, pad_token_id=256)
        gen.write_text(json.dumps(g, indent=2))
    write_tokenizer(out)
    return out
