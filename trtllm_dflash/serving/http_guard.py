# SPDX-License-Identifier: Apache-2.0
"""A small HTTP/1.1 guard in front of Triton's HTTP port (dflash-serve ``--http_guard``).

Why: the tritonserver that nvidia-pytriton 0.7.0 bundles (Triton 2.51) dies with SIGSEGV on a POST of
>= 4 MiB sent as ``application/x-www-form-urlencoded`` and on JSON nested ~50,000 deep, before our model
sees the request, and 2.51 has no option to cap a request's size (``tritonserver --help``). Every client's
request dies with it. The guard listens on the user's ``--http_port``, Triton on an internal loopback port.
For each request it reads the head, then the body (bounded), and answers itself, with one line naming the
field and the fix, when:

* the head is over ``max_head_bytes`` (431), the framing is bad (400) or the body is over
  ``max_body_bytes`` (413, from Content-Length before reading it, or while reading chunks);
* a form body (urlencoded / multipart) is over ``max_form_bytes`` (415): the type Triton 2.51 mis-handles;
* the JSON (the whole body, or its first Inference-Header-Content-Length bytes) is nested deeper than
  ``max_json_depth`` (400);
* ``/generate`` (not ``/generate_stream``) is asked to stream (400): Triton would run the whole
  generation and then answer 200 with an error body.

Everything else goes to Triton byte for byte (the guard drops only an ``Expect: 100-continue`` line, which
it answers itself since it reads the body first) over one upstream connection per client connection, and
the answer comes back as Triton sends it, so SSE keeps streaming and keep-alive clients keep their
connection. A client that goes away closes its upstream connection, which is how Triton notices it today.
Memory: at most one head and one body per connection in flight, and ``max_buffered_bytes`` of bodies
over all connections together (beyond it a request gets 503, retry).
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from dataclasses import dataclass

from ..errors import DFlashError

GENERATE = re.compile(r"^/v2/models/[^/?]+(?:/versions/[^/?]+)?/generate(?:\?.*)?$")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
REASONS = {400: "Bad Request", 413: "Payload Too Large", 415: "Unsupported Media Type",
           431: "Request Header Fields Too Large", 501: "Not Implemented", 503: "Service Unavailable"}


@dataclass
class GuardLimits:
    max_body_bytes: int = 16 << 20      # well above the largest prompt the model accepts at our max_seq_len
    max_form_bytes: int = 1 << 20       # Triton 2.51 crashes at >= 4 MiB of form body
    max_json_depth: int = 64            # a Triton request is ~5 deep; 50,000 kills 2.51
    max_head_bytes: int = 64 << 10
    max_buffered_bytes: int = 64 << 20  # bodies held by all connections at once (read, not yet relayed)


class Refused(Exception):
    def __init__(self, status: int, err: DFlashError):
        super().__init__(str(err))
        self.status, self.err = status, err


def json_depth(obj) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), without recursion."""
    depth, stack = 0, [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            depth = max(depth, d)
            stack.extend((child, d + 1) for child in (node.values() if isinstance(node, dict) else node))
    return depth


def parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """(method, target, [(lower-case name, value)]) of a request head ending in CRLF CRLF."""
    lines = head[:-4].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, DFlashError("request line", f"{lines[0][:80]!r} is not an HTTP/1.x request line",
                                       "send METHOD PATH HTTP/1.1"))
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise Refused(400, DFlashError("headers", f"{line[:80]!r} is not a header line", "send Name: value"))
        headers.append((name.lower(), value.strip()))
    return parts[0], parts[1], headers


