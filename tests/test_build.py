# SPDX-License-Identifier: Apache-2.0
"""dflash-build end to end on tiny stand-in checkpoints: every preset builds, real ids dry-run with no
network, every bad input fails with one line and leaves nothing in --out, and killed builds never look done."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from tests import fixtures_build as fb
from tests.test_llm_api_options import check_schema
from trtllm_dflash import cli
from trtllm_dflash.checkpoints import manifest
from trtllm_dflash.deployment import Deployment
from trtllm_dflash.errors import DFlashError

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "build_configs").glob("*.yaml"))
# Each preset's stand-in: a tiny target of the same architecture and a drafter in some known format.
STAND_INS = {
    "gpt-oss-120b_b300_tp8": ("gpt_oss", "z-lab"), "gpt-oss-120b_b200_tp8": ("gpt_oss", "specforge"),
    "gpt-oss-120b_h200_tp8": ("gpt_oss", "modelopt"),
    "gpt-oss-20b_h100_tp1": ("gpt_oss", "speculators"), "qwen3-8b_h100_tp1": ("qwen3", "specforge"),
    "qwen3-8b_b200_tp1": ("qwen3", "z-lab"), "llama-3.1-8b_h100_tp1": ("llama", "speculators"),
    "smollm2-135m_cpu_tp1": ("llama", "untrained"),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """ckpt(arch, fmt) -> (target_dir, drafter spec), built once per module."""
    root = tmp_path_factory.mktemp("standins")
    cache: dict = {}

    def get(arch: str, fmt: str = "z-lab"):
        if arch not in cache:
            cache[arch] = fb.write_target(root / arch / "target", arch)
        if (arch, fmt) not in cache:
            cache[arch, fmt] = ("untrained" if fmt == "untrained"
                                else str(fb.write_drafter(fmt, cache[arch], root / arch / fmt)))
        return cache[arch], cache[arch, fmt]
    return get


@pytest.fixture(autouse=True)
def triton_hook(monkeypatch):
    """A stand-in trtllm_dflash.serving.repo (another stage's module), recording what it was given."""
    calls = []

    def fill_triton(out_tmp_dir, record):
        calls.append((Path(out_tmp_dir), record))
        (Path(out_tmp_dir) / "triton").mkdir()
        (Path(out_tmp_dir) / "triton" / "model.yaml").write_text(f"deployment_dir: {record['out']}\n")

    fake = types.ModuleType("trtllm_dflash.serving.repo")
    fake.fill_triton = fill_triton
    monkeypatch.setitem(sys.modules, "trtllm_dflash.serving.repo", fake)
    import trtllm_dflash.serving as serving

    monkeypatch.setattr(serving, "repo", fake, raising=False)
    return calls


def run(argv, capsys):
    capsys.readouterr()   # drop what building the stand-in checkpoints printed
    rc = cli.build_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def tiny_args(ckpt, out, arch="llama", fmt="z-lab", *extra):
    target, drafter = ckpt(arch, fmt)
    return ["--target", target, "--drafter", drafter, "--max_seq_len", 512, "--out", out, *extra]


def test_every_preset_has_a_stand_in():
    assert {p.stem for p in PRESETS} == set(STAND_INS)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_builds_with_stand_in_checkpoints(ckpt, tmp_path, capsys, preset, triton_hook):
    arch, fmt = STAND_INS[preset.stem]
    out = tmp_path / "deploy"
    rc, stdout, err = run(["--config", preset, *tiny_args(ckpt, out, arch, fmt)], capsys)
    assert rc == 0, err
    m = Deployment.open(out).manifest
    preset_cfg = yaml.safe_load(preset.read_text())["build"]
    assert (m["backend"], m["gpu"], m["tp_size"]) == (preset_cfg["backend"], preset_cfg["gpu"], preset_cfg["tp_size"])
    assert m["drafter"]["format"] == ("z-lab" if fmt == "untrained" else fmt)
    assert m["runtime"]["block_size"] == preset_cfg["max_draft_len"] + 1
    assert not manifest.verify(out, m)
    assert (out / "target" / "config.json").stat().st_nlink >= 2 and (out / "drafter" / "model.safetensors").is_file()
    assert m["target"]["files"] == "hardlink" and m["self_contained"]
    assert triton_hook and triton_hook[-1][1]["out"] == str(out) and "triton/model.yaml" in m["files"]
    if preset_cfg["gpu"] == "cpu":
        assert not (out / "llm_api_options.yaml").exists()
        assert "dflash-generate --deployment_dir" in stdout and "UNTRAINED" in stdout
        assert m["drafter"]["untrained"] and m["validation"]["drafter trained"].startswith("warning")
    else:
        opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
        check_schema(opts)
        assert opts["tensor_parallel_size"] == preset_cfg["tp_size"]
        assert opts["speculative_config"]["speculative_model"] == str(out / "drafter")
        assert ("moe_config" in opts) == (arch == "gpt_oss")
        assert f"trtllm-serve {out}/target" in stdout and "trtllm-bench" in stdout


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_real_ids_dry_run_without_network(tmp_path, capsys, monkeypatch, preset):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    out = tmp_path / "deploy"
    rc, stdout, err = run(["--config", preset, "--out", out, "--dry_run"], capsys)
    assert rc == 0, err
    assert "dry run: nothing downloaded or written" in stdout and not out.exists()
    if "--- llm_api_options.yaml ---" in stdout:
        opts = yaml.safe_load(stdout.split("--- llm_api_options.yaml ---")[1].split("\ndry run")[0])
        check_schema(opts)
        assert opts["tensor_parallel_size"] == yaml.safe_load(preset.read_text())["build"]["tp_size"]


# The dense presets' TensorRT-LLM fields, field by field (the gpt-oss presets: tests/runtime/test_gpt_oss.py).
DENSE_BASE = {"tensor_parallel_size": 1, "dtype": "auto", "enable_attention_dp": False, "max_num_tokens": 8192,
              "max_seq_len": 8192, "trust_remote_code": False, "attn_backend": "TRTLLM",
              "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False}}
DENSE_PRESETS = {
    "qwen3-8b_h100_tp1": {**DENSE_BASE, "max_batch_size": 32,
                          "cuda_graph_config": {"enable_padding": True, "max_batch_size": 32},
                          "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7,
                                                 "target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669,
                                                 "attention_backend": "FA4"}},
    "qwen3-8b_b200_tp1": {**DENSE_BASE, "max_batch_size": 64,
                          "cuda_graph_config": {"enable_padding": True, "max_batch_size": 64},
                          "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 7,
                                                 "target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669,
                                                 "attention_backend": "TRTLLM"}},
}


