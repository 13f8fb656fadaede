# SPDX-License-Identifier: Apache-2.0
"""An Engine whose drafter proposes a known continuation: multi-token acceptance made deterministic."""
from __future__ import annotations

import torch

from trtllm_dflash.testing import VOCAB
from trtllm_dflash.runtime.engine import Engine


class OracleEngine(Engine):
    """Drafts ``truth[prompt]`` (the target's own output), changed to a wrong token wherever
    ``wrong(k, j)`` holds for output position k at block position j. Set ``truth`` on a subclass."""

    truth: dict = {}

    def wrong(self, k: int, j: int) -> bool:
        return False

    def _propose(self, last, pos, start, rows, ctx_len, num_drafts):
        n, B = pos.shape
        out = torch.zeros(n, B - 1, dtype=torch.long)   # [n, B-1] drafts
        anchors = start.tolist()   # the device's positions: the host's output_ids lag by the step in flight
        for i in range(n):
            req = self.slots[i]
            if req is None:
                continue
            seq = self.truth[tuple(req.prompt_ids)]
            done = anchors[i] - len(req.prompt_ids) + 1  # output[done-1] is the anchor; the drafts continue from it
            for j in range(B - 1):
                k = done + j
                tok = seq[k] if 0 <= k < len(seq) else 0   # k < 0: a row still prefilling
                out[i, j] = (tok + 1) % VOCAB if self.wrong(k, j) else tok
        return out.to(self.device)


class PeriodicOracle(OracleEngine):
    """The true continuation with a planted error every `period` tokens: exercises multi-token acceptance,
    rejection mid-block and the overwrite of rejected cache rows."""

    period = 5

    def wrong(self, k: int, j: int) -> bool:
        return (k + 1) % self.period == 0
