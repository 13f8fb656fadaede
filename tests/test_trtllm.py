# SPDX-License-Identifier: Apache-2.0
"""trtllm.py runs a deployment directory through tensorrt_llm.LLM, and so does the Triton model's
TrtllmRuntime (one path). TensorRT-LLM cannot be installed here, so a fake ``tensorrt_llm``
(tests/fake_tensorrt_llm.py) refuses every unknown or mistyped keyword, as TorchLlmArgs does."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests import fixtures_build as fb
from tests import fake_tensorrt_llm
from trtllm_dflash import build, build_config
from trtllm_dflash import trtllm
from trtllm_dflash.errors import DFlashError


@pytest.fixture
def fake_trtllm(monkeypatch):
    return fake_tensorrt_llm.install(monkeypatch)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    """(trtllm dir, torch dir) built from a tiny Qwen3 stand-in."""
    root = tmp_path_factory.mktemp("trtllm_backend")
    target = fb.write_target(root / "target", "qwen3")
    drafter = fb.write_zlab(target, root / "drafter")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        # The Triton repository is another stage's job (tested there); keep these builds independent of it.
        mp.setattr(build, "_fill_triton", lambda tmp, record: "skipped: not under test")
        for backend in ("trtllm", "torch"):
            cfg = build_config.BuildConfig(target=str(target), drafter=str(drafter), backend=backend, gpu="h200",
                                           max_seq_len=512, out=str(root / backend))
            out[backend] = build.build(cfg, log=lambda *_: None)
    return out["trtllm"], out["torch"]


def test_load_llm_passes_the_directory_as_trtllm_serve_would(fake_trtllm, deployments):
    directory, _ = deployments
    trtllm.load_llm(directory)
    kwargs = dict(fake_trtllm["llm_kwargs"])
    assert kwargs.pop("model") == str(directory / "target") and kwargs.pop("backend") == "pytorch"
    spec = kwargs["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["speculative_model"] == str(directory / "drafter")
    assert (spec["target_layer_ids"], spec["mask_token_id"], spec["max_draft_len"]) == ([0, 2, 3], 95, 15)
    assert spec["attention_backend"] == "FA4" and kwargs["attn_backend"] == "TRTLLM"


def test_overrides_and_a_moved_directory(fake_trtllm, deployments, tmp_path):
    directory, _ = deployments
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved, symlinks=True)
    trtllm.load_llm(moved, max_batch_size=2)
    kwargs = fake_trtllm["llm_kwargs"]
    assert kwargs["model"] == str(moved / "target") and kwargs["max_batch_size"] == 2
    assert kwargs["speculative_config"]["speculative_model"] == str(moved / "drafter")


def test_a_torch_build_is_refused(fake_trtllm, deployments):
    _, torch_dir = deployments
    with pytest.raises(DFlashError, match="is 'torch'; TensorRT-LLM runs 'trtllm' builds"):
        trtllm.load_llm(torch_dir)


def test_missing_tensorrt_llm_is_a_clear_error(monkeypatch, deployments):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)   # makes `import tensorrt_llm` raise ImportError
    with pytest.raises(DFlashError) as err:
        trtllm.load_llm(deployments[0])
    assert "trtllm needs TensorRT-LLM >=1.3.0rc15,<1.5" in str(err.value) and "NGC" in str(err.value)


def test_importing_trtllm_options_does_not_import_tensorrt_llm():
    import subprocess

    code = "import sys, trtllm_dflash.trtllm, trtllm_dflash.build; print('tensorrt_llm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False", out.stderr


# ---- the fake is as strict as TorchLlmArgs ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{"max_seq_length": 4096}, {"max_batch_size": "8"},
                                 {"kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_reuse": True}},
                                 {"speculative_config": {"decoding_type": "DFlash", "num_speculative_tokens": 7}}])
def test_the_fake_refuses_unknown_and_mistyped_fields(fake_trtllm, bad):
    import tensorrt_llm

    with pytest.raises(ValueError, match="Extra inputs|not a valid"):
        tensorrt_llm.LLM(model="m", backend="pytorch", **bad)


# ---- serving: the Triton model's TrtllmRuntime builds its LLM through the same merge ----------------------
def _served(directory: Path, tmp_path: Path) -> Path:
    """A copy of a real dflash-build output with its Triton repository, as dflash-serve would use it."""
    from trtllm_dflash.serving.repo import fill_triton

    served = tmp_path / "served"
    shutil.copytree(directory, served, symlinks=True)
    return fill_triton(served, json.loads((served / "manifest.json").read_text())) / "tensorrt_llm" / "1"


def test_serving_builds_the_llm_like_load_llm(fake_trtllm, deployments, tmp_path):
    from tests.serving.fakes import FakePbUtils, FakeRequest, triton_inputs
    from trtllm_dflash.serving.triton_model import DFlashModel

    served = _served(deployments[0], tmp_path).parents[2]
    trtllm.load_llm(served)
    via_load_llm = fake_trtllm.pop("llm_kwargs")
    model = DFlashModel(FakePbUtils, served / "triton" / "tensorrt_llm" / "1")
    assert fake_trtllm["llm_kwargs"] == via_load_llm          # one path: the same keywords, schema-checked
    assert via_load_llm["speculative_config"]["speculative_model"] == str(served.resolve() / "drafter")
    r = FakeRequest(triton_inputs("Hi", max_tokens=5, temperature=0.0, streaming=True, stop=["\n"], ignore_eos=True))
    model.execute([r])
    assert r.sender.final.wait(5)
    prompt, params, streaming = fake_trtllm["generate"][0]
    assert (prompt, streaming) == ("Hi", True)
    assert params.kwargs == {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True, "stop": ["\n"],
                             "return_perf_metrics": True}
    # the runtime's 3 updates: one response each, or fewer when the sender found several queued (it joins them)
    assert r.sender.text() == "Hello!" and 1 <= len(r.sender.responses) <= 3
    final = r.sender.responses[-1].outputs
    assert final["acceptance_rate"][0] == pytest.approx(0.5) and final["total_draft_tokens"].tolist() == [6]
    model.finalize()
    assert fake_trtllm["shutdown"]


def test_serving_refuses_an_options_file_off_the_schema(fake_trtllm, deployments, tmp_path):
    from tests.serving.fakes import FakePbUtils
    from trtllm_dflash.serving.triton_model import DFlashModel

    version = _served(deployments[0], tmp_path)
    options_file = version.parents[2] / trtllm.OPTIONS_FILE
    options = yaml.safe_load(options_file.read_text())
    options["speculative_config"]["num_speculative_tokens"] = 7            # vLLM's name
    options_file.write_text(yaml.safe_dump(options))
    with pytest.raises(DFlashError, match="speculative_config.num_speculative_tokens"):
        DFlashModel(FakePbUtils, version)
    assert "llm_kwargs" not in fake_trtllm


def test_serving_without_tensorrt_llm_says_so(monkeypatch, deployments, tmp_path):
    from tests.serving.fakes import FakePbUtils
    from trtllm_dflash.serving.triton_model import DFlashModel

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)   # import fails
    with pytest.raises(DFlashError, match="backend: trtllm needs TensorRT-LLM"):
        DFlashModel(FakePbUtils, _served(deployments[0], tmp_path))
