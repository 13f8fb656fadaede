# SPDX-License-Identifier: Apache-2.0
"""Which token id fills the B-1 "unknown" slots of a DFlash block.

The drafter sees the target's (frozen) embedding row of this id, so the row must be one that never carries
meaning in the drafter's inputs. In order of preference:

  1. the tokenizer's own mask token, if it has one;
  2. the first embedding row past the tokenizer's vocabulary (unused padding rows; z-lab's Qwen3 choice,
     151669, is one);
  3. the last added special token that is none of bos/eos/pad/unk and that the chat template never writes
     (SmolLM2-135M-Instruct: id 16 ``<empty_output>``, a Jupyter marker of its code pretraining that chat
     never uses; its vocabulary of 49152 is full, so 2. has nothing to offer).

Without a tokenizer nothing can be known, so --mask_token_id is required.
"""
from __future__ import annotations

from ..errors import DFlashError


def choose(tokenizer, vocab_size: int, requested: int | None = None) -> tuple[int, str]:
    """(mask_token_id, why) for a target with ``vocab_size`` embedding rows."""
    if requested is not None:
        if not 0 <= requested < vocab_size:
            raise DFlashError("--mask_token_id", f"{requested} is outside the target vocabulary [0, {vocab_size})",
                              "pick an id the target's embedding table has")
        return requested, "given with --mask_token_id"
    if tokenizer is None:
        raise DFlashError("--mask_token_id", "is needed: the target folder has no tokenizer to choose one from",
                          "pass an id whose embedding row never appears in the data, e.g. an unused special token")
    mask = getattr(tokenizer, "mask_token_id", None)
    if isinstance(mask, int) and 0 <= mask < vocab_size:
        return mask, f"the tokenizer's mask token {tokenizer.mask_token!r}"
    if len(tokenizer) < vocab_size:
        return len(tokenizer), f"the first embedding row past the tokenizer's {len(tokenizer)} tokens (unused)"
    taken = {getattr(tokenizer, f"{r}_token_id", None) for r in ("bos", "eos", "pad", "unk")}
    template = str(getattr(tokenizer, "chat_template", "") or "")
    specials = sorted(i for i, tok in tokenizer.added_tokens_decoder.items()
                      if tok.special and i not in taken and i < vocab_size and tok.content not in template)
    if specials:
        i = specials[-1]
        return i, f"special token {tokenizer.convert_ids_to_tokens(i)!r}, which the chat template never writes"
    raise DFlashError("--mask_token_id", "no unused or special token found in the tokenizer",
                      "pass the id of a token that never appears in the data")
