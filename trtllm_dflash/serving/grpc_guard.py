# SPDX-License-Identifier: Apache-2.0
"""A gRPC relay in front of Triton's gRPC endpoint (dflash-serve ``--grpc_guard``).

Why: tritonserver 2.51 accepts gRPC messages up to 2 GiB (``MAX_GRPC_MESSAGE_SIZE = INT32_MAX`` in its
``common.h``, passed to ``SetMaxMessageSize``) and has no flag to lower it (``tritonserver --help``: no
``--grpc-*`` option bounds message size). A 200 MB ``text_input`` was buffered whole by tritonserver and
again by the python stub (4 GB RSS for four 400 MB ones, 1.1 GB left in /dev/shm) before the model refused it.

The relay is a grpc.aio server on the user's ``--grpc_port`` that passes every call through as raw bytes
to Triton's gRPC on a Unix socket only this user can reach, with:

* ``max_message_bytes`` per message: gRPC itself refuses a bigger one with RESOURCE_EXHAUSTED
  ("Received message larger than max (N vs. M)") before any of it reaches Triton;
* ``max_rpcs`` calls at once over all clients and ``max_client_rpcs`` per client address: message bytes
  held are at most ``max_rpcs * max_message_bytes`` in total (each call holds one message at a time);
* Triton's restricted APIs never reachable through it: the admin header is dropped from every call;
* ``max_bytes_in_flight`` of request messages over all calls (``max_client_bytes_in_flight`` per client)
  that Triton holds: a unary call's until it ends, a stream message's until its request's final response
  (128 concurrent 4 MiB messages took the tree to 3.3 GB RSS when only the call count was bound);
* a stream with no request outstanding and no message either way for ``idle_stream_s`` ends (DEADLINE
  EXCEEDED naming the bound); when the server or a client is at its call bound, the longest-idle such
  stream of the client holding the most calls ends to make room (256 idle streams held every other client
  out for as long as they stayed open);
* Triton's restricted APIs are refused by method name (serving/restricted.py), whatever the metadata;
* ``close(drain_s)``: new calls get UNAVAILABLE at once; calls still running after ``drain_s`` end with
  UNAVAILABLE naming the drain, so Triton has no open stream left when it is told to stop.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field

# gRPC's fork handlers are for processes that fork to use gRPC in the child; dflash-serve forks only to exec
# tritonserver, and those handlers, run while the guard's threads were inside gRPC, aborted the child
# (see server.start). Read when gRPC initialises, so before the import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

from ..errors import DFlashError
from .protocol import CLIENT_HEADER
from .restricted import FIX, GRPC_METHODS, WHY

STREAM_METHODS = {"/inference.GRPCInferenceService/ModelStreamInfer"}


def _address(peer: str) -> str:
    """The guard's peer key (gRPC's peer without its port) as the HTTP guard names the same client:
    "ipv4:1.2.3.4" -> "1.2.3.4", "ipv6:%5B::1%5D" -> "::1"."""
    from urllib.parse import unquote

    kind, _, addr = peer.partition(":")
    return unquote(addr).strip("[]") if kind in ("ipv4", "ipv6") else peer


@dataclass
class GrpcLimits:
    # gRPC's own default receive bound (grpc.max_receive_message_length); far above any prompt the model takes
    max_message_bytes: int = 4 << 20
    max_rpcs: int = 256             # the CPU soak runs 64 streams; message bytes held <= 256 x 4 MiB
    max_client_rpcs: int = 128
    max_bytes_in_flight: int = 64 << 20         # request bytes Triton holds for all calls together
    max_client_bytes_in_flight: int = 32 << 20  # ... for one client address
    idle_stream_s: float = 60.0     # a stream with nothing outstanding and no message for this long ends
    evict_idle_s: float = 1.0       # idle this long, it may end early to make room for a new call

    @classmethod
    def for_slots(cls, max_batch_size: int | None, **kw) -> "GrpcLimits":
        """Call bounds for an engine of ``max_batch_size`` slots: one client address may hold a call for every
        slot and 16 more (streams ending or idle), since a gateway or a load generator sends all its users from
        one address (the H100 sweep at concurrency 256 from one host had 514 of 1,280 requests refused at the
        fixed 128); all clients together twice that. Never below the defaults."""
        client = max(cls.max_client_rpcs, (max_batch_size or 0) + 16)
        return cls(max_client_rpcs=client, max_rpcs=max(cls.max_rpcs, 2 * client), **kw)


def is_final(response: bytes) -> bool:
    """Whether a ModelStreamInfer response ends its request: an error, or Triton's
    ``triton_final_response`` parameter true (Triton 2.51 sets it on every stream response)."""
    from tritonclient.grpc import service_pb2

    msg = service_pb2.ModelStreamInferResponse()
    try:
        msg.ParseFromString(response)
    except Exception:          # protobuf's DecodeError: not ours to judge, count it as the end
        return True
    if msg.error_message:
        return True
    param = msg.infer_response.parameters.get("triton_final_response")
    return param is None or param.bool_param


@dataclass(eq=False)
class _Call:
    """One call in flight: its client, the request bytes Triton holds for it, its stream's state."""
    peer: str
    stream: bool
    held: list = field(default_factory=list)    # sizes of messages whose request has not ended, in order
    last: float = field(default_factory=time.monotonic)   # the last message either way
    ended: asyncio.Event = field(default_factory=asyncio.Event)   # set (with why) to end the call now
    why: tuple = ()
    counted: bool = True       # holds a call slot (an evicted call gave it back at once)

    def idle_for(self, now: float) -> float:
        return now - self.last if self.stream and not self.held else 0.0


