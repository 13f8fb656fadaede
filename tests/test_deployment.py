# SPDX-License-Identifier: Apache-2.0
"""Deployment: a real dflash-build output opened once, every accessor, every broken manifest as one line naming
the file and the fix, and a torch load that reads manifest.json and each config.json exactly once."""
from __future__ import annotations

import builtins
import io
import json
import shutil
from pathlib import Path

import pytest

from tests import fixtures_build as fb
from trtllm_dflash import build, build_config
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.deployment import FORMAT_VERSION, MANIFEST, Deployment
from trtllm_dflash.errors import DFlashError


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Real dflash-build outputs of one tiny Qwen3 stand-in: "torch" (CPU, tp 1, presharded, draft_policy adaptive),
    "tp2" (CPU, torch, tp 2, presharded) and "trtllm" (a TensorRT-LLM build)."""
    root = tmp_path_factory.mktemp("deployment")
    target = fb.write_target(root / "target", "qwen3")
    drafter = fb.write_zlab(target, root / "drafter")
    builds = {"torch": dict(gpu="cpu", presharded=True, draft_policy="adaptive"),
              "tp2": dict(gpu="cpu", tp_size=2, presharded=True),
              "trtllm": dict(backend="trtllm", gpu="h200")}
    return {name: build.build(build_config.BuildConfig(target=str(target), drafter=str(drafter), max_seq_len=512,
                                                       out=str(root / name), **kw), log=lambda *_: None)
            for name, kw in builds.items()}


def test_a_torch_build_exposes_what_its_manifest_says(built):
    path = built["torch"]
    d = Deployment.open(path)
    raw = json.loads((path / MANIFEST).read_text())
    assert d.path == path.absolute() and d.manifest == raw and d.manifest_path == path.absolute() / MANIFEST
    assert (d.backend, d.tp_size, d.ep_size, d.gpu) == ("torch", 1, 1, "cpu")
    assert d.runtime == raw["runtime"] and d.draft_policy == "adaptive"
    assert d.target_dir == d.path / "target" and (d.target_dir / "config.json").is_file()
    assert d.drafter_dir == d.path / "drafter" and d.drafter["format"] == raw["drafter"]["format"]
    assert d.target["source"] == raw["target"]["source"]
    assert d.rank_file(0) == d.path / "ranks" / "rank0.safetensors" and d.rank_file(1) is None
    assert d.trtllm == {} and d.llm_api_options is None and d.quant is None   # a CPU build has no TensorRT-LLM
    assert d.triton_repo == d.path / "triton" and (d.triton_repo / "tensorrt_llm" / "config.pbtxt").is_file()
    d.require_backend("torch", "the torch runtime", "-")
    with pytest.raises(DFlashError, match=r"backend: is 'torch'; TensorRT-LLM runs 'trtllm' builds\. Fix: rebuild"):
        d.require_backend("trtllm", "TensorRT-LLM", "rebuild")


def test_a_tensor_parallel_build_has_one_rank_file_per_rank(built):
    d = Deployment.open(built["tp2"])
    assert d.tp_size == 2 and d.draft_policy == "fixed"
    assert [d.rank_file(r) for r in range(3)] == [d.path / "ranks" / "rank0.safetensors",
                                                 d.path / "ranks" / "rank1.safetensors", None]


def test_runtime_config_is_the_manifests_settings_then_the_overrides(built):
    d = Deployment.open(built["torch"])
    cfg = d.runtime_config()
    want = d.runtime
    assert isinstance(cfg, RuntimeConfig)
    assert (cfg.max_batch_size, cfg.max_seq_len, cfg.block_size, cfg.dtype) == (
        want["max_batch_size"], 512, want["block_size"], want["dtype"])
    over = d.runtime_config({"max_batch_size": 3, "block_size": 1})
    assert (over.max_batch_size, over.block_size, over.max_seq_len) == (3, 1, 512)
    with pytest.raises(DFlashError, match=r"^max_draft: is not a runtime setting \(RuntimeConfig\)\. Fix: drop it$"):
        d.runtime_config({"max_draft": 3})


def test_a_trtllm_build_names_its_options_file(built):
    d = Deployment.open(built["trtllm"])
    assert d.backend == "trtllm" and d.gpu == "h200" and d.draft_policy == "fixed"   # no draft_policy written
    assert d.llm_api_options == d.path / "llm_api_options.yaml" and d.llm_api_options.is_file()
    assert d.trtllm["max_draft_len"] + 1 == d.runtime["block_size"] and d.rank_file(0) is None


def test_of_keeps_an_open_deployment_and_opens_a_path(built):
    d = Deployment.open(built["torch"])
    assert Deployment.of(d) is d and Deployment.of(str(built["torch"])) == d
    assert Deployment.is_deployment(built["torch"]) and not Deployment.is_deployment(built["torch"] / "target")


def test_write_stamps_the_format_and_round_trips(tmp_path):
    Deployment.write(tmp_path, {"backend": "torch", "format_version": 0, "runtime": {"max_batch_size": 2}})
    d = Deployment.open(tmp_path)
    assert d.manifest["format_version"] == FORMAT_VERSION and d.runtime == {"max_batch_size": 2}
    assert (d.tp_size, d.ep_size, d.drafter_dir) == (1, 1, None)
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST]     # the temporary file was renamed over it


def _one_line(err: pytest.ExceptionInfo, *words: str) -> str:
    text = str(err.value)
    assert "\n" not in text and ". Fix: " in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize("text, words", [
    ("{broken", ["is not valid JSON, or is truncated"]),
    ("[1, 2]", ["is a JSON list, not an object"]),
    ('{"format_version": 99, "backend": "torch"}', ["format_version: is 99, this version reads 1"]),
    ('{"backend": "torch"}', ["format_version: is None"]),
    ('{"format_version": 1, "backend": "vllm"}', ["backend: is 'vllm', not one of torch, trtllm"]),
    ('{"format_version": 1, "backend": "torch", "tp_size": 0}', ["tp_size: is 0, not a positive integer"]),
])
def test_a_bad_manifest_is_one_line_naming_the_file_and_the_fix(tmp_path, text, words):
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(DFlashError) as err:
        Deployment.open(tmp_path)
    assert _one_line(err, str(tmp_path / MANIFEST), *words).endswith("rebuild it with this version of dflash-build "
                                                                       "(--force)")


def test_a_truncated_manifest_of_a_real_build_is_one_line(built, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(built["torch"], copy, symlinks=True)
    whole = (copy / MANIFEST).read_bytes()
    (copy / MANIFEST).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DFlashError) as err:
        Deployment.open(copy)
    _one_line(err, str(copy / MANIFEST), "is truncated", "dflash-build (--force)")


def test_a_directory_without_a_manifest_is_one_line(tmp_path):
    with pytest.raises(DFlashError) as err:
        Deployment.open(tmp_path)
    _one_line(err, f"{tmp_path}: has no manifest.json", "pass a directory written by dflash-build")


def test_a_torch_load_reads_the_manifest_and_each_config_once(built, monkeypatch):
    """Engine.from_deployment on a path: one read of manifest.json, one of the target's and the drafter's
    config.json, however many places need what they say (rank file, draft policy, runtime settings, models)."""
    from trtllm_dflash.runtime.engine import Engine

    d = Deployment.open(built["torch"])
    reads = {p: 0 for p in (d.manifest_path, d.target_dir / "config.json", d.drafter_dir / "config.json")}

    real_open = io.open

    def counting_open(file, *args, **kwargs):   # every read ends here: open(), Path.read_text / read_bytes / open
        if isinstance(file, (str, Path)) and Path(file).absolute() in reads:
            reads[Path(file).absolute()] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    engine = Engine.from_deployment(str(built["torch"]), draft_policy="fixed", dtype="float32", device="cpu",
                                    max_batch_size=1, cuda_graphs=False)
    try:
        assert engine.block_size == d.runtime["block_size"] and engine.drafter is not None
    finally:
        engine.shutdown()
    assert reads == {p: 1 for p in reads}, reads


def test_a_torch_load_parses_each_config_once(built, monkeypatch):
    """The loader parses the target's and the drafter's config.json once each and hands the parsed configs to the
    checks and the models (none of them parses a dict again)."""
    from trtllm_dflash import model_config
    from trtllm_dflash.runtime.engine import Engine

    parses = {"target": 0, "drafter": 0}

    def counting(cls, who):
        parse = cls.from_hf.__func__

        def from_hf(klass, cfg):
            parses[who] += 1
            return parse(klass, cfg)
        monkeypatch.setattr(cls, "from_hf", classmethod(from_hf))

    for cls in (model_config.LlamaConfig, model_config.GptOssConfig):
        counting(cls, "target")
    counting(model_config.DrafterConfig, "drafter")
    engine = Engine.from_deployment(str(built["torch"]), draft_policy="fixed", dtype="float32", device="cpu",
                                    max_batch_size=1, cuda_graphs=False)
    try:
        assert engine.drafter is not None
    finally:
        engine.shutdown()
    assert parses == {"target": 1, "drafter": 1}, parses
