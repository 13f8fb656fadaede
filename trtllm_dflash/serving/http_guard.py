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
connection. A client that goes away closes its upstream connection, which is how Triton notices a stream
(SSE) whose client left. A non-streaming ``/generate`` is different: Triton 2.51 pauses the HTTP request
until its answer (``evhtp_request_pause`` in ``InferRequestClass``), so it does not see the connection close
and the generation would run to its end. The guard gives each such request an id when it has none and, when
its client leaves before the answer, sends our model's ``stop`` input for that id (and its cancel_key).
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
import uuid
from dataclasses import dataclass

import numpy as np

from ..errors import DFlashError
from .protocol import CANCEL_KEY, INPUT_TYPES, check_json_value, short_repr
from .repo import MODEL_NAME

GENERATE = re.compile(r"^/v2/models/[^/?]+(?:/versions/[^/?]+)?/generate(?:\?.*)?$")
# our model's inference endpoints: their bodies are validated here (Triton 2.51 answers 500 or casts silently)
MODEL_ENDPOINT = re.compile(rf"^/v2/models/{MODEL_NAME}(?:/versions/[^/?]+)?/(generate|generate_stream|infer)"
                            r"(?:\?.*)?$")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
REASONS = {400: "Bad Request", 413: "Payload Too Large", 415: "Unsupported Media Type",
           408: "Request Timeout", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           501: "Not Implemented", 503: "Service Unavailable"}


@dataclass
class GuardLimits:
    max_body_bytes: int = 16 << 20      # well above the largest prompt the model accepts at our max_seq_len
    max_form_bytes: int = 1 << 20       # Triton 2.51 crashes at >= 4 MiB of form body
    max_json_depth: int = 64            # a Triton request is ~5 deep; 50,000 kills 2.51
    max_head_bytes: int = 64 << 10
    max_buffered_bytes: int = 64 << 20  # bodies held by all connections at once (read, not yet relayed)
    # One client (peer address) holds at most one largest body plus 1 MiB of ordinary requests (about a
    # quarter of the total), so slow uploads from one host cannot take the whole budget, and at most this
    # many connections (the CPU soak opens 64 streams from one host).
    max_client_bytes: int = 17 << 20
    max_client_connections: int = 256
    # Seconds a client has to send a request's head and body once its first byte came (nginx's
    # client_header_timeout / client_body_timeout are 60 s, uvicorn's h11 has none): a client that
    # announces 16 MiB and sends one byte holds its share of the budget this long at most.
    read_timeout_s: float = 30.0


class Refused(Exception):
    def __init__(self, status: int, err: DFlashError):
        super().__init__(str(err))
        self.status, self.err = status, err


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


