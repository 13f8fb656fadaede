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

h11 parses each request once (serving/http_request.py); what goes to Triton is a request the guard wrote:
origin-form target, the end-to-end headers, the checked body with a Content-Length (never chunked, never
``Expect``), over one upstream connection per client connection. Triton's answer is parsed by h11 too and
re-framed for the client as it comes, so SSE keeps streaming and keep-alive clients keep their connection.
A client that goes away closes its upstream connection, which is how Triton notices a stream (SSE) whose
client left. A non-streaming ``/generate`` is different: Triton 2.51 pauses the HTTP request until its
answer (``evhtp_request_pause`` in ``InferRequestClass``), so it does not see the connection close and the
generation would run to its end. The guard gives each such request an id when it has none and, when its
client leaves before the answer, sends our model's ``stop`` input for that id (and its cancel_key).

Bounds: body bytes as received, ``max_client_bytes`` per client address and ``max_buffered_bytes`` over all
(beyond them 429 / 503, retry); a request's first byte within ``idle_timeout_s``, its head and body within
``read_timeout_s`` of that; ``max_client_connections`` per address, where a new connection closes the
address's longest-idle one rather than being refused (1,000 idle keep-alive connections must not lock their
own address out of /v2/health/ready).
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import h11
import numpy as np

from ..errors import DFlashError
from .http_request import BadTarget, Request, from_h11, upstream_headers
from .protocol import CANCEL_KEY, CLIENT_HEADER, INPUT_TYPES, check_json_value, short_repr
from .repo import MODEL_NAME
from .restricted import FIX, HTTP_PATHS, WHY

GENERATE = re.compile(r"^/v2/models/[^/?]+(?:/versions/[^/?]+)?/generate(?:\?.*)?$")
# our model's inference endpoints: their bodies are validated here (Triton 2.51 answers 500 or casts silently)
MODEL_ENDPOINT = re.compile(rf"^/v2/models/{MODEL_NAME}(?:/versions/[^/?]+)?/(generate|generate_stream|infer)"
                            r"(?:\?.*)?$")
INFER = re.compile(r"^/v2/models/[^/?]+(?:/versions/[^/?]+)?/infer(?:\?.*)?$")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large", 415: "Unsupported Media Type",
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
    # Seconds a connection may wait for a request's first byte (a new one, or a keep-alive one between
    # requests; nginx's keepalive_timeout is 75 s): then it is closed without an answer.
    idle_timeout_s: float = 60.0


class Refused(Exception):
    def __init__(self, status: int, err: DFlashError):
        super().__init__(str(err))
        self.status, self.err = status, err


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
    # Triton reads Inference-Header-Content-Length on infer only; generate and the rest parse the whole body
    part = json_part(headers, body) if INFER.match(target) else body
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
        if ours.group(1) == "infer" and CLIENT_HEADER in (obj.get("parameters") or {}):
            # on generate the guard replaces it; on infer Triton takes it from the header the guard sets
            raise Refused(400, DFlashError(f"parameters.{CLIENT_HEADER}", "is set by the server",
                                           f"leave {CLIENT_HEADER} out"))
    if GENERATE.match(target) and isinstance(obj, dict):
        for key in ("stream", "streaming"):
            if obj.get(key) in (True, [True]):
                raise Refused(400, DFlashError(key, "is true on /generate, which answers once, at the end",
                                               f"POST to {target.split('?')[0]}_stream to stream, or leave "
                                               f"{key} out"))


def rewrite_body(method: str, target: str, body: bytes, peer: str = "") -> tuple[bytes, tuple[str, str, str] | None]:
    """The body a generate of our model (checked JSON) goes upstream with, and for a non-streaming one the
    (path, request id, cancel_key) a ``stop`` can name it by. The guard says who sent it: ``parameters``
    gets CLIENT_HEADER = ``peer`` (the engine's admission is fair between clients; a client's own value is
    replaced), and a non-streaming one gets an id when the client sent none. Anything else passes unchanged,
    with None. (The body goes upstream with a Content-Length the guard writes, so it may change.)"""
    ours = MODEL_ENDPOINT.match(target)
    if method != "POST" or not ours or ours.group(1) not in ("generate", "generate_stream"):
        return body, None
    try:
        obj = json.loads(body)
    except ValueError:
        return body, None
    if not isinstance(obj, dict):
        return body, None
    params = obj.setdefault("parameters", {})
    if not isinstance(params, dict):
        return body, None     # Triton refuses it
    if peer:
        params[CLIENT_HEADER] = peer
    if ours.group(1) == "generate_stream":
        return json.dumps(obj).encode(), None
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        rid = obj["id"] = f"guard-{uuid.uuid4().hex}"
    return json.dumps(obj).encode(), (target.split("?")[0], rid, str(params.get(CANCEL_KEY, "")))


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


