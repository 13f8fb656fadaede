# SPDX-License-Identifier: Apache-2.0
"""Incremental detokenization with stop strings: token ids in, text pieces out, such that the pieces
joined are exactly ``tokenizer.decode(all ids)`` (cut before the first stop string)."""
from __future__ import annotations


class TextStream:
    """Turns committed token chunks of one request into text pieces.

    A piece is held back while it ends in an incomplete UTF-8 character (decode gives U+FFFD) or in
    what could be the start of a stop string, so a streamed piece never has to be taken back.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.sent = ""                 # text already handed out
        self.stop_reason = ""          # the stop string that was hit, if any

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, new_ids: list[int]) -> str:
        """Add a chunk of token ids; returns the text that is now safe to send (maybe "")."""
        self.ids.extend(new_ids)
        text = self._decode()
        if self._cut_at_stop(text):
            return self._take(text[:self._stop_at])
        stable = text.rstrip("\ufffd")
        for s in self.stop:            # hold back a tail that a stop string could still complete
            for k in range(min(len(s) - 1, len(stable)), 0, -1):
                if stable.endswith(s[:k]):
                    stable = stable[:-k]
                    break
        return self._take(stable)

    def finish(self) -> str:
        """The rest of the text once the request is done."""
        text = self._decode()
        return self._take(text[:self._stop_at] if self._cut_at_stop(text) else text)

    @property
    def stopped(self) -> bool:
        return bool(self.stop_reason)

    def _cut_at_stop(self, text: str) -> bool:
        if not self.stop_reason:
            # Only the unsent tail can hold a new match (plus the longest stop string's overlap).
            start = max(0, len(self.sent) - max(map(len, self.stop), default=0))
            hits = [(i, s) for s in self.stop if (i := text.find(s, start)) >= 0]
            if hits:
                self._stop_at, self.stop_reason = min(hits)
        return bool(self.stop_reason)

    def _take(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece
