# SPDX-License-Identifier: Apache-2.0
"""BuildConfig: presets, precedence (defaults < preset < flags), and one clear error per bad value."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trtllm_dflash import build_config as bc
from trtllm_dflash.build import config_from_args
from trtllm_dflash.errors import DFlashError

PRESETS = sorted((Path(__file__).resolve().parents[1] / "build_configs").glob("*.yaml"))


def test_presets_exist_for_every_required_deployment():
    names = {p.stem for p in PRESETS}
    assert {"gpt-oss-120b_b300_tp8", "gpt-oss-120b_b200_tp8", "gpt-oss-120b_h200_tp8", "gpt-oss-20b_h100_tp1", "qwen3-8b_h100_tp1",
            "qwen3-8b_b200_tp1", "llama-3.1-8b_h100_tp1", "smollm2-135m_cpu_tp1"} <= names


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_loads_and_matches_its_name(preset):
    cfg = bc.make(bc.load_preset(preset))
    model, gpu, tp = preset.stem.rsplit("_", 2)
    # The name is a label for people; the values inside are what counts (never parsed from the name).
    assert (cfg.target, cfg.gpu, f"tp{cfg.tp_size}") == (model, gpu, tp)


def test_flags_override_the_preset_and_defaults_fill_the_rest():
    preset = next(p for p in PRESETS if p.stem == "gpt-oss-120b_b300_tp8")
    cfg, dry_run, force = config_from_args(["--config", str(preset), "--tp", "4", "--ep", "2", "--dry-run"])
    assert (cfg.tp_size, cfg.ep_size, cfg.gpu, cfg.max_batch_size) == (4, 2, "b300", 64)
    assert dry_run and not force
    cfg, _, _ = config_from_args(["--target", "qwen3-8b"])
    assert (cfg.tp_size, cfg.backend, cfg.max_draft_len) == (1, "torch", None)


def test_the_preset_named_after_target_gpu_and_tp_is_taken():
    """The README's one-line build (no --config) gets the H200 preset's values, not the generic defaults."""
    notes = []
    cfg, _, _ = config_from_args(["--tp", "8", "--target", "gpt-oss-120b", "--gpu", "h200"], notes)
    want = bc.make(bc.load_preset(bc.PRESET_DIR / "gpt-oss-120b_h200_tp8.yaml"))
    assert cfg == want and (cfg.backend, cfg.ep_size, cfg.max_batch_size, cfg.max_seq_len) == ("trtllm", 8, 64, 32768)
    assert cfg.draft_len_schedule and "gpt-oss-120b_h200_tp8.yaml" in notes[0]
    cfg, _, _ = config_from_args(["--target", "openai/gpt-oss-120b", "--gpu", "b200", "--tp", "8", "--ep", "2"])
    assert (cfg.backend, cfg.ep_size, cfg.max_batch_size) == ("trtllm", 2, 64)      # hub id too; a flag wins
    cfg, _, _ = config_from_args(["--tp", "8", "--target", "gpt-oss-120b", "--gpu", "h200", "--no_preset"])
    assert (cfg.backend, cfg.max_batch_size) == ("torch", 8)


def test_a_preset_for_another_backend_or_gpu_is_named_not_taken():
    notes = []
    cfg, _, _ = config_from_args(["--tp", "8", "--target", "gpt-oss-120b", "--gpu", "h200", "--backend", "torch"],
                                 notes)
    assert (cfg.backend, cfg.max_batch_size) == ("torch", 8) and "not used: it is for --backend trtllm" in notes[0]
    notes = []
    cfg, _, _ = config_from_args(["--tp", "4", "--target", "gpt-oss-120b", "--gpu", "h200"], notes)
    assert cfg.max_batch_size == 8 and "none for gpt-oss-120b on h200 at tp 4" in notes[0]
    assert "gpt-oss-120b_h200_tp8" in notes[0]


def test_bad_yaml_syntax_names_the_line(tmp_path):
    with pytest.raises(DFlashError) as err:
        bc.load_preset(write(tmp_path, "build:\n  target: qwen3-8b\n  tp_size: [1, 2\n"))
    msg = str(err.value)
    assert "\n" not in msg and "line 3, column 12" in msg and "expected ',' or ']'" in msg, msg
    with pytest.raises(DFlashError, match=r"line 2, column 12: mapping values are not allowed"):
        bc.load_preset(write(tmp_path, "build:\n  target: a: b\n"))


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        bc.BuildConfig(target="x").tp_size = 2


def write(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, field", [
    ("build:\n  target: qwen3-8b\n  tensor_parallel: 2\n", "build.tensor_parallel"),
    ("build:\n  target: qwen3-8b\nbenchmark:\n  x: 1\n", "benchmark"),
    ("target: qwen3-8b\n", "build:"),
    ("build: [1, 2\n", "not valid YAML"),
])
def test_bad_preset_files(tmp_path, text, field):
    with pytest.raises(DFlashError, match=field.replace(".", r"\.")):
        bc.load_preset(write(tmp_path, text))


def test_missing_preset_file(tmp_path):
    with pytest.raises(DFlashError, match="does not exist"):
        bc.load_preset(tmp_path / "nope.yaml")


@pytest.mark.parametrize("kw, field", [
    ({"target": ""}, "target"),
    ({"tp_size": 0}, "tp_size"),
    ({"ep_size": -1}, "ep_size"),
    ({"gpu": "a100"}, "gpu"),
    ({"backend": "vllm"}, "backend"),
    ({"dtype": "fp8"}, "dtype"),
    ({"max_seq_len": 1}, "max_seq_len"),
    ({"max_draft_len": 0}, "max_draft_len"),
    ({"free_gpu_memory_fraction": 1.5}, "free_gpu_memory_fraction"),
    ({"presharded": True, "backend": "trtllm"}, "presharded"),
    ({"backend": "trtllm", "gpu": "cpu"}, "backend"),
    ({"quant": "int4"}, "quant"),
    ({"mxfp4_moe": "dequant"}, "mxfp4_moe"),
    ({"mxfp4_moe": "triton", "backend": "trtllm"}, "mxfp4_moe"),
    ({"mxfp4_moe": "triton_kernels", "batch_invariant": True}, "mxfp4_moe"),
])
def test_bad_values_name_the_field(kw, field):
    with pytest.raises(DFlashError) as err:
        bc.BuildConfig(**{"target": "qwen3-8b", **kw})
    assert err.value.field == field
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_unknown_keyword_is_an_error():
    with pytest.raises(DFlashError, match="config"):
        bc.make({"target": "qwen3-8b", "bogus": 1})


def test_the_runtime_sizes_default_to_the_runtime_configs():
    # one default per setting: a deployment built without flags runs with what RuntimeConfig would pick, and
    # dflash-generate offers the same (RuntimeConfig owns them)
    from trtllm_dflash import generate
    from trtllm_dflash.config import RuntimeConfig
    built, runtime, args = bc.BuildConfig(target="x"), RuntimeConfig(), generate.parse_args([])
    for name in ("max_batch_size", "max_seq_len", "max_num_tokens", "dtype"):
        assert getattr(built, name) == getattr(runtime, name), name
    for name in ("max_batch_size", "max_seq_len", "dtype", "device"):
        assert getattr(args, name) == getattr(runtime, name), name