@dataclass
class _Peer:
    """What one client address holds: connections, body bytes reserved, and its idle connections (waiting
    for a request's first byte; the oldest is closed when the address is at its connection bound)."""
    conns: int = 0
    held: int = 0
    idle: dict = field(default_factory=dict)      # task -> monotonic time it became idle


class _Gone(Exception):
    """The client closed its connection (between requests or mid-request)."""


class _Upstream:
    """One connection to Triton, with h11 reading its answers (and writing our requests)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)

    def reusable(self) -> bool:
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE

    async def next_event(self):
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(65536))
        return event

    def close(self) -> None:
        self.writer.close()


def triton_routes(req: Request) -> Refused | None:
    """The routes of Triton's HTTP port a client may use: all but the restricted APIs."""
    if HTTP_PATHS.match(req.path):
        return Refused(403, DFlashError(req.path[:80], WHY, FIX))
    return None


def metrics_only(req: Request) -> Refused | None:
    """The routes of Triton's metrics port (its only one is GET /metrics): anything else is refused before
    its body is read (Triton 2.51 crashes on a 5 MiB form POST to /metrics)."""
    if req.path != "/metrics":
        return Refused(404, DFlashError("path", f"{req.path[:80]!r} is not served on the metrics port",
                                        "GET /metrics"))
    if req.method not in ("GET", "HEAD"):
        return Refused(405, DFlashError("method", f"{req.method} is not allowed on /metrics", "GET /metrics"))
    if req.header("content-length", "0") != "0" or req.header("transfer-encoding"):
        return Refused(400, DFlashError("body", "GET /metrics takes no body", "send none"))
    return None