class GrpcGuard:
    """Listens on ``host:port`` (a thread of its own with its own event loop); relays to ``upstream``
    (a gRPC target, e.g. ``unix:/dir/grpc.sock:1``), dropping the metadata key ``drop_header``."""

    def __init__(self, host: str, port: int, upstream: str, drop_header: str, limits: GrpcLimits = GrpcLimits()):
        self.host, self.port, self.upstream, self.drop_header, self.limits = host, port, upstream, drop_header, limits
        self.loop = asyncio.new_event_loop()
        self.clients: dict[str, int] = {}       # peer address -> calls running
        self.running = 0
        self.refused = 0
        self.evicted = 0                         # idle streams ended (timed out, or to make room)
        self.calls: set[_Call] = set()
        self.in_flight = 0                       # request bytes Triton holds (<= max_bytes_in_flight)
        self.client_bytes: dict[str, int] = {}
        self._closing: asyncio.Event | None = None    # new calls are refused
        self._expired: asyncio.Event | None = None    # running calls end with UNAVAILABLE
        self._server: aio.Server | None = None
        self._channel: aio.Channel | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)

    async def _start(self) -> None:
        self._closing, self._expired = asyncio.Event(), asyncio.Event()
        # Triton's answers are trusted and small; its own bound (2 GiB) applies
        self._channel = aio.insecure_channel(self.upstream, options=[("grpc.max_receive_message_length", -1),
                                                                     ("grpc.max_send_message_length", -1)])
        lim = self.limits
        self._server = aio.server(handlers=[_Handler(self)], options=[
            ("grpc.max_receive_message_length", lim.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0)])
        addr = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            if self._server.add_insecure_port(addr) != self.port:
                raise RuntimeError
        except RuntimeError:
            raise DFlashError("--grpc_port", f"port {self.port} on {self.host} is not free",
                              "stop what uses it, or pass another --grpc_port") from None
        await self._server.start()
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        """End streams idle past ``idle_stream_s``, once a second."""
        while True:
            await asyncio.sleep(min(1.0, self.limits.idle_stream_s / 4))
            now = time.monotonic()
            for call in list(self.calls):
                if call.idle_for(now) > self.limits.idle_stream_s and not call.ended.is_set():
                    self._end(call, grpc.StatusCode.DEADLINE_EXCEEDED, f"stream: idle (no request outstanding, no "
                              f"message) for {self.limits.idle_stream_s:g} s. Fix: open a stream when you have a "
                              "request, or send one within that time")

    def _end(self, call: _Call, code, message: str) -> None:
        self.evicted += 1
        call.why = (code, message)
        call.ended.set()

    def _evict_for(self, peer: str) -> bool:
        """Make room for a new call of ``peer``: end the longest-idle stream (idle >= evict_idle_s) of the
        client holding the most calls, or of ``peer`` itself when it is at its own bound. False if none."""
        now, lim = time.monotonic(), self.limits
        own = self.clients.get(peer, 0) >= lim.max_client_rpcs
        idle = [c for c in self.calls if not c.ended.is_set() and c.idle_for(now) >= lim.evict_idle_s
                and (c.peer == peer or not own)]
        if not idle:
            return False
        victim = max(idle, key=lambda c: (self.clients.get(c.peer, 0), c.idle_for(now)))
        self._end(victim, grpc.StatusCode.RESOURCE_EXHAUSTED, "stream: ended while idle to make room for a new "
                  "call (the server is at its call bound). Fix: open a stream when you have a request")
        self.running -= 1            # its slot is free now; _done will not count it twice
        self.clients[victim.peer] -= 1
        victim.counted = False
        return True
    def refuse_new(self) -> None:
        """New calls get UNAVAILABLE from now on (a drain began)."""
        self.loop.call_soon_threadsafe(self._closing.set)

    def close(self, drain_s: float = 0.0) -> int:
        """Refuse new calls; give running ones ``drain_s`` to end by themselves, then end each with
        UNAVAILABLE (an idle stream included: Triton 2.51 waits for open streams when it exits); the
        number ended so."""
        async def close() -> int:
            self._closing.set()
            deadline = self.loop.time() + drain_s
            while self.running and self.loop.time() < deadline:
                await asyncio.sleep(0.05)
            ended = self.running
            self._expired.set()
            self._sweeper.cancel()
            await self._server.stop(1.0)
            await self._channel.close()
            return ended
        return asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=drain_s + 15)

    def stop(self) -> None:
        if self._server is not None and self._thread.is_alive() and not self._expired.is_set():
            self.close(0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    # ---- per call ----

    def _metadata(self, context, peer: str) -> tuple:
        # Triton reads the admin key as "<header>" and as "triton-grpc-protocol-<header>": any name ending in it
        # goes; so does a client's own CLIENT_HEADER: the guard says who the client is (fair admission).
        return tuple((k, v) for k, v in context.invocation_metadata()
                     if not (self.drop_header and k.lower().endswith(self.drop_header))
                     and not k.lower().endswith(CLIENT_HEADER)
                     and not k.startswith((":", "grpc-")) and k != "user-agent") + ((CLIENT_HEADER, _address(peer)),)

    async def _admit(self, context, method: str) -> str:
        if method in GRPC_METHODS:
            self.refused += 1
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method.rsplit('/', 1)[1]}: {WHY}. Fix: {FIX}")
        if self._closing.is_set():
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server: is shutting down. Fix: retry later")
        peer = context.peer().rsplit(":", 1)[0]
        lim = self.limits
        if self.running >= lim.max_rpcs or self.clients.get(peer, 0) >= lim.max_client_rpcs:
            self._evict_for(peer)
        if self.running >= lim.max_rpcs or self.clients.get(peer, 0) >= lim.max_client_rpcs:
            self.refused += 1
            which = (f"{self.running} calls running, the server's bound (max_rpcs {lim.max_rpcs})"
                     if self.running >= lim.max_rpcs else
                     f"this client has {self.clients[peer]} calls running, the per-client bound")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"calls: {which}. Fix: retry when some ended")
        self.running += 1
        self.clients[peer] = self.clients.get(peer, 0) + 1
        return peer

    def _done(self, call: _Call, peer: str) -> None:
        self._release(call, len(call.held))
        self.calls.discard(call)
        if call.counted:           # an evicted call gave its slot back already
            self.running -= 1
            self.clients[peer] -= 1
        if not self.clients.get(peer, 1):
            del self.clients[peer]

    async def _hold(self, call: _Call, peer: str, size: int, context) -> None:
        """Count a request message's bytes as held by Triton, or end the call with RESOURCE_EXHAUSTED."""
        lim = self.limits
        mine = self.client_bytes.get(peer, 0)
        if self.in_flight + size > lim.max_bytes_in_flight or mine + size > lim.max_client_bytes_in_flight:
            self.refused += 1
            which = (f"this client's requests hold {mine} bytes (bound {lim.max_client_bytes_in_flight})"
                     if mine + size > lim.max_client_bytes_in_flight else
                     f"requests hold {self.in_flight} bytes (bound {lim.max_bytes_in_flight})")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"message: {size} more bytes would pass the "
                                f"bound of bytes in flight: {which}. Fix: retry when some requests ended")
        call.held.append(size)
        self.in_flight += size
        self.client_bytes[peer] = mine + size

    def _release(self, call: _Call, n: int = 1) -> None:
        for _ in range(min(n, len(call.held))):
            size = call.held.pop(0)
            self.in_flight -= size
            left = self.client_bytes.get(call.peer, 0) - size
            if left > 0:
                self.client_bytes[call.peer] = left
            else:
                self.client_bytes.pop(call.peer, None)

    async def unary(self, method: str, request: bytes, context) -> bytes:
        peer = await self._admit(context, method)
        me = _Call(peer, stream=False)
        self.calls.add(me)
        try:
            await self._hold(me, peer, len(request), context)
            call = self._channel.unary_unary(method)(request, metadata=self._metadata(context, peer),
                                                     timeout=context.time_remaining())
            return await self._until_closing(call, context, me)
        finally:
            self._done(me, peer)

    async def stream(self, method: str, requests, context) -> None:
        peer = await self._admit(context, method)
        me = _Call(peer, stream=True)
        self.calls.add(me)

        async def forward():
            async for message in requests:
                await self._hold(me, peer, len(message), context)
                me.last = time.monotonic()
                yield message

        call = self._channel.stream_stream(method)(forward(), metadata=self._metadata(context, peer))

        async def pump() -> None:
            async for response in call:
                me.last = time.monotonic()
                if is_final(response):
                    self._release(me)
                await context.write(response)
        try:
            await self._until_closing(pump(), context, me)
        finally:
            call.cancel()
            self._done(me, peer)

    async def _until_closing(self, work, context, me: _Call):
        """``work``'s result; UNAVAILABLE naming the drain once the guard's drain time is over, or the
        reason the call was ended (idle); Triton's own errors passed on as they are."""
        task = asyncio.ensure_future(work)
        expired = asyncio.ensure_future(self._expired.wait())
        ended = asyncio.ensure_future(me.ended.wait())
        try:
            await asyncio.wait({task, expired, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                if me.ended.is_set():
                    await context.abort(*me.why)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "server: is shutting down and its drain time "
                                    "(dflash-serve --drain_timeout_s) is over. Fix: retry on a running server")
            return task.result()
        except aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            expired.cancel()
            ended.cancel()
            if not task.done():
                task.cancel()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, guard: GrpcGuard):
        self.guard = guard

    def service(self, details):
        method = details.method
        if method in STREAM_METHODS:
            async def stream(requests, context):
                await self.guard.stream(method, requests, context)
            return grpc.stream_stream_rpc_method_handler(stream)

        async def unary(request, context):
            return await self.guard.unary(method, request, context)
        return grpc.unary_unary_rpc_method_handler(unary)
