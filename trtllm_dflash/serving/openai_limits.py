# SPDX-License-Identifier: Apache-2.0
"""What dflash-openai bounds before the engine sees a request: its port (before the model loads), the time
a connection may take to send a request, the number of chat messages (before templating), and the
tokens of the templated prompt.

Why: a busy ``--port`` was found only after the model had loaded and measured its step costs (30 s), as
uvicorn's raw "[Errno 98]"; uvicorn keeps a connection that sends nothing, or half a request, open for
good; and 100,000 empty messages (3 MB) were templated and tokenized to 500,025 tokens (2.1 s, +200 MB) before
the prompt bound refused them, since the byte bound counts content and not the template around it.
"""
from __future__ import annotations

import socket

from ..errors import DFlashError


def check_port(host: str, port: int) -> None:
    """``host:port`` is free for a listener (as uvicorn binds it), or a one-line error naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise DFlashError("--port", f"port {port} on {host} is not free ({err.strerror})",
                              "stop what uses it, or pass another --port") from None


def tokens_per_message(tokenizer) -> int:
    """Tokens the chat template adds for each message beyond the first (at least 1): how a message count
    bounds the templated prompt before any templating of the request itself."""
    if not getattr(tokenizer, "chat_template", None):
        return 1

    def n(k: int) -> int:
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": ""} for i in range(k)]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    try:
        return max(1, (n(5) - n(1)) // 4)
    except Exception:            # a template that wants something else: the weakest bound
        return 1


def max_messages(max_seq_len: int | None, per_message: int) -> int | None:
    """The most messages whose template alone can fit ``max_seq_len`` tokens (None: no bound known)."""
    if not max_seq_len:
        return None
    return max(1, max_seq_len // per_message)


def check_message_count(messages, bound: int | None) -> None:
    if bound is not None and isinstance(messages, list) and len(messages) > bound:
        from .openai_server import BadRequest

        raise BadRequest(400, "messages", f"messages has {len(messages)} entries; the chat template alone makes "
                         f"more tokens than this deployment's max_seq_len takes (at most {bound} messages): "
                         "send fewer")


def timed_protocol(request_timeout_s: float):
    """uvicorn's h11 protocol with a bound on the time a request takes to arrive: its head and body must be
    in within ``request_timeout_s`` of the connection opening (the first request) or of its first byte (a
    later one on a keep-alive connection; uvicorn's own ``timeout_keep_alive`` closes idle ones between
    requests), else the connection is closed. uvicorn alone waits for ever."""
    import asyncio

    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._request_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()             # the first byte of a later request on this connection
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
                self._disarm()          # the request is in (or the connection is ending)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._request_timer = self.loop.call_later(request_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _expired(self) -> None:
            self._request_timer = None
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


def reject_unsupported(body: dict, *, chat: bool) -> None:
    """Fields accepted before and silently wrong: ``n`` other than the integer 1 (``true`` and ``1.0`` equal 1
    in Python), ``top_logprobs`` without ``logprobs``, ``tool_choice`` asking for a tool with no tools, and
    ``suffix`` (insertion, which this server does not do)."""
    from .openai_server import BadRequest

    n = body.get("n", 1)
    if n is not None and (type(n) is not int or n != 1):
        raise BadRequest(400, "n", f"only n=1 (an integer) is supported, got {n!r}")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise BadRequest(400, "top_logprobs", "top_logprobs needs logprobs: true (and logprobs are not supported)")
    if body.get("top_logprobs") is not None:
        raise BadRequest(400, "top_logprobs", "logprobs are not supported")
    choice = body.get("tool_choice")
    if chat and choice not in (None, "none", "auto") and not body.get("tools"):
        raise BadRequest(400, "tool_choice", f"tool_choice {choice!r} needs tools (and tool calls are not supported)")
    if body.get("suffix") is not None:
        raise BadRequest(400, "suffix", "suffix (text insertion) is not supported: send the prompt only")