def atoi(text: str) -> int:
    """C's atoi, as Triton reads Inference-Header-Content-Length: leading blanks, a sign, digits; 0 when
    there are none ("abc" is 0, "12abc" is 12)."""
    m = re.match(r"\s*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def json_part(headers: dict[str, str], body: bytes) -> bytes:
    """The bytes Triton parses as JSON: the first Inference-Header-Content-Length bytes of a binary-tensor
    request, else the whole body (Triton takes the whole body when the header is absent, 0 or not a
    number, whatever the Content-Type; a value past the body's end it refuses itself)."""
    n = atoi(headers.get("inference-header-content-length", ""))
    return body[:n] if 0 < n < len(body) else body


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def bracket_depth(data: bytes) -> int:
    """Deepest nesting of [ and { outside JSON strings, whether or not ``data`` is valid JSON: Triton's
    parser recurses as it reads, so an invalid body nested 1,000,000 deep crashes it as a valid one does."""
    steps = _STRING.sub(b"", data).translate(None, _NOT_BRACKET).translate(_BRACKET_STEP)
    if not steps:
        return 0
    return int(np.frombuffer(steps, dtype=np.int8).cumsum(dtype=np.int64).max())


def _strict_json(data: bytes):
    """json.loads without NaN / Infinity (not JSON; Python accepts them, Triton's parser does not)."""
    def constant(name):
        raise ValueError(f"{name} is not a JSON value")
    return json.loads(data, parse_constant=constant)


def drop_header(head: bytes, name: str) -> bytes:
    """``head`` (ending in CRLF CRLF) without its ``name:`` lines."""
    prefix = name.lower().encode() + b":"
    return b"".join(line + b"\r\n" for line in head[:-2].split(b"\r\n")[:-1]
                    if not line.lower().startswith(prefix)) + b"\r\n"


def check_body(target: str, headers: dict[str, str], body: bytes, limits: GuardLimits) -> None:
    """Raise Refused for a body Triton 2.51 would crash on or misread: a big form body, JSON (the part
    Triton parses, whatever the Content-Type) nested too deep, a /generate asked to stream, and for our
    model's generate / infer: a body that is not JSON or a value that does not fit its input's datatype."""
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in FORM_TYPES and len(body) > limits.max_form_bytes:
        raise Refused(415, DFlashError("Content-Type", f"{ctype} bodies over {limits.max_form_bytes} bytes crash "
                                       f"Triton 2.51 (this one has {len(body)})",
                                       "send Content-Type: application/json (curl: -H 'Content-Type: "
                                       "application/json')"))
    part = json_part(headers, body)
    if bracket_depth(part) > limits.max_json_depth:
        raise Refused(400, DFlashError("body", f"JSON nested deeper than {limits.max_json_depth} levels",
                                       "send a flat request such as {\"text_input\": \"...\"}"))
    ours = MODEL_ENDPOINT.match(target)
    if not ours and not GENERATE.match(target):
        return                # other endpoints: Triton answers their errors (with depth bounded)
    try:
        obj = _strict_json(part)
    except ValueError as err:  # invalid UTF-8 or JSON: Triton 2.51 answers 500 to some of them
        if not ours:
            return
        why = "is empty" if not part.strip() else f"is not JSON ({str(err)[:80]})"
        raise Refused(400, DFlashError("body", why, "send a JSON object such as {\"text_input\": \"Hi\"}, "
                                       "UTF-8 encoded")) from None
    if ours and not isinstance(obj, dict):
        raise Refused(400, DFlashError("body", f"is a JSON {type(obj).__name__}, not an object",
                                       "send a JSON object such as {\"text_input\": \"Hi\"}"))
    if ours:
        _check_values(ours.group(1), obj)
    if GENERATE.match(target) and isinstance(obj, dict):
        for key in ("stream", "streaming"):
            if obj.get(key) in (True, [True]):
                raise Refused(400, DFlashError(key, "is true on /generate, which answers once, at the end",
                                               f"POST to {target.split('?')[0]}_stream to stream, or leave "
                                               f"{key} out"))


def cancellable(method: str, target: str, headers: dict[str, str], head: bytes, body: bytes
                ) -> tuple[bytes, bytes, tuple[str, str, str] | None]:
    """(head, body, (path, request id, cancel_key)) of a non-streaming generate of our model with a
    Content-Length body (checked JSON): the id is added when the client sent none, so that a ``stop`` can name
    it. Anything else passes unchanged, with None."""
    ours = MODEL_ENDPOINT.match(target)
    if method != "POST" or not ours or ours.group(1) != "generate" or "content-length" not in headers:
        return head, body, None
    try:
        obj = json.loads(body)
    except ValueError:
        return head, body, None
    if not isinstance(obj, dict):
        return head, body, None
    params = obj.get("parameters") if isinstance(obj.get("parameters"), dict) else {}
    key = params.get(CANCEL_KEY, "")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        rid = obj["id"] = f"guard-{uuid.uuid4().hex}"
        body = json.dumps(obj).encode()
        head = drop_header(head, "content-length")
        head = head[:-2] + f"Content-Length: {len(body)}\r\n\r\n".encode()
    return head, body, (target.split("?")[0], rid, str(key))


def _check_values(endpoint: str, obj: dict) -> None:
    """Each input value of a generate body (``{name: value}``) or an infer body (``{"inputs": [{name,
    datatype, data}]}``; binary data is exact and not looked at) fits its datatype."""
    try:
        if endpoint != "infer":
            for name, value in obj.items():
                check_json_value(name, value)
            return
        inputs = obj.get("inputs")
        if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
            raise DFlashError("inputs", "must be a list of objects", "send {\"inputs\": [{\"name\": ..., "
                              "\"shape\": [1], \"datatype\": ..., \"data\": [...]}]}")
        for item in inputs:
            name = item.get("name")
            want = INPUT_TYPES.get(name) if isinstance(name, str) else None
            if want is not None and item.get("datatype") != want:
                raise DFlashError(name, f"datatype must be {want}, got {short_repr(item.get('datatype'))}",
                                  f"send \"datatype\": \"{want}\"")
            if want is not None and "data" in item:
                check_json_value(name, item["data"])
    except DFlashError as err:
        raise Refused(400, err) from None


class HttpGuard:
    """Listens on ``host:port`` in a thread of its own; relays to ``upstream``: a port on 127.0.0.1, or
    ``unix:PATH``. ``drop_header``: a header removed from every request (the key of Triton's restricted
    APIs, which must open nothing to a client)."""

    def __init__(self, host: str, port: int, upstream: int | str, limits: GuardLimits = GuardLimits(),
                 drop_header: str = ""):
        self.host, self.port, self.upstream, self.limits = host, port, upstream, limits
        self.drop_header = drop_header.lower()
        self.loop = asyncio.new_event_loop()
        self.conns: set[asyncio.Task] = set()
        self.last_output = 0.0          # monotonic time of the last bytes relayed to a client
        self.refused = 0
        self.buffered = 0               # body bytes reserved by connections now (<= max_buffered_bytes)
        self.clients: dict[str, list[int]] = {}   # peer address -> [connections, body bytes reserved]
        self.draining = False           # set when the server stops: new requests get 503
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
        peer = (writer.get_extra_info("peername") or ("?",))[0]
        client = self.clients.setdefault(peer, [0, 0])
        client[0] += 1
        self.conns.add(task)
        upstream = pipe = None
        held = [0, client]              # this connection's share of self.buffered, and its client's tally
        answered = [0.0]                # monotonic time of the last bytes relayed to this client
        pending = None                  # (sent at, (path, id, cancel_key)) of the last non-streaming generate
        try:
            if client[0] > self.limits.max_client_connections:
                await self._refuse(reader, writer, Refused(429, DFlashError(
                    "connections", f"this client ({peer}) has {client[0] - 1} connections open, the bound",
                    "reuse keep-alive connections or close idle ones")))
                return
            while True:
                self._release(held)
                try:
                    head, payload = await self._read_request(reader, writer, held)
                except asyncio.IncompleteReadError:
                    # the client went away (between requests or mid-body); one waiting for a non-streaming
                    # answer gets its request cancelled (Triton would not notice: see the module docstring)
                    if pending is not None and answered[0] < pending[0]:
                        asyncio.ensure_future(self._stop(*pending[1]))
                    return
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
                        upstream = await self._open_upstream()
                    except OSError:
                        await self._answer(writer, 503, str(DFlashError(
                            "server", "tritonserver is not running (restarting or stopping)",
                            "retry in a few seconds")))
                        return
                    pipe = asyncio.create_task(self._relay(upstream[0], writer, answered))
                method, target, pairs = parse_head(head)
                head, payload, handle = cancellable(method, target, dict(pairs), head, payload)
                pending = None if handle is None else (time.monotonic(), handle)
                upstream[1].write(head + payload)
                del payload
                await upstream[1].drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._release(held)
            client[0] -= 1
            if client[0] == 0 and client[1] == 0:
                self.clients.pop(peer, None)
            self.conns.discard(task)
            if pipe is not None:
                pipe.cancel()
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to Triton's HTTP endpoint (OSError if it is not listening)."""
        if isinstance(self.upstream, str):
            return await asyncio.open_unix_connection(self.upstream[5:])
        return await asyncio.open_connection("127.0.0.1", self.upstream)

    async def _relay(self, upstream: asyncio.StreamReader, writer: asyncio.StreamWriter, answered: list) -> None:
        """Triton's answers to the client as they come; Triton closing ends the client's connection."""
        try:
            while data := await upstream.read(65536):
                writer.write(data)
                self.last_output = answered[0] = time.monotonic()
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _stop(self, path: str, request_id: str, cancel_key: str, tries: int = 10) -> None:
        """Our model's ``stop`` for ``request_id``: it ends that request now (the answer is not needed). A
        request its client left at once may not have reached the model yet ("no running request"): tried
        again every 0.2 s, ``tries`` times."""
        body = {"id": request_id, "text_input": "", "stop": True}
        if cancel_key:
            body["parameters"] = {CANCEL_KEY: cancel_key}
        data = json.dumps(body).encode()
        for _ in range(tries):
            try:
                reader, writer = await self._open_upstream()
            except OSError:
                return            # tritonserver is gone: nothing runs any more
            answer = b""
            try:
                writer.write(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
                await writer.drain()
                async with asyncio.timeout(10):
                    while chunk := await reader.read(65536):
                        answer += chunk
            except (OSError, TimeoutError):
                pass
            finally:
                writer.close()
            if b"no running request" not in answer:
                return
            await asyncio.sleep(0.2)

    def _reserve(self, held: list, n: int) -> None:
        """Count ``n`` more body bytes against the guard's memory bound and the client's share of it, or
        refuse the request."""
        client = held[1]
        if client[1] + n > self.limits.max_client_bytes:
            raise Refused(429, DFlashError("body", f"this client holds {client[1]} bytes of request bodies being "
                                           f"sent; {n} more would pass the per-client bound of "
                                           f"{self.limits.max_client_bytes}", "finish or close the other uploads "
                                           "first"))
        if self.buffered + n > self.limits.max_buffered_bytes:
            raise Refused(503, DFlashError("body", f"the server holds {self.buffered} bytes of other requests' "
                                           f"bodies; {n} more would pass its bound of "
                                           f"{self.limits.max_buffered_bytes}", "retry in a moment"))
        self.buffered += n
        held[0] += n
        client[1] += n

    def _release(self, held: list) -> None:
        self.buffered -= held[0]
        held[1][1] -= held[0]
        held[0] = 0

    def accepting(self) -> str:
        """"" while a request with a body of the largest size can be admitted, else why not."""
        if self.draining:
            return "the server is shutting down"
        free = self.limits.max_buffered_bytes - self.buffered
        if free < self.limits.max_body_bytes:
            return (f"request bodies being received hold {self.buffered} of {self.limits.max_buffered_bytes} "
                    "bytes")
        return ""

    async def _read_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            held: list) -> tuple[bytes, bytes]:
        """(head to send upstream, body bytes as received) of one request, checked. ``held``: the body
        bytes this request counts against ``max_buffered_bytes`` (released by the caller). Waiting for a
        request's first byte has no bound (an idle keep-alive connection holds no body bytes, and a
        response may still be streaming on it); the rest must come within ``read_timeout_s``."""
        first = await reader.readexactly(1)
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                return await self._read_rest(first, reader, writer, held)
        except TimeoutError:
            raise Refused(408, DFlashError("request", f"head and body not received within "
                                           f"{self.limits.read_timeout_s:g} s", "send the whole request at once, "
                                           "or raise dflash-serve --read_timeout_s")) from None

    async def _read_rest(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         held: list) -> tuple[bytes, bytes]:
        limits = self.limits
        try:
            head = first + await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise Refused(431, DFlashError("headers", f"request head over {limits.max_head_bytes} bytes",
                                           "send fewer or shorter headers")) from None
        method, target, pairs = parse_head(head)
        headers = dict(pairs)
        if self.draining:
            raise Refused(503, DFlashError("server", "is shutting down", "retry on another replica or later"))
        if method == "GET" and target.split("?")[0] == "/v2/health/ready" and (why := self.accepting()):
            raise Refused(503, DFlashError("server", f"not ready: {why}", "retry in a moment"))
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise Refused(415, DFlashError("Content-Encoding", f"{headers['content-encoding'][:40]!r}: Triton "
                                           "would inflate the body past the guard's checks", "send the body "
                                           "uncompressed"))
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
            head = drop_header(head, "expect")
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.drop_header and self.drop_header in headers:
            head = drop_header(head, self.drop_header)
        if te:
            raw, body = await self._read_chunked(reader, held)
        else:
            raw = body = await reader.readexactly(int(length))
        if len(body) > 65536:      # parse big bodies off the loop so other connections keep moving
            await asyncio.to_thread(check_body, target, headers, body, limits)
        else:                      # an empty body too: Triton 2.51 answers 500 to one on /generate
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
