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
* ``close(drain_s)``: new calls get UNAVAILABLE at once; calls still running after ``drain_s`` end with
  UNAVAILABLE naming the drain, so Triton has no open stream left when it is told to stop.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import grpc
from grpc import aio

from ..errors import DFlashError

STREAM_METHODS = {"/inference.GRPCInferenceService/ModelStreamInfer"}


@dataclass
class GrpcLimits:
    # gRPC's own default receive bound (grpc.max_receive_message_length); far above any prompt the model takes
    max_message_bytes: int = 4 << 20
    max_rpcs: int = 256             # the CPU soak runs 64 streams; message bytes held <= 256 x 4 MiB
    max_client_rpcs: int = 128


class GrpcGuard:
    """Listens on ``host:port`` (a thread of its own with its own event loop); relays to ``upstream``
    (a gRPC target, e.g. ``unix:/dir/grpc.sock:1``), dropping the metadata key ``drop_header``."""

    def __init__(self, host: str, port: int, upstream: str, drop_header: str, limits: GrpcLimits = GrpcLimits()):
        self.host, self.port, self.upstream, self.drop_header, self.limits = host, port, upstream, drop_header, limits
        self.loop = asyncio.new_event_loop()
        self.clients: dict[str, int] = {}       # peer address -> calls running
        self.running = 0
        self.refused = 0
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

    def _metadata(self, context) -> tuple:
        return tuple((k, v) for k, v in context.invocation_metadata()
                     if k != self.drop_header and not k.startswith((":", "grpc-")) and k != "user-agent")

    async def _admit(self, context) -> str:
        if self._closing.is_set():
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server: is shutting down. Fix: retry later")
        peer = context.peer().rsplit(":", 1)[0]
        lim = self.limits
        if self.running >= lim.max_rpcs or self.clients.get(peer, 0) >= lim.max_client_rpcs:
            self.refused += 1
            which = (f"{self.running} calls running, the server's bound (max_rpcs {lim.max_rpcs})"
                     if self.running >= lim.max_rpcs else
                     f"this client has {self.clients[peer]} calls running, the per-client bound")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"calls: {which}. Fix: retry when some ended")
        self.running += 1
        self.clients[peer] = self.clients.get(peer, 0) + 1
        return peer

    def _done(self, peer: str) -> None:
        self.running -= 1
        self.clients[peer] -= 1
        if not self.clients[peer]:
            del self.clients[peer]

    async def unary(self, method: str, request: bytes, context) -> bytes:
        peer = await self._admit(context)
        try:
            call = self._channel.unary_unary(method)(request, metadata=self._metadata(context),
                                                     timeout=context.time_remaining())
            return await self._until_closing(call, context)
        finally:
            self._done(peer)

    async def stream(self, method: str, requests, context) -> None:
        peer = await self._admit(context)

        async def forward():
            async for message in requests:
                yield message

        call = self._channel.stream_stream(method)(forward(), metadata=self._metadata(context))

        async def pump() -> None:
            async for response in call:
                await context.write(response)
        try:
            await self._until_closing(pump(), context)
        finally:
            call.cancel()
            self._done(peer)

    async def _until_closing(self, work, context):
        """``work``'s result; UNAVAILABLE naming the drain once the guard's drain time is over; Triton's
        own errors passed on as they are."""
        task = asyncio.ensure_future(work)
        expired = asyncio.ensure_future(self._expired.wait())
        try:
            await asyncio.wait({task, expired}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await context.abort(grpc.StatusCode.UNAVAILABLE, "server: is shutting down and its drain time "
                                    "(dflash-serve --drain_timeout_s) is over. Fix: retry on a running server")
            return task.result()
        except aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            expired.cancel()
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
