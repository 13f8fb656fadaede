# SPDX-License-Identifier: Apache-2.0
"""How one engine step's updates reach the frontends: once per step, not once per request.

The runtime's scheduler thread collects the step's updates (``(record, Result)`` pairs) and calls
``hand_over(updates)``: one ``deliver`` per handoff, i.e. one cross-thread wake-up per step for all the
rows of that frontend, whatever the batch size. The frontend's own thread then queues each update on its
record (``ServedRequest.push``) and decodes it there, so detokenization never runs on the engine's thread.

``LoopHandoff``   an asyncio frontend (dflash-openai): one ``call_soon_threadsafe`` per step
A record without a handoff (a thread blocked in ``results()``) is woken by its own ``push``.
Triton's model has its own: one sender thread fed by a queue (triton_model.py).
"""
from __future__ import annotations

import asyncio


def hand_over(updates: list) -> None:
    """Deliver one step's ``(record, Result)`` updates: one ``deliver`` per handoff, in step order."""
    by_handoff: dict[object, list] = {}
    for update in updates:
        by_handoff.setdefault(update[0].handoff, []).append(update)
    for handoff, items in by_handoff.items():
        if handoff is None:
            for record, result in items:
                record.push(result)
        else:
            handoff.deliver(items)


class LoopHandoff:
    """Updates for records read by ``aresults()`` on one asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def deliver(self, updates: list) -> None:
        try:
            self.loop.call_soon_threadsafe(self._dispatch, updates)
        except RuntimeError:      # the loop is closed: nobody is listening any more
            pass

    def after(self, callback) -> None:
        """Run ``callback`` on the loop once what was delivered before it is dispatched (the loop's FIFO order)."""
        try:
            self.loop.call_soon_threadsafe(callback)
        except RuntimeError:      # the loop is closed
            callback()

    @staticmethod
    def _dispatch(updates: list) -> None:
        for record, result in updates:
            record.push(result)
