# SPDX-License-Identifier: Apache-2.0
import asyncio
import json
import sys
import types

import pytest
import yaml

from tests.serving.fakes import FakePbUtils, FakeRequest, triton_inputs
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import launch
from trtllm_dflash.serving.repo import fill_triton
from trtllm_dflash.serving.triton_model import DFlashModel


def test_follower_argv_mpich_and_openmpi(tmp_path):
    env = launch.tp_env(4, master_port=29555)
    assert env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "TRTLLM_DFLASH_WORLD_SIZE": "4"}
    argv = launch.follower_argv(tmp_path, 4, env, mpiexec="/x/mpiexec", flavor="mpich", python="/py")
    assert argv[:3] == ["/x/mpiexec", "-n", "3"]
    assert argv[-4:] == ["/py", "-m", "trtllm_dflash.runtime.worker", str(tmp_path)]
    assert ["-genv", "TRTLLM_DFLASH_RANK_OFFSET", "1"] == argv[argv.index("TRTLLM_DFLASH_RANK_OFFSET") - 1:][:3]
    assert ["-genv", "MASTER_PORT", "29555"] == argv[argv.index("MASTER_PORT") - 1:][:3]
    argv = launch.follower_argv(tmp_path, 2, env, mpiexec="mpirun", flavor="openmpi", python="/py", is_root=True)
    assert argv[:4] == ["mpirun", "-n", "1", "--allow-run-as-root"]
    assert "-x" in argv and "TRTLLM_DFLASH_RANK_OFFSET=1" in argv and "MASTER_ADDR=127.0.0.1" in argv


def test_mpi_flavor_of_the_installed_mpiexec():
    import shutil
    exe = shutil.which("mpiexec") or str(__import__("pathlib").Path(sys.executable).parent / "mpiexec")
    if not __import__("os").path.exists(exe):
        pytest.skip("no mpiexec")
    assert launch.mpi_flavor(exe) in ("mpich", "openmpi")


# ---- backend: trtllm, with a stand-in tensorrt_llm module ------------------------------------------

class _Output:
    def __init__(self, text, diff, finish_reason=None):
        self.text, self.text_diff, self.finish_reason, self.stop_reason = text, diff, finish_reason, None
        spec = types.SimpleNamespace(acceptance_rate=0.5, total_accepted_draft_tokens=3, total_draft_tokens=6)
        self.request_perf_metrics = types.SimpleNamespace(speculative_decoding=spec)


class _Result:
    """TensorRT-LLM's GenerationResult as the backend uses it: async iterator of updates, abort()."""

    def __init__(self, prompt):
        self.prompt, self.aborted = prompt, False

    def abort(self):
        self.aborted = True

    async def _gen(self):
        text = ""
        for i, piece in enumerate(["Hel", "lo", "!"]):
            await asyncio.sleep(0)
            text += piece
            last = i == 2
            yield types.SimpleNamespace(finished=last, outputs=[_Output(text, piece, "length" if last else None)])

    def __aiter__(self):
        return self._gen()


@pytest.fixture
def fake_tensorrt_llm(monkeypatch):
    mod = types.ModuleType("tensorrt_llm")
    calls = {}

    class LLM:
        def __init__(self, **kwargs):
            calls["llm_kwargs"] = kwargs

        def generate_async(self, prompt, sampling_params, streaming=False):
            calls.setdefault("generate", []).append((prompt, sampling_params, streaming))
            return _Result(prompt)

        def shutdown(self):
            calls["shutdown"] = True

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    return calls


def _trtllm_deployment(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "drafter").mkdir()
    options = {"backend": "pytorch", "tensor_parallel_size": 2, "max_seq_len": 4096,
               "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7, "speculative_model": "drafter"}}
    (tmp_path / "llm_api_options.yaml").write_text(yaml.safe_dump(options))
    manifest = {"backend": "trtllm", "tp_size": 2}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return fill_triton(tmp_path, manifest) / "tensorrt_llm" / "1"


def test_trtllm_backend_kwargs_and_stream(tmp_path, fake_tensorrt_llm):
    model = DFlashModel(FakePbUtils, _trtllm_deployment(tmp_path))
    kwargs = fake_tensorrt_llm["llm_kwargs"]
    assert kwargs["model"] == str((tmp_path / "target").resolve())
    assert kwargs["speculative_config"] == {"decoding_type": "DFlash", "max_draft_len": 7,
                                            "speculative_model": str((tmp_path / "drafter").resolve())}
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["backend"] == "pytorch"
    r = FakeRequest(triton_inputs("Hi", max_tokens=5, temperature=0.0, streaming=True, stop=["\n"], ignore_eos=True))
    model.execute([r])
    assert r.sender.final.wait(5)
    prompt, params, streaming = fake_tensorrt_llm["generate"][0]
    assert (prompt, streaming) == ("Hi", True)
    assert params.kwargs == {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True, "stop": ["\n"],
                             "return_perf_metrics": True}
    assert r.sender.text() == "Hello!" and len(r.sender.responses) == 3
    final = r.sender.responses[-1].outputs
    assert final["acceptance_rate"][0] == pytest.approx(0.5) and final["total_draft_tokens"].tolist() == [6]
    model.finalize()
    assert fake_tensorrt_llm["shutdown"]


def test_trtllm_backend_without_tensorrt_llm_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)   # import fails
    with pytest.raises(DFlashError, match="backend: trtllm needs TensorRT-LLM"):
        DFlashModel(FakePbUtils, _trtllm_deployment(tmp_path))


# ---- backend: torch, the record interface the frontends code against ----------------------------

def test_torch_backend_submit_record_usage_and_asyncio_reader():
    from tests.serving.fakes import FakeEngine
    from trtllm_dflash.serving.backends import TorchBackend
    from trtllm_dflash.serving.record import ServedRequest

    backend = TorchBackend(FakeEngine(max_batch_size=2))
    try:
        records = [ServedRequest(prompt_ids=[ord(c) for c in f"r{i}"], max_tokens=5, streaming=True)
                   for i in range(4)] + [ServedRequest(prompt="abc", max_tokens=6)]

        async def read(record):
            return [r async for r in record.aresults()]

        async def main():
            for record in records:
                backend.submit(record)
            return await asyncio.gather(*(read(r) for r in records))

        for i, got in enumerate(asyncio.run(main())):
            final = got[-1]
            assert final.finished and final.finish_reason == "length" and not final.error
            assert "".join(r.text for r in got) == ("r0r0r" if i == 0 else f"r{i}r{i}r" if i < 4 else "abcabc")
            ids = [t for r in got for t in r.token_ids]
            assert "".join(map(chr, ids)) == "".join(r.text for r in got)            # token_ids are deltas
            assert final.num_prompt_tokens == (2 if i < 4 else 3)
            assert final.num_output_tokens == len(ids) and final.num_draft_tokens > 0
            assert final.times_ns["arrival_time_ns"] <= final.times_ns["last_token_time_ns"]
        assert backend.health() == (True, "ok") and backend.metrics()["live_requests"] == 0
        with pytest.raises(DFlashError, match="sampling_param_top_p"):
            backend.submit(ServedRequest(prompt="x", top_p=2.0))
    finally:
        backend.shutdown()
