# SPDX-License-Identifier: Apache-2.0
"""One request as the engine tracks it: prompt, sampling settings, committed output, prefill progress."""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import RequestStats, SamplingParams

_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    on_tokens: Callable[["Sequence", list[int]], None] | None = None
    request_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled"
    slot: int = -1
    num_prefilled: int = 0            # prompt tokens already in the KV cache (chunked prefill progress)
    stop_ids: frozenset[int] | None = None  # the request's stop tokens (EOS included), set on first use
    t_arrival: float = field(default_factory=time.perf_counter)
    client: str = ""                  # who sent it (a server's peer address): admission is fair between clients
    done_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def decoding(self) -> bool:
        """Prompt fully in the cache: the request takes part in draft + verify steps."""
        return self.num_prefilled == len(self.prompt_ids) and not self.done

