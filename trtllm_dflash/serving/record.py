# SPDX-License-Identifier: Apache-2.0
"""One record per request, from a frontend (Triton's model, the OpenAI server) to a runtime and back.

The frontend fills the request fields and calls ``runtime.submit(record)``; the runtime hands updates to
the record's ``handoff`` (handoff.py: one step's updates of all records at once, pushed into each record on
the frontend's thread) or, without one, pushes them itself (``emit``); the frontend reads them with
``get``/``results()`` (a thread) or ``aresults()`` (an asyncio task, as an ASGI app does). The record
buffers what the runtime wrote, so a slow reader never holds up the engine's next step.

The torch runtime emits token ids only: the text is decoded here, on the reader's side, so detokenizing
and stop strings never cost the engine's thread anything. A stop string found here ends the record and
asks the runtime (through the hook it set) to free the slot.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable, Iterator

from ..errors import DFlashError
from .detokenize import TextStream


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Unavailable(DFlashError):
    """``submit`` refused a valid request because the server cannot take it now (shutting down, engine
    broken): HTTP 503 / gRPC UNAVAILABLE rather than a client error."""


@dataclass
class Result:
    """One update of a request: new text and token ids, and on the last update how it ended."""

    text: str = ""                # text generated since the previous update
    token_ids: list[int] = field(default_factory=list)   # token ids generated since the previous update
    finished: bool = False
    finish_reason: str = ""       # stop | length | cancelled (also: the server is shutting down)
    stop_reason: str = ""         # the stop string that ended the request, if any
    num_prompt_tokens: int = 0    # usage, so far: on every update
    num_output_tokens: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_steps: int = 0            # decode steps that committed tokens (acceptance length = tokens / steps)
    times_ns: dict = field(default_factory=dict)  # arrival/first_token/last_token, Unix time in ns
    error: str = ""               # set on a finished Result when the runtime failed the request

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


def merged(updates: list[Result]) -> Result:
    """Consecutive updates of one request as one: their text and token ids in order, the rest (cumulative
    usage, times, how it ended) from the last."""
    if len(updates) == 1:
        return updates[0]
    return replace(updates[-1], text="".join(u.text for u in updates),
                   token_ids=[t for u in updates for t in u.token_ids])


@dataclass(eq=False)
class ServedRequest:
    """A request and its stream of results. ``None`` = not sent: the runtime's default applies."""

    prompt: str | None = None            # text, tokenized by the runtime as is (no chat template) ...
    prompt_ids: list[int] | None = None  # ... or token ids (a frontend that applied a chat template)
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool | None = None
    streaming: bool = False
    echo: bool = False                   # the frontend puts the prompt before the text (the runtime ignores it)
    request_id: str = ""                 # the client's id, for logs and cancellation by id
    cancel_key: str = ""                 # a client that cancels by id must send this too (Triton's cancel_key)
    client: str = ""                     # the client's address as the server saw it (fair admission), "" = unknown
    # Where the runtime hands this record's updates over, once per step for all records that share it
    # (handoff.py); None: each emit wakes this record's own reader (a thread blocked in results()).
    handoff: object = field(default=None, repr=False)
    frontend: object = field(default=None, repr=False)   # the frontend's own state (Triton: request, sender)

    # -- written by the runtime --
    num_prompt_tokens: int = 0
    times_ns: dict = field(default_factory=dict)   # arrival/first_token/last_token, Unix time in ns

    def __post_init__(self):
        self._cond = threading.Condition()
        self._items: deque[Result] = deque()
        self._closed = False              # the final Result was emitted (or made here, on a stop string)
        self._waker: tuple | None = None  # (event loop, asyncio.Event) of an aresults() reader
        self._text: TextStream | None = None
        self._on_stop: Callable[[], None] | None = None
        self.handle: object = None        # the runtime's id of this request, set by submit()

    # -- runtime side --

    def attach_detokenizer(self, tokenizer, on_stop: Callable[[], None]) -> None:
        """Results carry token ids only; decode them (and look for stop strings) on the reader's side.
        ``on_stop`` frees the engine's slot when a stop string ends the text."""
        self._text = TextStream(tokenizer, self.stop)
        self._on_stop = on_stop

    def emit(self, result: Result) -> None:
        """Hand one update to the reader (any thread); ignored once the record is finished. A runtime
        that has many records' updates at once hands them over with ``handoff.hand_over`` instead."""
        if self.handoff is None:
            self.push(result)
        else:
            self.handoff.deliver([(self, result)])

    def push(self, result: Result) -> bool:
        """Queue one update for the reader and wake it. False once the record is finished: ignored.
        Called by ``emit`` or, on the reader's own thread, by a handoff."""
        with self._cond:
            if self._closed:
                return False
            self._closed = result.finished
            self._items.append(result)
            waker, self._waker = self._waker, None
            self._cond.notify_all()
        if waker is not None:
            loop, event = waker
            if _running_loop() is loop:   # a handoff dispatching on the reader's loop: no cross-thread call
                event.set()
                return True
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:      # the reader's loop is closed: nobody is listening any more
                pass
        return True

    def end_for_shutdown(self, why: str) -> None:
        """Emit the final update of a request a drain ends: an error telling its client the server stops
        (the caller then cancels it at the runtime, which frees its slot)."""
        self.emit(Result(finished=True, times_ns=dict(self.times_ns),
                         error=f"server: is shutting down ({why}); the request was cancelled. "
                               "Fix: send it again to a running server"))

    @property
    def finished(self) -> bool:
        """The final Result was emitted (maybe not read yet)."""
        return self._closed

    # -- frontend side --

    def get(self, timeout: float | None = None) -> Result | None:
        """The next update, waiting up to ``timeout`` seconds (None: for ever); None if nothing came."""
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: self._items, timeout):
                return None
            raw = self._items.popleft()
        return self._decode(raw)

    def results(self, timeout: float | None = None) -> Iterator[Result]:
        """Every update until the final one. Raises TimeoutError when nothing comes for ``timeout`` s."""
        while True:
            result = self.get(timeout)
            if result is None:
                raise TimeoutError(f"no result within {timeout} s")
            yield result
            if result.finished:
                return

    async def aresults(self) -> AsyncIterator[Result]:
        """Every update until the final one, for an asyncio reader (one loop, any number of records)."""
        async for batch in self.abatches():
            for result in batch:
                yield result

    async def abatches(self) -> AsyncIterator[list[Result]]:
        """The updates in the order they came, as lists of all that were waiting when the reader got to them: a
        reader that sends one message per list sends fewer, larger ones when it falls behind the engine, so its
        cost per token falls as the load grows instead of the stream lagging further (the final update, if
        waiting, ends its list)."""
        loop = asyncio.get_running_loop()
        while True:
            batch = self.drain()
            if not batch:
                event, wait = asyncio.Event(), False
                with self._cond:
                    if not self._items:
                        self._waker, wait = (loop, event), True
                if wait:
                    await event.wait()
                continue
            done = batch[-1].finished   # read before the reader gets (and may change) the list
            yield batch
            if done:
                return

    def drain(self) -> list[Result]:
        """Every update waiting now, decoded, up to and including a final one (maybe none: [])."""
        out = []
        while not (out and out[-1].finished) and (result := self.get(timeout=0)) is not None:
            out.append(result)
        return out

    def _decode(self, raw: Result) -> Result:
        """Token ids -> text, on the reader's thread (torch runtime); other results pass as they are."""
        if self._text is None or raw.error:
            return raw
        # the raw update is this record's own (made for it by the runtime): filled in place, not copied (a copy
        # per row and step was a tenth of the frontend's time per token)
        if raw.finished:
            raw.text = self._text.finish()
            return raw
        piece = self._text.push(raw.token_ids)
        if not self._text.stopped:
            raw.text = piece
            return raw
        # A stop string ended the text: this is the last result; the engine's own final one is dropped.
        with self._cond:
            self._closed = True
            self._items.clear()
        if self._on_stop is not None:
            self._on_stop()
        return replace(raw, text=piece, finished=True, finish_reason="stop", stop_reason=self._text.stop_reason,
                       times_ns=dict(self.times_ns))
