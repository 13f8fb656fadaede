# SPDX-License-Identifier: Apache-2.0
"""The model logic of 1/model.py over a fake Triton and a fake engine (real scheduler/responder threads)."""
import json
import os
import time

import pytest

from tests.serving.fakes import FakeEngine, FakePbUtils, FakeRequest, triton_inputs
from trtllm_dflash.deployment import FORMAT_VERSION
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.runtimes import TorchRuntime
from trtllm_dflash.serving.repo import fill_triton
from trtllm_dflash.serving.triton_model import DFlashModel


@pytest.fixture
def make_model(tmp_path):
    models = []

    def make(decoupled=True, **engine_kw):
        manifest = {"format_version": FORMAT_VERSION, "backend": "torch", "tp_size": 1}
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        repo = fill_triton(tmp_path, manifest, decoupled_mode=decoupled)
        engine = FakeEngine(**engine_kw)
        model = DFlashModel(FakePbUtils, repo / "tensorrt_llm" / "1", runtime=TorchRuntime(engine))
        models.append(model)
        return model, engine

    yield make
    for m in models:
        m.finalize()


def _run(model, *requests, timeout=10):
    model.execute(list(requests))
    for r in requests:
        assert r.sender.final.wait(timeout), "no final response"
    return requests


def test_concurrent_requests_are_batched(make_model):
    model, engine = make_model(max_batch_size=4)
    reqs = [FakeRequest(triton_inputs(f"p{i}-", max_tokens=9)) for i in range(6)]
    _run(model, *reqs)
    for i, r in enumerate(reqs):
        final = r.sender.responses[-1]
        assert final.error is None and len(r.sender.responses) == 1
        assert r.sender.text() == (f"p{i}-" * 3)[:9]
        assert final.outputs["finish_reason"].tolist() == [b"length"]
        assert final.outputs["total_draft_tokens"].tolist() == [15]
        assert final.outputs["total_accepted_draft_tokens"].tolist() == [5]
        assert final.outputs["sequence_length"].tolist() == [9]   # one response: every generated token
    assert engine.counters["max_active_batch"] == 4
    assert model.stats()["finished"] == {"length": 6}


def test_streaming_sends_pieces_then_final(make_model):
    model, _ = make_model(step_s=0.02)     # steps far apart: the sender has each one alone (it joins queued ones)
    (r,) = _run(model, FakeRequest(triton_inputs("abc", max_tokens=7, streaming=True)))
    assert len(r.sender.responses) >= 3 and r.sender.text() == "abcabca"
    assert "finish_reason" in r.sender.responses[-1].outputs
    assert all(set(x.outputs) == {"text_output", "sequence_length"} for x in r.sender.responses[:-1])
    # each response counts the tokens its text carries (the fake engine: one character a token), 7 in all
    counts = [int(x.outputs["sequence_length"][0]) for x in r.sender.responses]
    assert counts == [len(x.outputs["text_output"][0]) for x in r.sender.responses] and sum(counts) == 7


def test_stop_string_and_echo(make_model):
    model, engine = make_model()
    (r,) = _run(model, FakeRequest(triton_inputs("xyz!", max_tokens=40, stop=["z!x"])))
    out = r.sender.responses[-1].outputs
    assert r.sender.text() == "xy" and out["finish_reason"].tolist() == [b"stop"]
    assert out["stop_reason"].tolist() == [b"z!x"]
    inputs = triton_inputs("ab", max_tokens=3)
    inputs["sampling_param_exclude_input_from_output"] = __import__("numpy").array([False])
    (r,) = _run(model, FakeRequest(inputs))
    assert r.sender.text() == "ab" + "aba"


def test_client_cancellation_frees_the_slot(make_model):
    model, engine = make_model(step_s=0.01)
    r = FakeRequest(triton_inputs("abc", max_tokens=200, streaming=True))
    model.execute([r])
    while len(r.sender.responses) < 2:
        pass
    r.cancelled = True            # what Triton reports once the gRPC stream is gone
    assert r.sender.final.wait(5)
    assert r.sender.responses[-1].error.code == "CANCELLED"
    assert engine.metrics()["active"] == 0 and model.stats()["finished"] == {"cancelled": 1}


def test_stop_input_cancels_by_request_id(make_model):
    model, _ = make_model(step_s=0.01)
    r = FakeRequest(triton_inputs("abc", max_tokens=200, streaming=True), request_id="job-7")
    model.execute([r])
    while not r.sender.responses:
        pass
    stop = FakeRequest({**triton_inputs("-"), "stop": __import__("numpy").array([True])}, request_id="job-7")
    _run(model, stop)
    assert r.sender.final.wait(5)
    assert r.sender.responses[-1].outputs["finish_reason"].tolist() == [b"cancelled"]
    assert stop.sender.responses[-1].error is None