def check_body(target: str, headers: dict[str, str], body: bytes, limits: GuardLimits) -> None:
    """Raise Refused for JSON nested too deep or a /generate asked to stream (the parsed body is checked
    where it is JSON; anything else is Triton's to answer)."""
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in FORM_TYPES and len(body) > limits.max_form_bytes:
        raise Refused(415, DFlashError("Content-Type", f"{ctype} bodies over {limits.max_form_bytes} bytes crash "
                                       f"Triton 2.51 (this one has {len(body)})",
                                       "send Content-Type: application/json (curl: -H 'Content-Type: "
                                       "application/json')"))
    part = body
    if "inference-header-content-length" in headers:
        try:
            part = body[:int(headers["inference-header-content-length"])]
        except ValueError:
            return        # Triton answers its own header's errors
    elif ctype == "application/octet-stream":
        return
    if not part.lstrip()[:1] in (b"{", b"["):
        return
    try:
        obj = json.loads(part)
    except RecursionError:
        obj = None
    except ValueError:
        return            # not JSON: Triton's own 400 says where
    if obj is None or json_depth(obj) > limits.max_json_depth:
        raise Refused(400, DFlashError("body", f"JSON nested deeper than {limits.max_json_depth} levels",
                                       "send a flat request such as {\"text_input\": \"...\"}"))
    if GENERATE.match(target) and isinstance(obj, dict):
        for key in ("stream", "streaming"):
            if obj.get(key) in (True, [True]):
                raise Refused(400, DFlashError(key, "is true on /generate, which answers once, at the end",
                                               f"POST to {target.split('?')[0]}_stream to stream, or leave "
                                               f"{key} out"))


