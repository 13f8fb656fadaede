# SPDX-License-Identifier: Apache-2.0
"""dflash-serve's gRPC guard between real gRPC clients and a stand-in upstream (a real grpc server on a Unix
socket whose calls take a while), so that calls stay in flight: the bytes-in-flight budget (#37 finding 9:
128 concurrent 4 MiB messages took the tree to 3.3 GB), the final-response parse and the admin header under
every spelling."""
from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from tests.serving.conftest import free_port
from trtllm_dflash.serving.grpc_guard import GrpcGuard, GrpcLimits, is_final

INFER = "/inference.GRPCInferenceService/ModelInfer"


class _Upstream:
    """Answers every unary call after ``delay`` s with the metadata keys it saw."""

    def __init__(self, path: str, delay: float):
        self.seen: list[tuple[str, ...]] = []
        upstream = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                def unary(request, context):
                    upstream.seen.append(tuple(k for k, _ in context.invocation_metadata()))
                    time.sleep(delay)
                    return b"ok"
                return grpc.unary_unary_rpc_method_handler(unary)

        self.server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[Handler()],
                                  options=[("grpc.max_receive_message_length", -1)])
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()


@pytest.fixture
def guarded(tmp_path):
    upstream = _Upstream(str(tmp_path / "up.sock"), delay=1.5)
    limits = GrpcLimits(max_message_bytes=1 << 20, max_bytes_in_flight=2 << 20, max_client_bytes_in_flight=2 << 20)
    guard = GrpcGuard("127.0.0.1", free_port(), f"unix:{tmp_path / 'up.sock'}", "dflash-admin-key", limits)
    guard.start()
    yield guard, upstream
    guard.stop()
    upstream.server.stop(0)


def test_bytes_in_flight_are_bounded_not_calls(guarded):
    guard, _ = guarded
    channel = grpc.insecure_channel(f"127.0.0.1:{guard.port}")
    call = channel.unary_unary(INFER)
    results: list = []

    def one():
        try:
            results.append(call(b"x" * (900 << 10), timeout=30))
        except grpc.RpcError as err:
            results.append(err)
    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(30)
    errors = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(results) == 3 and len(errors) == 1, results
    assert errors[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes in flight" in errors[0].details()
    assert guard.in_flight == 0 and not guard.client_bytes
    assert call(b"x" * (900 << 10), timeout=30) == b"ok"      # released when the calls ended
    channel.close()


def test_the_admin_header_goes_under_every_spelling_and_restricted_methods_are_refused(guarded):
    guard, upstream = guarded
    channel = grpc.insecure_channel(f"127.0.0.1:{guard.port}")
    meta = (("dflash-admin-key", "k"), ("triton-grpc-protocol-dflash-admin-key", "k"), ("x-kept", "1"))
    assert channel.unary_unary(INFER)(b"", metadata=meta, timeout=30) == b"ok"
    assert "x-kept" in upstream.seen[-1] and not any(k.endswith("dflash-admin-key") for k in upstream.seen[-1])
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/inference.GRPCInferenceService/LogSettings")(b"", metadata=meta, timeout=30)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "restricted" in err.value.details()
    channel.close()


def test_final_responses_are_read_from_the_stream_message():
    from tritonclient.grpc import service_pb2

    msg = service_pb2.ModelStreamInferResponse()
    msg.infer_response.parameters["triton_final_response"].bool_param = False
    assert not is_final(msg.SerializeToString())
    msg.infer_response.parameters["triton_final_response"].bool_param = True
    assert is_final(msg.SerializeToString())
    assert is_final(service_pb2.ModelStreamInferResponse(error_message="boom").SerializeToString())


def test_peer_addresses_name_clients_as_the_http_guard_does():
    from trtllm_dflash.serving.grpc_guard import _address

    # the guard's peer key: gRPC's peer without the port
    assert _address("ipv4:127.0.0.2") == "127.0.0.2"
    assert _address("ipv6:%5B::1%5D") == "::1"
    assert _address("unix:/tmp/x.sock") == "unix:/tmp/x.sock"


def test_call_bounds_follow_the_engine_slots():
    # one client address (a gateway, a load generator) may drive every slot of a 256-slot engine
    big = GrpcLimits.for_slots(256, max_message_bytes=1 << 20)
    assert big.max_client_rpcs == 272 and big.max_rpcs == 544 and big.max_message_bytes == 1 << 20
    assert GrpcLimits.for_slots(8) == GrpcLimits() == GrpcLimits.for_slots(None)


def test_dflash_serve_reads_the_slots_from_the_deployment(tmp_path, tiny_deployment):
    from trtllm_dflash.deployment import Deployment
    from trtllm_dflash.serving.server import engine_slots
    assert engine_slots(tmp_path) is None          # a bare model repository: the default bounds
    assert engine_slots(tiny_deployment) == Deployment.open(tiny_deployment).manifest["runtime"]["max_batch_size"]