@pytest.mark.parametrize("preset", DENSE_PRESETS)
def test_dense_presets_field_by_field(preset, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    rc, stdout, err = run(["--config", ROOT / "build_configs" / f"{preset}.yaml", "--out", tmp_path / "d",
                           "--dry_run"], capsys)
    assert rc == 0, err
    opts = yaml.safe_load(stdout.split("--- llm_api_options.yaml ---")[1].split("\ndry run")[0])
    assert opts["speculative_config"].pop("speculative_model") == str(tmp_path / "d" / "drafter")
    assert opts == DENSE_PRESETS[preset]
    want = "1.3.0rc27" if "h100" in preset else "1.3.0rc15"     # FA4 on Hopper
    assert f"TensorRT-LLM >={want},<1.5 (schema 1.4.0rc1)" in stdout
    if preset == "qwen3-8b_h100_tp1":   # measured step costs: the full draft pays at every batch size up to 32
        assert "draft_len_schedule none needed: our policy's cost table" in stdout and "-:" not in stdout


def test_hopper_presets_use_fa4_drafter_attention():
    for preset in PRESETS:
        cfg = yaml.safe_load(preset.read_text())["build"]
        if cfg["gpu"] in ("h100", "h200"):
            assert cfg["attention_backend"] == "FA4", preset.name


def test_tensorrt_llm_1_4_fields_reach_the_yaml_and_the_manifest(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    rc, stdout, err = run(tiny_args(ckpt, out, "llama", "z-lab", "--backend", "trtllm", "--max_batch_size", "16",
                                    "--max_draft_len", "7", "--draft_len_schedule", "1:7,4:5,16:2",
                                    "--use_rejection_sampling", "--enable_block_reuse"),
                          capsys)
    assert rc == 0, err
    opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    check_schema(opts)
    spec = opts["speculative_config"]
    assert spec["draft_len_schedule"] == {1: 7, 4: 5, 16: 2} and "max_concurrency" not in spec
    assert spec["use_rejection_sampling"] is True and spec["context_recompute_tail"] == 32
    assert opts["kv_cache_config"]["enable_block_reuse"] is True and spec["attention_backend"] == "FA4"
    m = Deployment.open(out).manifest["trtllm"]
    assert (m["versions"], m["min_version"], m["schema"]) == (">=1.4.0rc1,<1.5", "1.4.0rc1", "1.4.0rc1")
    assert m["draft_len_schedule"] == {"1": 7, "4": 5, "16": 2}     # JSON keys are strings
    assert "TensorRT-LLM >=1.4.0rc1,<1.5" in stdout


BAD_1_4 = {  # flags -> field named in the one-line error
    "schedule_not_starting_at_max": (["--draft_len_schedule", "1:5,8:2"], "draft_len_schedule"),
    "schedule_syntax": (["--draft_len_schedule", "1=7"], "draft_len_schedule"),
    "schedule_beyond_batch": (["--draft_len_schedule", "1:15,64:2"], "draft_len_schedule"),
    "tail_without_reuse": (["--context_recompute_tail", "16"], "context_recompute_tail"),
    "tail_zero": (["--enable_block_reuse", "--context_recompute_tail", "0"], "context_recompute_tail"),
    "draft_len_at_block_size": (["--max_draft_len", "16"], "max_draft_len"),
    "trtllm_field_on_torch": (["--backend", "torch", "--max_concurrency", "4"], "backend"),
    "schedule_and_max_concurrency": (["--draft_len_schedule", "1:15,8:3", "--max_concurrency", "4"], "max_concurrency"),
    "adaptive_on_trtllm": (["--draft_policy", "adaptive"], "draft_policy"),
    "adaptive_with_tp": (["--backend", "torch", "--tp", "2", "--draft_policy", "adaptive"], "draft_policy"),
    "acceptance_rate_1": (["--draft_acceptance_rate", "1.0"], "draft_acceptance_rate"),
}


@pytest.mark.parametrize("case", BAD_1_4)
def test_bad_tensorrt_llm_1_4_settings_fail_with_one_line(ckpt, tmp_path, capsys, case):
    flags, field = BAD_1_4[case]
    extra = flags if "--backend" in flags else ["--backend", "trtllm", *flags]
    rc, _, err = run(tiny_args(ckpt, tmp_path / "d", "llama", "z-lab", *extra), capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {field}"), err
    assert not (tmp_path / "d").exists()


def test_gpt_oss_120b_b300_dry_run_prints_plan_and_yaml(capsys):
    rc, stdout, _ = run(["--config", ROOT / "build_configs" / "gpt-oss-120b_b300_tp8.yaml", "--dry-run"], capsys)
    assert rc == 0
    assert "tensor_parallel_size: 8" in stdout and "decoding_type: DFlash" in stdout
    assert "GptOssForCausalLM: 36 layers" in stdout and "drafter attention TRTLLM  moe TRTLLM" in stdout


BAD = {  # name: (arch, drafter format, extra flags, config edits, expected field in the message)
    "tp_heads": ("llama", "z-lab", ["--tp", "3"], {}, "tp_size"),
    "ep_on_dense": ("llama", "z-lab", ["--ep", "2", "--tp", "2"], {}, "ep_size"),
    "ep_not_dividing_tp": ("gpt_oss", "z-lab", ["--backend", "trtllm", "--tp", "8", "--ep", "3"], {}, "ep_size"),
    "ep_not_dividing_experts": ("gpt_oss", "z-lab", ["--backend", "trtllm", "--tp", "4", "--ep", "4"],
                                {"target": {"num_local_experts": 6}}, "ep_size"),
    "layer_ids": ("llama", "z-lab", [], {"drafter": {"dflash_config": {"target_layer_ids": [0, 4]}}},
                  "target_layer_ids"),
    "mask_id": ("llama", "z-lab", [], {"drafter": {"dflash_config": {"mask_token_id": 96}}}, "mask_token_id"),
    "hidden": ("llama", "z-lab", [], {"drafter": {"hidden_size": 128}}, "hidden_size"),
    "vocab": ("llama", "z-lab", [], {"drafter": {"vocab_size": 100}}, "vocab_size"),
    "draft_len": ("llama", "z-lab", ["--max_draft_len", "16"], {}, "max_draft_len"),
    "architecture": ("llama", "z-lab", ["--backend", "trtllm"], {"target": {"architectures": ["Gemma3ForCausalLM"]}},
                     "target architecture"),
    "attention_on_hopper": ("llama", "z-lab", ["--backend", "trtllm", "--attention_backend", "TRTLLM"], {},
                            "attention_backend"),
    "moe_on_hopper": ("gpt_oss", "z-lab", ["--backend", "trtllm", "--moe_backend", "TRTLLM"], {}, "moe_backend"),
    "torch_architecture": ("llama", "z-lab", ["--backend", "torch"], {"target": {"architectures": ["Gemma3ForCausalLM"]}},
                           "the torch runtime does not support Gemma3ForCausalLM"),
    "trtllm_on_cpu": ("llama", "z-lab", ["--backend", "trtllm", "--gpu", "cpu"], {}, "backend"),
    "seq_len": ("llama", "z-lab", ["--max_seq_len", "4096"], {}, "max_seq_len"),
    "num_tokens": ("llama", "z-lab", ["--backend", "trtllm", "--max_num_tokens", "64"], {}, "max_num_tokens"),
    "quant": ("llama", "z-lab", ["--quant", "nvfp4"], {}, "quant"),   # NVFP4 on the default h100
    "format": ("llama", "z-lab", [], {"drafter": {"dflash_config": None, "architectures": ["LlamaForCausalLM"]}},
               "z-lab, modelopt, speculators, specforge"),
    "own_lm_head": ("llama", "own_lm_head", [], {}, "lm_head.weight"),
    "pickle_target": ("llama", "z-lab", [], {"pickle_target": True}, "pickle"),
}


def _edited(src: Path, dst: Path, edits: dict) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        os.symlink(f.resolve(), dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    for key, value in edits.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        elif value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("case", BAD)
def test_bad_inputs_fail_with_one_line_and_leave_nothing(ckpt, tmp_path, capsys, case):
    arch, fmt, flags, edits, field = BAD[case]
    target, drafter = ckpt(arch, "z-lab")
    if fmt == "own_lm_head":
        drafter = fb.to_speculators(Path(drafter), Path(target), tmp_path / "spec", own_lm_head=True)
    if "target" in edits:
        target = _edited(Path(target), tmp_path / "t", edits["target"])
    if "drafter" in edits:
        drafter = _edited(Path(drafter), tmp_path / "d", edits["drafter"])
    if edits.get("pickle_target"):
        import torch
        from safetensors.torch import load_file

        src, target = Path(target), tmp_path / "pt"
        target.mkdir()
        (target / "config.json").write_text((src / "config.json").read_text())
        torch.save(load_file(str(src / "model.safetensors")), target / "pytorch_model.bin")
    out = tmp_path / "deploy"
    rc, _, err = run(["--target", target, "--drafter", drafter, "--max_seq_len", 512, "--out", out, *flags], capsys)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Fix:" in err
    assert field in err
    assert not out.exists() and not list(tmp_path.glob(".deploy.*"))


def test_not_a_deployment_directory_is_never_replaced(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    rc, _, err = run(tiny_args(ckpt, out, "llama", "z-lab", "--force"), capsys)
    assert rc == 2 and "not a deployment directory" in err
    assert (out / "precious.txt").read_text() == "keep me"


def test_rebuild_reuses_then_refuses_then_forces(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    assert run(tiny_args(ckpt, out), capsys)[0] == 0
    stamp = (out / "manifest.json").stat().st_mtime_ns
    rc, stdout, _ = run(tiny_args(ckpt, out), capsys)
    assert rc == 0 and "up to date" in stdout and (out / "manifest.json").stat().st_mtime_ns == stamp
    rc, _, err = run(tiny_args(ckpt, out, "llama", "z-lab", "--max_batch_size", "2"), capsys)
    assert rc == 2 and "--force" in err and Deployment.open(out).manifest["runtime"]["max_batch_size"] == 8
    rc, _, _ = run(tiny_args(ckpt, out, "llama", "z-lab", "--max_batch_size", "2", "--force"), capsys)
    assert rc == 0 and Deployment.open(out).manifest["runtime"]["max_batch_size"] == 2
    assert not list(tmp_path.glob(".deploy.*"))


def test_bytecode_of_a_recorded_module_is_not_a_change_but_any_other_file_is(tmp_path):
    """Plain tritonserver on <dir>/triton leaves the model's __pycache__ (its stub ignores PYTHONDONTWRITEBYTECODE):
    inspect and the rebuild check still verify the deployment; a stray file or a changed model.py still fails."""
    model = tmp_path / "triton" / "tensorrt_llm" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text("x = 1\n")
    record = {"files": manifest.hash_tree(tmp_path)}
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert manifest.verify(tmp_path, record) == []
    (model / "__pycache__" / "other.cpython-311.pyc").write_bytes(b"\0")
    (model / "notes.txt").write_text("x")
    assert manifest.verify(tmp_path, record) == [
        "triton/tensorrt_llm/1/__pycache__/other.cpython-311.pyc: not in the manifest",
        "triton/tensorrt_llm/1/notes.txt: not in the manifest"]


def test_manifest_contents(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    assert run(tiny_args(ckpt, out, "qwen3", "specforge", "--backend", "trtllm", "--gpu", "b200"), capsys)[0] == 0
    m = json.loads((out / "manifest.json").read_text())
    for key in ("format_version", "backend", "tp_size", "ep_size", "gpu", "runtime", "target", "drafter", "files",
                "versions", "validation"):
        assert key in m, key
    assert m["runtime"] == {"max_batch_size": 8, "max_seq_len": 512, "block_size": 16, "dtype": "auto"}
    assert m["target"]["path"] == "target" and m["target"]["architecture"] == "Qwen3ForCausalLM"
    assert m["drafter"]["path"] == "drafter" and m["drafter"]["format"] == "specforge"
    assert m["trtllm"]["attention_backend"] == "TRTLLM" and m["versions"]["torch"]
    assert m["validation"].pop("target tokenizer").startswith("warning")   # tiny stand-ins have none
    assert all(v == "ok" for v in m["validation"].values())
    assert set(m["files"]) == set(manifest.list_files(out))
    assert all(len(h) == 64 for h in m["files"].values())


def test_inspect_summarises_and_catches_tampering(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    assert run(tiny_args(ckpt, out, "llama", "z-lab", "--backend", "trtllm"), capsys)[0] == 0
    rc, stdout, _ = run(["inspect", out], capsys)
    assert rc == 0 and "verified sha256" in stdout and "trtllm-serve" in stdout and "format z-lab" in stdout
    from trtllm_dflash.provenance import checkpoint_digest   # inspect prints what results files record
    for role in ("target", "drafter"):
        assert f"{role} sha256 {checkpoint_digest(out / role)['sha256']}" in stdout
    (out / "drafter" / "config.json").write_text("{}")
    rc, _, err = run(["inspect", out], capsys)
    assert rc == 2 and "drafter/config.json: sha256 mismatch" in err
    rc, _, err = run(["inspect", tmp_path], capsys)
    assert rc == 2 and "no manifest.json" in err


def test_presharded_ranks_for_the_torch_backend(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    assert run(tiny_args(ckpt, out, "llama", "z-lab", "--tp", "2", "--presharded"), capsys)[0] == 0
    m = Deployment.open(out).manifest
    assert m["presharded"] and {"ranks/rank0.safetensors", "ranks/rank1.safetensors"} <= set(m["files"])
    with safe_open(str(out / "ranks" / "rank1.safetensors"), "pt") as f:
        names = list(f.keys())
        q = f.get_slice("target.model.layers.0.self_attn.q_proj.weight").get_shape()
    assert any(n.startswith("drafter.layers.0.") for n in names) and q == [32, 64]   # 4 heads x 16 / 2 ranks


def test_presharded_ranks_replicate_kv_heads_past_their_count(ckpt, tmp_path, capsys):
    """--tp 4 over the stand-in's 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 KV head 1 (one query head each)."""
    import torch

    target, _ = ckpt("llama")
    assert json.loads((Path(target) / "config.json").read_text())["num_key_value_heads"] == 2
    out = tmp_path / "deploy"
    assert run(tiny_args(ckpt, out, "llama", "z-lab", "--tp", "4", "--presharded"), capsys)[0] == 0
    name = "target.model.layers.0.self_attn.k_proj.weight"
    with safe_open(str(Path(target) / "model.safetensors"), "pt") as f:
        k = f.get_tensor(name.removeprefix("target."))
    ranks = []
    for r in range(4):
        with safe_open(str(out / "ranks" / f"rank{r}.safetensors"), "pt") as f:
            ranks.append((f.get_tensor(name), f.get_slice("target.model.layers.0.self_attn.q_proj.weight").get_shape()))
    half = k.shape[0] // 2
    assert [torch.equal(t, k[:half]) for t, _ in ranks] == [True, True, False, False]
    assert [torch.equal(t, k[half:]) for t, _ in ranks] == [False, False, True, True]
    assert all(q == [16, 64] for _, q in ranks)   # 4 heads x 16 / 4 ranks


def test_interrupted_build_leaves_nothing(ckpt, tmp_path, capsys, monkeypatch):
    def boom(_root):
        raise KeyboardInterrupt

    monkeypatch.setattr(manifest, "hash_tree", boom)
    out = tmp_path / "deploy"
    rc, _, err = run(tiny_args(ckpt, out), capsys)
    assert rc == 130 and not out.exists() and not list(tmp_path.glob(".deploy.*"))


KILL = """
import os, signal, sys
from trtllm_dflash import build
from trtllm_dflash.deployment import Deployment
Deployment.write = staticmethod(lambda directory, record: os.kill(os.getpid(), signal.SIGKILL))
build.main(sys.argv[1:])
"""


def test_killed_build_never_looks_complete_and_is_cleaned_up(ckpt, tmp_path, capsys):
    out = tmp_path / "deploy"
    args = [str(a) for a in tiny_args(ckpt, out)]
    proc = subprocess.run([sys.executable, "-c", KILL, *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9
    assert not out.exists()
    leftovers = list(tmp_path.glob(".deploy.tmp-*"))
    assert leftovers and not (leftovers[0] / "manifest.json").exists()
    assert run(args, capsys)[0] == 0 and Deployment.open(out).manifest
    assert not list(tmp_path.glob(".deploy.tmp-*"))


def test_module_entry_point_and_help():
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.build", "--help"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0
    for text in ("--tp_size TP_SIZE, --tp TP_SIZE", "--dry_run, --dry-run", "examples:", "(default: 1)",
                 "dflash-build inspect", "parallelism and hardware"):
        assert text in proc.stdout, text


# ---- the torch backend runs a built directory exactly like the runtime run directly -------------------------
RUN_ENGINE = """
import json, sys
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import exit_code
from trtllm_dflash.runtime.engine import Engine
how, out, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
if how == "deployment":
    engine = Engine.from_deployment(sys.argv[4])
else:
    engine = Engine.from_dirs(sys.argv[4], sys.argv[5], RuntimeConfig(max_batch_size=8, max_seq_len=512,
                              block_size=16), tp_size=tp)
if engine.tp.rank != 0:
    engine.follow(close=False)
else:
    reqs = engine.generate([[1, 5, 9, 13], [1, 7, 7, 2, 40, 41]], SamplingParams(max_new_tokens=24, ignore_eos=True))
    engine.shutdown(close=False)
    json.dump([r.output_ids for r in reqs], open(out, "w"))
sys.exit(exit_code(lambda argv: 0))  # leave a TP job the way the console scripts do: together, once rank 0 wrote
"""


def _engine_tokens(tmp_path, tp, *args):
    out = tmp_path / f"tokens-{args[0]}.json"
    cmd = [sys.executable, "-c", RUN_ENGINE, args[0], str(out), str(tp), *map(str, args[1:])]
    if tp > 1:
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(tp), *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("tp", [1, 2])
def test_torch_backend_runs_the_directory_like_the_runtime(ckpt, tmp_path, capsys, tp):
    """A tiny Llama stand-in (4 heads / 2 KV heads, so TP 2 divides), pre-sharded ranks at TP 2."""
    target, drafter = ckpt("llama", "z-lab")
    out = tmp_path / "deploy"
    flags = ["--tp", str(tp)] + (["--presharded"] if tp > 1 else [])
    assert run(tiny_args(ckpt, out, "llama", "z-lab", *flags), capsys)[0] == 0
    got = _engine_tokens(tmp_path, tp, "deployment", out)
    want = _engine_tokens(tmp_path, tp, "direct", target, drafter)
    assert got == want and all(len(t) == 24 for t in got)


@pytest.mark.slow
def test_smollm2_directory_runs_with_the_same_tokens_as_the_runtime(tmp_path, capsys):
    """The real demo: packaged SmolLM2-135M-Instruct + the shipped drafter. (TP 2 cannot split its 9 heads /
    3 KV heads, so its TP test above uses a stand-in.)"""
    from trtllm_dflash.checkpoints import packaged
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    out = tmp_path / "smollm2"
    rc, stdout, err = run(["--config", ROOT / "build_configs" / "smollm2-135m_cpu_tp1.yaml", "--out", out], capsys)
    assert rc == 0, err
    assert "UNTRAINED" not in stdout and not Deployment.open(out).manifest["drafter"]["untrained"]
    params = SamplingParams(max_new_tokens=16)
    deployed = Engine.from_deployment(out)
    prompt = deployed.tokenizer.encode("The capital of France is")
    got = deployed.generate([prompt], params)[0].output_ids
    deployed.shutdown()
    direct = Engine.from_dirs(packaged.smollm2_target_dir(), out / "drafter",
                              RuntimeConfig(max_batch_size=4, max_seq_len=2048, block_size=16))
    want = direct.generate([prompt], params)[0].output_ids
    direct.shutdown()
    assert got == want and len(got) > 3


# ---- memory: weights + KV cache must fit the GPUs of the hardware profile ---------------------------------
@pytest.mark.parametrize("source, params", [("openai/gpt-oss-120b", 116.8e9), ("openai/gpt-oss-20b", 20.9e9),
                                            ("Qwen/Qwen3-8B", 8.19e9), ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9)])
def test_weight_count_matches_the_published_parameter_counts(source, params):
    """Model cards: gpt-oss 116.8B / 20.9B total parameters, Qwen3-8B 8.2B, Llama 3.1 8B 8.03B."""
    from trtllm_dflash.checkpoints import memory_fit, resolve

    got = memory_fit.weight_bits(resolve.public_config(source), dtype_bits=16, expert_bits=None, quant=None) / 16
    assert got == pytest.approx(params, rel=0.02)


def test_gpt_oss_experts_stay_mxfp4_on_every_gpu_backend(tmp_path, capsys, monkeypatch):
    """The torch runtime keeps MXFP4 experts packed on CUDA (mxfp4_moe auto), as TensorRT-LLM does: the memory
    check counts 4.25 bits an expert weight for both, so one H100 holds gpt-oss-120b's ~61 GiB either way."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for backend in ("torch", "trtllm"):
        rc, out, err = run(["--target", "gpt-oss-120b", "--gpu", "h100", "--backend", backend, "--dry_run"], capsys)
        assert rc == 0, err
        assert "memory   per GPU: weights 62.2 GiB" in out, out    # ~61 GiB target + the drafter
    rc, out, err = run(["--target", "gpt-oss-120b", "--gpu", "h100", "--tp", "4", "--dry_run"], capsys)
    assert rc == 0 and "memory   per GPU: weights 15.5 GiB" in out, out


def test_mxfp4_moe_triton_kernels_counts_the_second_expert_copy_and_reaches_the_manifest(ckpt, tmp_path, capsys,
                                                                                      monkeypatch):
    """--mxfp4_moe triton_kernels (torch backend, gpt-oss): the memory check counts the experts twice (the library's
    copy), the plan says it, the manifest's runtime carries it to RuntimeConfig; elsewhere a one-line error."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    rc, out, err = run(["--target", "gpt-oss-120b", "--gpu", "h200", "--backend", "torch", "--mxfp4_moe",
                        "triton_kernels", "--dry_run"], capsys)
    assert rc == 0, err
    assert "mxfp4_moe triton_kernels" in out and "memory   per GPU: weights 118.9 GiB" in out, out
    rc, _, err = run(["--target", "gpt-oss-120b", "--gpu", "h100", "--backend", "torch", "--mxfp4_moe",
                      "triton_kernels", "--dry_run"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "twice (--mxfp4_moe triton_kernels)" in err and "--tp_size 2" in err
    for args, words in ((["--target", "qwen3-8b", "--gpu", "h100", "--mxfp4_moe", "triton"], "is for gpt-oss"),
                        (["--target", "gpt-oss-20b", "--gpu", "h100", "--backend", "trtllm", "--mxfp4_moe", "triton"],
                         "moe_backend"),
                        (["--target", "gpt-oss-20b", "--gpu", "h100", "--backend", "torch", "--ep", "2", "--tp", "2",
                          "--mxfp4_moe", "triton_kernels"], "whole experts on each rank")):
        rc, _, err = run([*args, "--dry_run", "--no_preset"], capsys)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("error: mxfp4_moe: ") and words in err, err
    out_dir = tmp_path / "tk"
    rc, _, err = run(tiny_args(ckpt, out_dir, "gpt_oss", "z-lab", "--gpu", "h100", "--backend", "torch",
                               "--mxfp4_moe", "triton_kernels"), capsys)
    assert rc == 0, err
    dep = Deployment.open(out_dir)
    assert dep.manifest["runtime"]["mxfp4_moe"] == "triton_kernels"
    assert dep.runtime_config().mxfp4_moe == "triton_kernels"


def test_weights_too_large_for_one_gpu_name_the_tp_size_that_fits():
    from trtllm_dflash.checkpoints import memory_fit, resolve

    target = resolve.public_config("openai/gpt-oss-120b")
    drafter = resolve.public_config("z-lab/gpt-oss-120b-DFlash")
    with pytest.raises(DFlashError) as err:
        memory_fit.check(target, drafter, gpu_name="small", memory_gib=40, tp_size=1, dtype="auto", quant=None,
                         max_batch_size=1, max_seq_len=2048, free_gpu_memory_fraction=0.8)
    msg = str(err.value)
    assert msg.startswith("memory: the weights need 62 GiB (MXFP4 experts kept 4-bit)") and "--tp_size 2" in msg


def test_the_kv_cache_must_hold_one_full_sequence():
    from trtllm_dflash.checkpoints import memory_fit, resolve

    target, drafter = resolve.public_config("Qwen/Qwen3-8B"), resolve.public_config("z-lab/Qwen3-8B-DFlash-b16")
    kw = dict(gpu_name="h100", tp_size=1, dtype="auto", quant=None, max_batch_size=32,
              free_gpu_memory_fraction=0.8)
    fit = memory_fit.check(target, drafter, memory_gib=80, max_seq_len=8192, **kw)
    # 36 + 5 layers x 8 KV heads x 128 x K,V x 2 bytes = 164 KiB a token, 1.28 GiB per 8192-token sequence
    assert fit.kv_gib_per_seq == pytest.approx(41 * 8 * 128 * 2 * 2 * 8192 / 2 ** 30)
    assert fit.full_batches >= 32
    with pytest.raises(DFlashError, match="^max_seq_len: one 40960-token sequence needs"):
        memory_fit.check(target, drafter, memory_gib=24, max_seq_len=40960, **kw)


# ---- relocatable deployment directories ------------------------------------------------------------------
def test_a_moved_directory_outlives_its_source_and_verifies(ckpt, tmp_path, capsys):
    """Hard-linked target files: the directory moves, and survives the cache it came from being cleaned."""
    import shutil

    target, drafter = ckpt("llama", "z-lab")
    src = tmp_path / "cache" / "target"
    shutil.copytree(target, src)
    out = tmp_path / "deploy"
    assert run(["--target", src, "--drafter", drafter, "--max_seq_len", 512, "--out", out], capsys)[0] == 0
    assert not any(p.is_symlink() for p in (out / "target").iterdir())
    moved = tmp_path / "elsewhere" / "deploy"
    shutil.move(str(out), moved)
    shutil.rmtree(tmp_path / "cache")                          # the user's cache is cleaned (or not on this host)
    rc, stdout, err = run(["inspect", moved], capsys)
    assert rc == 0 and "verified sha256" in stdout, err


def test_across_filesystems_the_links_are_symbolic_and_inspect_says_so(ckpt, tmp_path, capsys, monkeypatch):
    import shutil

    def no_hardlinks(*_a, **_k):
        raise OSError(18, "Invalid cross-device link")

    target, drafter = ckpt("llama", "z-lab")
    src = tmp_path / "cache" / "target"
    shutil.copytree(target, src)
    out = tmp_path / "deploy"
    monkeypatch.setattr(os, "link", no_hardlinks)
    rc, stdout, _ = run(["--target", src, "--drafter", drafter, "--max_seq_len", 512, "--out", out], capsys)
    assert rc == 0 and "self-contained: warning: target/ links into" in stdout
    m = Deployment.open(out).manifest
    assert m["target"]["files"] == "symlink" and not m["self_contained"]
    shutil.rmtree(tmp_path / "cache")
    rc, _, err = run(["inspect", out], capsys)
    assert rc == 2 and err.count("\n") == 1 and "which does not exist here" in err and "--copy_target" in err


def test_no_file_cites_notes_that_are_not_in_the_repository():
    """Sources are public (a URL, a release, a paper table), never the team's private research notes."""
    private = "research" + "/"
    roots = ["trtllm_dflash", "build_configs", "tests", "benchmarks", "scripts", "triton_model_repo"]
    files = [p for r in roots for p in (ROOT / r).rglob("*") if p.is_file() and "results" not in p.parts
             and p.suffix in (".py", ".yaml", ".sh", ".md", ".pbtxt", ".toml")] + [ROOT / "README.md"]
    citing = [str(p.relative_to(ROOT)) for p in files if private in p.read_text(errors="replace")]
    assert not citing


def test_default_schedule_comes_from_the_measured_costs_and_a_flag_wins(capsys):
    """qwen3-8b on an H100 has a measured step-cost table (cost_tables.json): with no schedule given, the YAML
    carries the one our cost model derives, and the summary says where it came from; a flag wins; none = off."""
    from trtllm_dflash import draft_schedule
    from trtllm_dflash import trtllm

    base = ["--target", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--dry_run", "--max_batch_size", "64",
            "--no_preset"]
    rc, out, err = run(base, capsys)
    assert rc == 0, err
    opts = yaml.safe_load(out.split("--- llm_api_options.yaml ---")[1].split("dry run:")[0])
    check_schema(opts)
    sched = opts["speculative_config"]["draft_len_schedule"]
    want = draft_schedule.derive("h100", "Qwen/Qwen3-8B", max_draft_len=15, max_batch_size=64, acceptance_rate=0.7)
    assert sched == want.schedule and sched[1] == 15 and max(sched) <= 64
    assert "derived from our policy's cost table benchmarks/results/step_bench_h100_v4.json" in out
    # shorter drafts as load grows, as the table says (verify cost grows with batch x draft length)
    lengths = [trtllm.draft_len_for_batch(sched, n, 15) for n in range(1, 65)]
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] < 15
    rc, out, _ = run([*base, "--draft_len_schedule", "1:15,8:7,64:2"], capsys)
    assert "draft_len_schedule: {1: 15, 8: 7, 64: 2}" in out and "given (--draft_len_schedule" in out
    rc, out, _ = run([*base, "--draft_len_schedule", "none"], capsys)
    assert rc == 0 and "draft_len_schedule" not in out.split("--- llm_api_options.yaml ---")[1]
    assert "off (--draft_len_schedule none)" in out
    rc, out, _ = run([*base, "--max_concurrency", "32"], capsys)
    assert "max_concurrency: 32" in out and "draft_len_schedule:" not in out.split("--- llm_api_options.yaml ---")[1]
    rc, out, _ = run(["--target", "qwen3-8b", "--gpu", "b200", "--backend", "trtllm", "--dry_run", "--no_preset"],
                     capsys)
    assert "none: no measured step-cost table for Qwen/Qwen3-8B on b200" in out


def test_the_deployment_names_its_draft_policy(ckpt, tmp_path, capsys):
    """auto = adaptive for a CPU build at tp 1 (fixed on GPUs): recorded in the manifest, shown by inspect, run by
    Engine.from_deployment (which the Triton model and dflash-openai load through); an explicit flag wins."""
    from trtllm_dflash.runtime.draft_policy import AdaptivePolicy, FixedPolicy
    from trtllm_dflash.runtime.engine import Engine

    out = tmp_path / "cpu"
    rc, stdout, err = run(tiny_args(ckpt, out, "llama", "z-lab", "--gpu", "cpu"), capsys)
    assert rc == 0, err
    assert Deployment.open(out).manifest["runtime"]["draft_policy"] == "adaptive" and "draft_policy adaptive (auto)" in stdout
    rc, stdout, _ = run(["inspect", out, "--no_verify"], capsys)
    assert "draft_policy adaptive" in stdout
    engine = Engine.from_deployment(out)
    err = capsys.readouterr().err   # both servers load through it: a CPU's 5-80 s of measuring is announced first
    assert 0 <= err.find("measuring step costs") < err.find("measured step costs in"), err
    assert isinstance(engine.policy, AdaptivePolicy) and engine.metrics()["adaptive_policy"] == 1
    assert sorted(engine.policy.costs.seconds) == [1, 2, 4, 8] and engine.cfg.max_batch_size == 8
    assert isinstance(Engine.from_deployment(out, draft_policy="fixed").policy, FixedPolicy)
    fixed = tmp_path / "fixed"
    assert run(tiny_args(ckpt, fixed, "llama", "z-lab", "--gpu", "cpu", "--draft_policy", "fixed"), capsys)[0] == 0
    assert isinstance(Engine.from_deployment(fixed).policy, FixedPolicy)
    gpu = tmp_path / "gpu"
    assert run(tiny_args(ckpt, gpu, "llama", "z-lab", "--gpu", "h100", "--dry_run"), capsys)[1].count(
        "draft_policy fixed (auto)") == 1


def test_batch_invariant_goes_into_the_manifest_and_the_engine(ckpt, tmp_path, capsys):
    from trtllm_dflash.runtime.engine import Engine

    out = tmp_path / "bi"
    rc, stdout, err = run(tiny_args(ckpt, out, "llama", "z-lab", "--gpu", "cpu", "--draft_policy", "fixed",
                                    "--dtype", "bfloat16", "--batch_invariant"), capsys)
    assert rc == 0, err
    assert Deployment.open(out).manifest["runtime"]["batch_invariant"] is True and "batch_invariant" in stdout
    assert Engine.from_deployment(out).cfg.batch_invariant is True
    plain = tmp_path / "plain"
    assert run(tiny_args(ckpt, plain, "llama", "z-lab", "--gpu", "cpu", "--draft_policy", "fixed"), capsys)[0] == 0
    assert "batch_invariant" not in Deployment.open(plain).manifest["runtime"]
    rc, _, err = run(["--target", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--batch_invariant",
                      "--dry_run", "--no_preset"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "batch_invariant" in err and "--backend torch" in err


def test_a_mistyped_target_is_a_target_error_with_the_closest_short_name(capsys):
    rc, _, err = run(["--target", "smolm2-135m", "--dry_run"], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: target: 'smolm2-135m' is not a short name")
    assert "did you mean smollm2-135m?" in err
    rc, _, err = run(["--target", "someone/model", "--dry_run"], capsys)    # a hub id: its drafter is the question
    assert rc == 2 and err.startswith("error: drafter: no known DFlash drafter"), err