class HttpGuard:
    """Listens on ``host:port`` in a thread of its own; relays to ``127.0.0.1:upstream_port``."""

    def __init__(self, host: str, port: int, upstream_port: int, limits: GuardLimits = GuardLimits()):
        self.host, self.port, self.upstream_port, self.limits = host, port, upstream_port, limits
        self.loop = asyncio.new_event_loop()
        self.conns: set[asyncio.Task] = set()
        self.last_output = 0.0          # monotonic time of the last bytes relayed to a client
        self.refused = 0
        self.buffered = 0               # body bytes reserved by connections now (<= max_buffered_bytes)
        self._server = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="http-guard", daemon=True)

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as err:
            sock.close()
            raise DFlashError("--http_port", f"port {self.port} on {self.host} is not free ({err.strerror})",
                              "stop what uses it, or pass another --http_port") from None
        sock.listen(256)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, sock=sock, limit=self.limits.max_head_bytes), self.loop).result()

    def close_connections(self, quiet_s: float = 0.2, timeout: float = 2.0) -> int:
        """Close every client connection (and so its upstream one) once no bytes went to a client for
        ``quiet_s`` (the final responses of a drain are out) or after ``timeout``; the number closed.
        Triton 2.51 waits for its HTTP connections on exit, which used up its exit timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self.last_output < quiet_s:
            time.sleep(0.05)

        async def cancel() -> int:
            tasks = list(self.conns)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return len(tasks)
        return asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(timeout=10)

    def stop(self) -> None:
        if self._server is not None:
            self.loop.call_soon_threadsafe(self._server.close)
            self.close_connections(timeout=0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.conns.add(task)
        upstream = pipe = None
        held = [0]                      # this connection's share of self.buffered
        try:
            while True:
                self.buffered -= held[0]
                held[0] = 0
                try:
                    head, payload = await self._read_request(reader, writer, held)
                except asyncio.IncompleteReadError:
                    return        # the client went away (between requests or mid-body)
                except asyncio.LimitOverrunError:
                    err = Refused(400, DFlashError("body", "a chunk line over the head bound", "send a valid "
                                                   "chunked body"))
                    await self._refuse(reader, writer, err)
                    return
                except Refused as err:
                    await self._refuse(reader, writer, err)
                    return        # the rest of a refused request is unread: this connection cannot go on
                if upstream is None or pipe.done():
                    try:
                        upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                    except OSError:
                        await self._answer(writer, 503, str(DFlashError(
                            "server", "tritonserver is not running (restarting or stopping)",
                            "retry in a few seconds")))
                        return
                    pipe = asyncio.create_task(self._relay(upstream[0], writer))
                upstream[1].write(head + payload)
                del payload
                await upstream[1].drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.buffered -= held[0]
            self.conns.discard(task)
            if pipe is not None:
                pipe.cancel()
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()

    async def _relay(self, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Triton's answers to the client as they come; Triton closing ends the client's connection."""
        try:
            while data := await upstream.read(65536):
                writer.write(data)
                self.last_output = time.monotonic()
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _reserve(self, held: list[int], n: int) -> None:
        """Count ``n`` more body bytes against the guard's memory bound, or refuse the request."""
        if self.buffered + n > self.limits.max_buffered_bytes:
            raise Refused(503, DFlashError("body", f"the server holds {self.buffered} bytes of other requests' "
                                           f"bodies; {n} more would pass its bound of "
                                           f"{self.limits.max_buffered_bytes}", "retry in a moment"))
        self.buffered += n
        held[0] += n

    async def _read_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            held: list[int]) -> tuple[bytes, bytes]:
        """(head to send upstream, body bytes as received) of one request, checked. ``held``: the body
        bytes this request counts against ``max_buffered_bytes`` (released by the caller)."""
        limits = self.limits
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise Refused(431, DFlashError("headers", f"request head over {limits.max_head_bytes} bytes",
                                           "send fewer or shorter headers")) from None
        _, target, pairs = parse_head(head)
        headers = dict(pairs)
        te = headers.get("transfer-encoding", "").lower()
        if te and te != "chunked":
            raise Refused(501, DFlashError("Transfer-Encoding", f"{te!r} is not supported", "send chunked or "
                                           "Content-Length"))
        if te and "content-length" in headers:
            raise Refused(400, DFlashError("Content-Length", "given with Transfer-Encoding: chunked",
                                           "send one of them"))
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise Refused(400, DFlashError("Content-Length", f"{length[:40]!r} is not a byte count",
                                           "send a non-negative integer"))
        if int(length) > limits.max_body_bytes:
            raise Refused(413, self._too_large(int(length)))
        self._reserve(held, int(length))
        if "expect" in headers:
            if headers["expect"].lower() != "100-continue":
                raise Refused(400, DFlashError("Expect", f"{headers['expect'][:40]!r} is not supported",
                                               "send Expect: 100-continue or none"))
            head = b"".join(line + b"\r\n" for line in head[:-2].split(b"\r\n")[:-1]
                            if not line.lower().startswith(b"expect:")) + b"\r\n"
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if te:
            raw, body = await self._read_chunked(reader, held)
        else:
            raw = body = await reader.readexactly(int(length))
        if body:
            if len(body) > 65536:      # parse big bodies off the loop so other connections keep moving
                await asyncio.to_thread(check_body, target, headers, body, limits)
            else:
                check_body(target, headers, body, limits)
        return head, raw

    async def _read_chunked(self, reader: asyncio.StreamReader, held: list[int]) -> tuple[bytes, bytes]:
        raw, body = bytearray(), bytearray()
        while True:
            line = await reader.readuntil(b"\r\n")
            raw += line
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise Refused(400, DFlashError("body", f"chunk size line {line[:40]!r} is not hex",
                                               "send a valid chunked body")) from None
            if len(body) + size > self.limits.max_body_bytes:
                raise Refused(413, self._too_large(len(body) + size))
            self._reserve(held, 2 * size + len(line))     # raw and decoded copies
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    raw += trailer
                raw += b"\r\n"
                return bytes(raw), bytes(body)
            chunk = await reader.readexactly(size + 2)
            raw += chunk
            body += chunk[:-2]

    def _too_large(self, size: int) -> DFlashError:
        return DFlashError("body", f"{size} bytes is over the bound of {self.limits.max_body_bytes} bytes",
                           "send a shorter prompt (the model's own limit is far lower), or raise dflash-serve "
                           "--max_body_bytes")

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, err: Refused) -> None:
        self.refused += 1
        await self._answer(writer, err.status, str(err.err))
        # Read (and drop) what the client still sends, for a moment: closing a socket with unread input
        # resets the connection, and the client may then never read the answer.
        try:
            writer.write_eof()
            await asyncio.wait_for(self._discard(reader), 2.0)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass

    async def _answer(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        writer.write(f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        try:
            await writer.drain()
        except ConnectionError:
            pass