def test_only_the_owner_of_a_request_can_cancel_it(make_model):
    # #19 finding 6: any client could cancel any request id. A request sent with a cancel_key parameter is
    # cancelled only by a `stop` that repeats it.
    model, _ = make_model(step_s=0.01)
    r = FakeRequest(triton_inputs("abc", max_tokens=200, streaming=True), {"cancel_key": "k-1"}, request_id="job-8")
    model.execute([r])
    while not r.sender.responses:
        time.sleep(0.001)
    for params in ({}, {"cancel_key": "guess"}):
        other = FakeRequest({**triton_inputs("-"), "stop": __import__("numpy").array([True])}, params, "job-8")
        _run(model, other)
        assert "no running request has id 'job-8' and this cancel_key" in other.sender.responses[-1].error.message
    assert not r.sender.final.is_set()
    owner = FakeRequest({**triton_inputs("-"), "stop": __import__("numpy").array([True])}, {"cancel_key": "k-1"},
                        "job-8")
    _run(model, owner)
    assert r.sender.final.wait(5)
    assert r.sender.responses[-1].outputs["finish_reason"].tolist() == [b"cancelled"]


def test_a_huge_prompt_is_refused_before_tokenizing(make_model):
    model, _ = make_model(max_seq_len=32)        # no vocabulary to measure: 64 bytes a token, 2048 bytes
    t0 = time.monotonic()
    (r,) = _run(model, FakeRequest(triton_inputs("x" * 10_000_000)))
    assert "text_input: is 10000000 bytes, longer than any prompt" in r.sender.responses[-1].error.message
    assert time.monotonic() - t0 < 5


def test_bad_requests_answer_with_errors_and_model_stays_usable(make_model):
    model, _ = make_model(decoupled=False, max_seq_len=32)
    bad = [FakeRequest(triton_inputs("")), FakeRequest(triton_inputs("x", max_tokens=0)),
           FakeRequest(triton_inputs("x" * 40)), FakeRequest(triton_inputs("xx", max_tokens=31)),
           FakeRequest(triton_inputs("x", streaming=True)), FakeRequest(triton_inputs("x"), {"colour": 1}),
           FakeRequest(triton_inputs("x", frequency_penalty=0.5))]
    good = FakeRequest(triton_inputs("ok", max_tokens=2))
    _run(model, *bad, good)
    errors = [r.sender.responses[-1].error for r in bad]
    assert all(e is not None and e.code == "INVALID_ARG" for e in errors)
    assert [e.message.split(":")[0] for e in errors] == [
        "text_input", "sampling_param_max_tokens", "text_input", "sampling_param_max_tokens", "streaming",
        "parameters", "sampling_param_frequency_penalty"]
    assert good.sender.text() == "ok"


def test_one_failed_step_fails_only_its_requests_and_the_engine_goes_on(make_model):
    # #19 finding 1: one request whose admission made the step raise (a seed >= 2**63) failed every later
    # request ("engine: failed earlier ... restart the server") while health said ok.
    model, engine = make_model(poison_seed=2**63)
    poison = FakeRequest(triton_inputs("abc", max_tokens=8, seed=2**63))
    (r,) = _run(model, poison)
    error = poison.sender.responses[-1].error
    assert error.code == "INTERNAL" and "engine step failed: OverflowError" in error.message
    good = [FakeRequest(triton_inputs(f"q{i}", max_tokens=4)) for i in range(3)]
    _run(model, *good)
    assert [g.sender.text() for g in good] == ["q0q0", "q1q1", "q2q2"]
    assert model.health() == (True, "ok")
    assert engine.metrics()["active"] == 0 and model.stats()["running"] == 0
    assert model.stats()["finished"] == {"error": 1, "length": 3}


def test_a_broken_engine_says_so_and_refuses_requests(make_model):
    model, _ = make_model(fail_at_step=2)
    (r,) = _run(model, FakeRequest(triton_inputs("abc", max_tokens=50)))
    assert r.sender.responses[-1].error.code == "INTERNAL" and "device lost" in r.sender.responses[-1].error.message
    deadline = time.monotonic() + 5
    while model.health()[0] and time.monotonic() < deadline:
        model.execute([FakeRequest(triton_inputs("abc"))])   # fresh requests keep failing: the engine is broken
        time.sleep(0.01)
    ok, reason = model.health()
    assert not ok and "3 steps failed in a row" in reason and "device lost" in reason
    (r2,) = _run(model, FakeRequest(triton_inputs("abc")))
    error = r2.sender.responses[-1].error
    assert error.code == "UNAVAILABLE" and "engine: is broken" in error.message and "restart the server" in error.message
    assert model.stats()["healthy"] == 0


