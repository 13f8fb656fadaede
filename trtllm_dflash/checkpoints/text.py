# SPDX-License-Identifier: Apache-2.0
"""What a Hugging Face checkpoint folder says about text: its tokenizer and its stop ids. Apart from the
weights (hf.py): a server's frontend needs these and no tensor.
"""
from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path: str | Path):
    """The folder's tokenizer, or None for a weights-only folder (token-id requests still work)."""
    path = Path(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def eos_ids(path: str | Path, cfg: dict, tokenizer) -> set[int]:
    """Stop ids from config.json (``cfg``), generation_config.json and the tokenizer (all of them count)."""
    ids: set[int] = set()
    sources = [cfg.get("eos_token_id")]
    gen = Path(path) / "generation_config.json"
    if gen.is_file():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    if tokenizer is not None:
        sources.append(tokenizer.eos_token_id)
    for s in sources:
        ids.update(s if isinstance(s, list) else [s] if s is not None else [])
    return ids
