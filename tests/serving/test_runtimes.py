# SPDX-License-Identifier: Apache-2.0
import asyncio
import sys

import pytest

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving import launch


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


# The trtllm runtime's tests (a real dflash-build output, a strict fake tensorrt_llm): tests/test_trtllm.py


# ---- the torch runtime: the record interface the frontends code against ----------------------------

def test_torch_runtime_submit_record_usage_and_asyncio_reader():
    from tests.serving.fakes import FakeEngine
    from trtllm_dflash.serving.runtimes import TorchRuntime
    from trtllm_dflash.serving.record import ServedRequest

    runtime = TorchRuntime(FakeEngine(max_batch_size=2))
    try:
        records = [ServedRequest(prompt_ids=[ord(c) for c in f"r{i}"], max_tokens=5, streaming=True)
                   for i in range(4)] + [ServedRequest(prompt="abc", max_tokens=6)]

        async def read(record):
            return [r async for r in record.aresults()]

        async def main():
            for record in records:
                runtime.submit(record)
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
        assert runtime.health() == (True, "ok") and runtime.metrics()["live_requests"] == 0
        with pytest.raises(DFlashError, match="sampling_param_top_p"):
            runtime.submit(ServedRequest(prompt="x", top_p=2.0))
    finally:
        runtime.shutdown()


def test_torch_runtime_runs_the_deployments_draft_policy(tmp_path, tiny_target_with_tokenizer):
    """A deployment naming runtime.draft_policy adaptive is served adaptively (the Triton model and dflash-openai
    both load through TorchRuntime.from_deployment), and /metrics says which blocks ran."""
    from tests.serving.conftest import RUNTIME, make_deployment
    from trtllm_dflash.runtime.draft_policy import AdaptivePolicy
    from trtllm_dflash.deployment import Deployment
    from trtllm_dflash.serving.runtimes import TorchRuntime
    from trtllm_dflash.serving.record import ServedRequest

    d = make_deployment(tmp_path / "d", *tiny_target_with_tokenizer, runtime={**RUNTIME, "draft_policy": "adaptive"},
                        fill=False)
    runtime = TorchRuntime.from_deployment(Deployment.open(d))
    try:
        assert isinstance(runtime.engine.policy, AdaptivePolicy)
        record = ServedRequest(prompt_ids=[5, 6, 7], max_tokens=24, ignore_eos=True)
        runtime.submit(record)
        final = list(record.results())[-1]
        assert final.finished and not final.error and final.num_output_tokens == 24
        m = runtime.metrics()
        ran = {k: v for k, v in m.items() if k.startswith("steps_block_")}
        assert m["adaptive_policy"] == 1 and sum(ran.values()) == m["steps"] and f"steps_block_{m['last_block']}" in ran
    finally:
        runtime.shutdown()