def test_decoupled_policy_must_match_model_yaml(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "backend": "torch"}))
    version_dir = fill_triton(tmp_path, {"backend": "torch"}, decoupled_mode=False) / "tensorrt_llm" / "1"
    loaded = {"name": "tensorrt_llm", "model_transaction_policy": {"decoupled": True}}
    with pytest.raises(DFlashError, match="triton_config.decoupled: is False in model.yaml"):
        DFlashModel(FakePbUtils, version_dir, loaded, runtime=object())


def test_model_yaml_names_the_deployment_and_older_repositories_still_load(tmp_path):
    """model.yaml's key was engine_dir before it became deployment_dir: repositories filled then still load."""
    from trtllm_dflash.serving.triton_model import read_model_yaml

    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "backend": "torch"}))
    version_dir = fill_triton(tmp_path, {"backend": "torch"}) / "tensorrt_llm" / "1"
    yaml_path = version_dir / "model.yaml"
    assert read_model_yaml(yaml_path)["deployment_dir"] == "../../.."
    yaml_path.write_text(yaml_path.read_text().replace("deployment_dir:", "engine_dir:"))
    assert read_model_yaml(yaml_path)["deployment_dir"] == "../../.."
    model = DFlashModel(FakePbUtils, version_dir, runtime=TorchRuntime(FakeEngine()))
    try:
        assert model.deployment.path == tmp_path.resolve() and model.deployment.backend == "torch"
    finally:
        model.finalize()
    yaml_path.write_text(yaml_path.read_text().replace("engine_dir:", "other:"))
    with pytest.raises(DFlashError, match=r"model\.yaml: deployment_dir: is missing\. Fix: refill with dflash-build"):
        read_model_yaml(yaml_path)


def test_no_thread_per_request_and_one_hand_over_per_step(make_model):
    # Before: execute() started an OS thread per request and the runtime woke each record on its own.
    import threading
    model, engine = make_model(max_batch_size=16)
    deliveries, deliver = [], model.deliver
    model.deliver = lambda updates: (deliveries.append(len(updates)), deliver(updates))
    before = threading.active_count()
    reqs = [FakeRequest(triton_inputs(f"q{i}-", max_tokens=40, streaming=True)) for i in range(16)]
    model.execute(reqs)
    assert threading.active_count() <= before      # (a thread of an earlier test may end meanwhile)
    for r in reqs:
        assert r.sender.final.wait(10), "no final response"
    assert all(r.sender.text() == (f"q{i}-" * 14)[:40] for i, r in enumerate(reqs))
    # at most one hand-over per step, carrying every row of it: 20 updates of 2 tokens + 1 final per request
    assert sum(deliveries) == 16 * 21 and len(deliveries) <= engine.counters["steps"] + 1
    assert max(deliveries) >= 16          # 16 slots: once all are admitted, a step's hand-over has all 16 rows


def test_dflash_serve_alive_is_asked_of_tritonserver_parent():
    # In the stub, os.getppid() is tritonserver and dflash-serve is its parent: here, this process's grandparent.
    from trtllm_dflash.serving import procfs, triton_model
    grandparent = procfs.stat(os.getppid())[1]
    assert triton_model._alive(grandparent) and not triton_model._alive(os.getpid())


@pytest.mark.parametrize("acks", [False, True], ids=["in_process", "engine_process_acks"])
def test_a_slow_sender_sends_each_request_its_backlog_at_once(make_model, acks):
    # Each send crosses the Python stub's IPC into Triton; one response per request and step capped dflash-serve at
    # ~3.5k responses/s on an H100 host (57 tok/s per user for AR at concurrency 64). A sender that lags sends each
    # request everything it owes in one response: the engine's rate is kept, the text is the same. The engine
    # process's client (engine_client.py) queues an after() acknowledgement behind every step: the drain must go
    # past those too (it once stopped at the first, so each response still held one step).
    model, engine = make_model(max_batch_size=8, step_s=0.0005)
    if acks:
        deliver, acked = model.deliver, []
        model.deliver = lambda updates: (deliver(updates), model.after(lambda: acked.append(len(updates))))
    send = model._send
    model._send = lambda *a, **kw: (time.sleep(0.002), send(*a, **kw))   # 2 ms per response, 8 streams
    reqs = [FakeRequest(triton_inputs(f"s{i}-", max_tokens=200, streaming=True)) for i in range(8)]
    _run(model, *reqs, timeout=30)
    for i, r in enumerate(reqs):
        assert r.sender.text() == (f"s{i}-" * 67)[:200]
        assert "finish_reason" in r.sender.responses[-1].outputs
    steps = engine.counters["steps"]           # 100 updates of 2 tokens per request
    sends = max(len(r.sender.responses) for r in reqs)
    assert steps >= 100 and sends <= steps / 3, (sends, steps)
    if acks:      # every acknowledgement ran, once its step was sent
        assert len(acked) >= steps