class HttpGuard:
    """Listens on ``host:port`` in a thread of its own; relays to ``upstream``: a port on 127.0.0.1, or
    ``unix:PATH``. ``drop_header``: a header removed from every request under any spelling that ends in it
    (the key of Triton's restricted APIs, which must open nothing to a client). ``route``: refuses
    requests by method and path before their body is read (the metrics port's ``metrics_only``)."""

    def __init__(self, host: str, port: int, upstream: int | str, limits: GuardLimits = GuardLimits(),
                 drop_header: str = "", route=None, name: str = "--http_port"):
        self.host, self.port, self.upstream, self.limits = host, port, upstream, limits
        self.drop_header = drop_header.lower()
        self.route, self.name = route, name
        self.loop = asyncio.new_event_loop()
        self.conns: set[asyncio.Task] = set()
        self.last_output = 0.0          # monotonic time of the last bytes relayed to a client
        self.refused = 0
        self.evicted = 0                # idle connections closed to admit a new one from the same address
        self.buffered = 0               # body bytes held by connections now (<= max_buffered_bytes)
        self.clients: dict[str, _Peer] = {}   # peer address -> what it holds
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
            raise DFlashError(self.name, f"port {self.port} on {self.host} is not free ({err.strerror})",
                              f"stop what uses it, or pass another {self.name}") from None
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
        client = self.clients.setdefault(peer, _Peer())
        client.conns += 1
        self.conns.add(task)
        up: _Upstream | None = None
        held = [0, client]              # this connection's share of self.buffered, and its client's tally
        try:
            if client.conns > self.limits.max_client_connections and not self._evict_idle(client):
                await self._refuse(reader, writer, Refused(429, DFlashError(
                    "connections", f"this client ({peer}) has {client.conns - 1} connections open, all busy, "
                    "the bound", "reuse keep-alive connections or close idle ones")))
                return
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
            while True:
                self._release(held)
                try:
                    got = await self._read_request(conn, reader, writer, held, client, task)
                except Refused as err:
                    await self._refuse(reader, writer, err)
                    return        # the rest of a refused request is unread: this connection cannot go on
                if got is None:
                    return        # closed or idle between requests
                req, body = got
                body, handle = rewrite_body(req.method, req.target, body, peer)
                if up is None or not up.reusable():
                    if up is not None:
                        up.close()
                    try:
                        up = _Upstream(*await self._open_upstream())
                    except OSError:
                        await self._answer(writer, 503, str(DFlashError(
                            "server", "tritonserver is not running (restarting or stopping)",
                            "retry in a few seconds")))
                        return
                if not await self._exchange(conn, reader, writer, up, req, body, held, handle, peer):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return        # Connection: close, HTTP/1.0 or a body Triton did not frame
                conn.start_next_cycle()
        except (_Gone, ConnectionError, asyncio.CancelledError, h11.ProtocolError):
            pass
        finally:
            self._release(held)
            client.conns -= 1
            client.idle.pop(task, None)
            if client.conns == 0 and client.held == 0:
                self.clients.pop(peer, None)
            self.conns.discard(task)
            writer.close()
            if up is not None:
                up.close()

    def _evict_idle(self, client: _Peer) -> bool:
        """Close the client's longest-idle connection (one waiting for its next request) to make room for a
        new one: 1,000 idle keep-alive connections must not lock their own address out. False if none."""
        if not client.idle:
            return False
        task = next(iter(client.idle))
        client.idle.pop(task)
        task.cancel()
        self.evicted += 1
        return True

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to Triton's HTTP endpoint (OSError if it is not listening)."""
        if isinstance(self.upstream, str):
            return await asyncio.open_unix_connection(self.upstream[5:])
        return await asyncio.open_connection("127.0.0.1", self.upstream)

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        up: _Upstream, req: Request, body: bytes, held: list, handle, peer: str = "") -> bool:
        """Send the canonical request upstream and relay the answer; True when the client's connection can
        carry another request. A client that goes away meanwhile closes the upstream connection (how
        Triton notices a stream whose client left); one that waited for a non-streaming generate gets it
        stopped (Triton 2.51 pauses such a request until its answer and would not notice: see the module
        docstring)."""
        data = up.conn.send(h11.Request(method=req.method, target=req.target,
                                        headers=upstream_headers(req, len(body), peer)))
        data += up.conn.send(h11.Data(data=body)) if body else b""
        up.writer.write(data + up.conn.send(h11.EndOfMessage()))
        del data, body
        self._release(held)
        try:
            await up.writer.drain()
        except ConnectionError:
            await self._answer(writer, 503, str(DFlashError("server", "tritonserver closed the connection",
                                                            "retry in a few seconds")))
            return False
        started = [False]
        relay = asyncio.ensure_future(self._relay(conn, writer, up, started))
        watch = asyncio.ensure_future(self._watch(reader, conn))
        try:
            await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, watch):
                task.cancel()
            # the watch must be gone before the connection's next read (a StreamReader takes one reader)
            await asyncio.gather(relay, watch, return_exceptions=True)
        if not relay.cancelled() and relay.exception() is None:
            return relay.result()
        up.close()          # the client left before its answer was out
        if handle is not None and not started[0]:
            asyncio.ensure_future(self._stop(*handle))
        return False

    async def _watch(self, reader: asyncio.StreamReader, conn: h11.Connection) -> None:
        """Returns when the client closes its side while its answer is pending; bytes it sends meanwhile (a
        pipelined request) go to h11's buffer, up to one head's bound (then reading pauses)."""
        got = 0
        while got <= self.limits.max_head_bytes:
            data = await reader.read(65536)
            if not data:
                return
            conn.receive_data(data)
            got += len(data)
        await asyncio.Event().wait()

    async def _relay(self, conn: h11.Connection, writer: asyncio.StreamWriter, up: _Upstream,
                     started: list) -> bool:
        """Triton's answer to the client as it comes (SSE keeps streaming), re-framed by h11; True when it
        ended cleanly."""
        while True:
            try:
                event = await up.next_event()
            except (h11.ProtocolError, ConnectionError):
                event = h11.ConnectionClosed()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.ConnectionClosed):
                if not started[0]:
                    await self._answer(writer, 503, str(DFlashError(
                        "server", "tritonserver closed the connection before answering (it may be restarting)",
                        "retry in a few seconds")))
                return False
            if isinstance(event, h11.Response):
                started[0] = True
                headers = [(k, v) for k, v in event.headers
                           if k.lower() not in (b"connection", b"keep-alive", b"transfer-encoding")]
                out = conn.send(h11.Response(status_code=event.status_code, headers=headers, reason=event.reason))
            elif isinstance(event, h11.Data):
                out = conn.send(h11.Data(data=event.data))
            else:                                        # EndOfMessage
                out = conn.send(h11.EndOfMessage())
            writer.write(out)
            self.last_output = time.monotonic()
            await writer.drain()
            if isinstance(event, h11.EndOfMessage):
                return True

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
        """Count ``n`` more body bytes, as they arrive, against the guard's memory bound and the client's
        share of it, or refuse the request. (Bytes, not announced lengths: a client that announces 16 MiB
        and sends one byte holds one byte.)"""
        client = held[1]
        if client.held + n > self.limits.max_client_bytes:
            raise Refused(429, DFlashError("body", f"this client holds {client.held} bytes of request bodies being "
                                           f"sent; {n} more would pass the per-client bound of "
                                           f"{self.limits.max_client_bytes}", "finish or close the other uploads "
                                           "first"))
        if self.buffered + n > self.limits.max_buffered_bytes:
            raise Refused(503, DFlashError("body", f"the server holds {self.buffered} bytes of other requests' "
                                           f"bodies; {n} more would pass its bound of "
                                           f"{self.limits.max_buffered_bytes}", "retry in a moment"))
        self.buffered += n
        held[0] += n
        client.held += n

    def _release(self, held: list) -> None:
        self.buffered -= held[0]
        held[1].held -= held[0]
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

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            held: list, client: _Peer, task) -> tuple[Request, bytes] | None:
        """(request, body) of the next request, checked, or None when the client closed or stayed idle
        past ``idle_timeout_s``. Its first byte must come within ``idle_timeout_s`` (an idle connection
        holds no body bytes, and is the first closed when its address is at its connection bound); its head
        and body within ``read_timeout_s`` of that."""
        if not conn.trailing_data[0]:
            client.idle[task] = time.monotonic()
            try:
                async with asyncio.timeout(self.limits.idle_timeout_s):
                    data = await reader.read(65536)
            except TimeoutError:
                return None
            finally:
                client.idle.pop(task, None)
            if not data:
                return None
            conn.receive_data(data)
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                return await self._read_rest(conn, reader, writer, held)
        except TimeoutError:
            raise Refused(408, DFlashError("request", f"head and body not received within "
                                           f"{self.limits.read_timeout_s:g} s", "send the whole request at once, "
                                           "or raise dflash-serve --read_timeout_s")) from None

    @staticmethod
    async def _next(conn: h11.Connection, reader: asyncio.StreamReader):
        """h11's next event of the client's request; Refused naming what is malformed (h11 keeps RFC 9112's
        rules: one Content-Length of ASCII digits, Transfer-Encoding chunked in any case and nothing else,
        chunk sizes of hex digits only); _Gone when the client closed."""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as err:
                status = err.error_status_hint if err.error_status_hint in REASONS else 400
                field = {431: "headers", 501: "Transfer-Encoding"}.get(status, "request")
                raise Refused(status, DFlashError(field, f"malformed HTTP/1.1: {str(err)[:120]}",
                                                  "send a well-formed request (Content-Length of digits, or "
                                                  "Transfer-Encoding: chunked with hex chunk sizes)")) from None
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.ConnectionClosed):
                    raise _Gone
                return event
            data = await reader.read(65536)
            if not data:
                raise _Gone
            conn.receive_data(data)

    async def _read_rest(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         held: list) -> tuple[Request, bytes]:
        limits = self.limits
        event = await self._next(conn, reader)
        try:
            req = from_h11(event.method, event.target, event.headers, drop=(self.drop_header,))
        except BadTarget as err:
            raise Refused(400, err.err) from None
        names = {k for k, _ in event.headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            raise Refused(400, DFlashError("Content-Length", "given with Transfer-Encoding: chunked",
                                           "send one of them"))
        if self.draining:
            raise Refused(503, DFlashError("server", "is shutting down", "retry on another replica or later"))
        if self.route is not None and (refused := self.route(req)):
            raise refused
        if req.method == "GET" and req.path == "/v2/health/ready" and (why := self.accepting()):
            raise Refused(503, DFlashError("server", f"not ready: {why}", "retry in a moment"))
        headers = dict(req.headers)
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise Refused(415, DFlashError("Content-Encoding", f"{headers['content-encoding'][:40]!r}: Triton "
                                           "would inflate the body past the guard's checks", "send the body "
                                           "uncompressed"))
        expect = next((v for k, v in event.headers if k == b"expect"), None)
        if expect is not None and expect.lower() != b"100-continue":
            raise Refused(400, DFlashError("Expect", f"{expect[:40].decode('latin-1')!r} is not supported",
                                           "send Expect: 100-continue or none"))
        length = next((v for k, v in event.headers if k == b"content-length"), b"0")
        if int(length) > limits.max_body_bytes:
            raise Refused(413, self._too_large(int(length)))
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        body = bytearray()
        while not isinstance(event := await self._next(conn, reader), h11.EndOfMessage):
            if len(body) + len(event.data) > limits.max_body_bytes:
                raise Refused(413, self._too_large(len(body) + len(event.data)))
            self._reserve(held, len(event.data))
            body += event.data
        body = bytes(body)
        if len(body) > 65536:      # parse big bodies off the loop so other connections keep moving
            await asyncio.to_thread(check_body, req.target, headers, body, limits)
        else:                      # an empty body too: Triton 2.51 answers 500 to one on /generate
            check_body(req.target, headers, body, limits)
        return req, body

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
