# SPDX-License-Identifier: Apache-2.0
"""Incremental detokenization with stop strings: token ids in, text pieces out, such that the pieces
joined are ``tokenizer.decode(all ids)`` (cut before the first stop string), at a cost per update that
does not grow with the length of the text.

Offsets as in vLLM's incremental detokenizer (``vllm/transformers_utils/detokenizer_utils.py``,
``detokenize_incrementally``): only the window ``ids[prefix_offset:]`` is decoded; the text of
``ids[prefix_offset:read_offset]`` (already handed out) is cut from its front. The window starts a few
tokens back (``CONTEXT``) because a token's text can depend on the one before it (SentencePiece's leading
space, byte-level BPE's multi-byte characters). A window that ends in an incomplete UTF-8 character (the
decode ends in U+FFFD) is held until the next tokens complete it.

A fast (Rust) tokenizer that does not clean up spaces after decoding goes through ``tokenizers``'
``DecodeStream`` instead, one Rust call per token with the same prefix/read offsets inside (what vLLM V1's
``FastIncrementalDetokenizer`` does): a few microseconds per token, where each windowed ``decode`` costs ~8 µs
of Python. The window path remains for the others, and for the tail of a request that ends mid-character.
"""
from __future__ import annotations

CONTEXT = 5   # tokens decoded again before the new ones (vLLM: INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5)


class TextStream:
    """Turns committed token chunks of one request into text pieces.

    A piece is held back while it ends in an incomplete UTF-8 character or in what could be the start of
    a stop string, so a streamed piece never has to be taken back.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.longest_stop = max(map(len, stop), default=0)
        self.ids: list[int] = []
        self.prefix_offset = 0          # the window decoded on the next update starts here ...
        self.read_offset = 0            # ... and its text up to this token is already in self.text
        self.text = ""                  # decoded text with complete characters only
        self.sent = 0                   # characters of self.text already handed out
        self.stop_reason = ""           # the stop string that was hit, if any
        self._stop_at = 0
        self._stream = _decode_stream(tokenizer)
        self._fed = 0                   # ids given to the stream so far

    def _step_stream(self) -> None:
        fast = self.tokenizer._tokenizer
        for i in range(self._fed, len(self.ids)):
            piece = self._stream.step(fast, self.ids[i])
            if piece is not None:       # None: an incomplete character, held by the stream
                self.text += piece
                self.read_offset = i + 1
        self._fed = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - CONTEXT)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self, final: bool) -> None:
        """Decode the new tokens into self.text; unless ``final``, not while they end mid-character."""
        if self.read_offset == len(self.ids):
            return
        if self._stream is not None and not final:
            return self._step_stream()
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        window = self._decode(self.ids[self.prefix_offset:])
        if not final and (window.endswith("\ufffd") or len(window) <= len(prefix)):
            return                       # incomplete character (or no text yet): wait for more tokens
        self.text += window[len(prefix):]
        # The next window keeps CONTEXT tokens before the new ones.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.prefix_offset, self.read_offset - CONTEXT)

    def push(self, new_ids: list[int]) -> str:
        """Add a chunk of token ids; returns the text that is now safe to send (maybe "")."""
        self.ids.extend(new_ids)
        if self.stopped:
            return ""
        self._advance(final=False)
        if self._cut_at_stop():
            return self._take(self._stop_at)
        end = len(self.text)
        for s in self.stop:              # hold back a tail that a stop string could still complete
            for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                if self.text.endswith(s[:k], 0, end):
                    end -= k
                    break
        return self._take(end)

    def finish(self) -> str:
        """The rest of the text once the request is done."""
        if not self.stopped:
            self._advance(final=True)
        return self._take(self._stop_at if self._cut_at_stop() else len(self.text))

    @property
    def stopped(self) -> bool:
        return bool(self.stop_reason)

    def _cut_at_stop(self) -> bool:
        if not self.stop_reason and self.stop:
            # Only the unsent tail can hold a new match (plus the longest stop string's overlap).
            start = max(0, self.sent - self.longest_stop)
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                self._stop_at, self.stop_reason = min(hits)
        return bool(self.stop_reason)

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:end], end
        return piece


def _decode_stream(tokenizer):
    """A ``tokenizers.decoders.DecodeStream`` for a fast tokenizer whose decode adds no clean-up of spaces
    (``DecodeStream`` does none); None for any other tokenizer."""
    if not hasattr(tokenizer, "_tokenizer") or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:   # tokenizers < 0.21
        return None
    return DecodeStream(skip_special_tokens=True)
