# SPDX-License-Identifier: Apache-2.0
"""backends/trtllm.py runs a deployment directory through tensorrt_llm.LLM. TensorRT-LLM cannot be installed
here, so a fake ``tensorrt_llm`` checks every keyword it receives against the pinned TorchLlmArgs schema."""
from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest

from tests import fixtures_build as fb
from tests.test_llm_api_options import check_schema
from trtllm_dflash import build, build_config
from trtllm_dflash.backends import trtllm
from trtllm_dflash.errors import DFlashError


@pytest.fixture
def fake_trtllm(monkeypatch):
    """tensorrt_llm with LLM(**kwargs) and llmapi.llm_args.update_llm_args_with_extra_dict (YAML merge)."""
    seen = []

    class LLM:
        def __init__(self, **kwargs):
            model = kwargs.pop("model")
            assert kwargs.pop("backend") == "pytorch"
            check_schema(kwargs)
            seen.append((model, kwargs))

    def update_llm_args_with_extra_dict(llm_args, extra, extra_llm_api_options=None):
        return {**llm_args, **extra}

    root = types.ModuleType("tensorrt_llm")
    root.LLM = LLM
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    llm_args.update_llm_args_with_extra_dict = update_llm_args_with_extra_dict
    root.llmapi, llmapi.llm_args = llmapi, llm_args
    for name, mod in (("tensorrt_llm", root), ("tensorrt_llm.llmapi", llmapi), ("tensorrt_llm.llmapi.llm_args",
                                                                               llm_args)):
        monkeypatch.setitem(sys.modules, name, mod)
    return seen


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
    model, kwargs = fake_trtllm[-1]
    assert model == str(directory / "target")
    spec = kwargs["speculative_config"]
    assert spec["decoding_type"] == "DFlash" and spec["speculative_model"] == str(directory / "drafter")
    assert (spec["target_layer_ids"], spec["mask_token_id"], spec["max_draft_len"]) == ([0, 2, 3], 95, 15)
    assert spec["attention_backend"] == "FA4" and kwargs["attn_backend"] == "TRTLLM"


def test_overrides_and_a_moved_directory(fake_trtllm, deployments, tmp_path):
    directory, _ = deployments
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved, symlinks=True)
    trtllm.load_llm(moved, max_batch_size=2)
    model, kwargs = fake_trtllm[-1]
    assert model == str(moved / "target") and kwargs["max_batch_size"] == 2
    assert kwargs["speculative_config"]["speculative_model"] == str(moved / "drafter")


def test_a_torch_build_is_refused(fake_trtllm, deployments):
    _, torch_dir = deployments
    with pytest.raises(DFlashError, match="built for the torch backend"):
        trtllm.load_llm(torch_dir)


def test_missing_tensorrt_llm_is_a_clear_error(monkeypatch, deployments):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)   # makes `import tensorrt_llm` raise ImportError
    with pytest.raises(DFlashError) as err:
        trtllm.load_llm(deployments[0])
    assert "TensorRT-LLM is not installed" in str(err.value) and "NGC" in str(err.value)


def test_importing_the_backend_does_not_import_tensorrt_llm():
    import subprocess

    code = "import sys, trtllm_dflash.backends.trtllm, trtllm_dflash.build; print('tensorrt_llm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr
