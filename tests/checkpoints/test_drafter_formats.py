# SPDX-License-Identifier: Apache-2.0
"""Every known drafter format normalises to the same canonical z-lab checkpoint; bad ones fail clearly."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests import fixtures_build as fb
from trtllm_dflash.checkpoints import drafter_formats as df
from trtllm_dflash.checkpoints import hf
from trtllm_dflash.errors import DFlashError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    target = fb.write_target(root / "target", "llama")
    return target, fb.write_zlab(target, root / "zlab"), root


@pytest.mark.parametrize("fmt", df.KNOWN_FORMATS)
def test_each_format_normalises_to_the_z_lab_checkpoint(pair, tmp_path, fmt):
    target, zlab, _ = pair
    src = {"z-lab": lambda: zlab, "modelopt": lambda: fb.to_modelopt(zlab, tmp_path / "src"),
           "speculators": lambda: fb.to_speculators(zlab, target, tmp_path / "src"),
           "specforge": lambda: fb.to_specforge(zlab, target, tmp_path / "src")}[fmt]()
    assert df.detect(hf.read_config(src), {p.name for p in src.iterdir()}) == fmt
    out = tmp_path / "canonical"
    result = df.normalise(src, out, target, hf.read_config(target))
    assert result.format == fmt
    want, got = load_file(str(zlab / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    cfg, ref = json.loads((out / "config.json").read_text()), hf.read_config(zlab)
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"]["target_layer_ids"] == ref["dflash_config"]["target_layer_ids"]
    assert cfg["dflash_config"]["mask_token_id"] == ref["dflash_config"]["mask_token_id"]
    for key in ("block_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size"):
        assert cfg[key] == ref[key], key
    assert "causal" not in cfg["dflash_config"] and not cfg["tie_word_embeddings"]
    assert not (out / "training_state.pt").exists()


def test_speculators_layer_ids_shift_and_notes(pair, tmp_path):
    target, zlab, _ = pair
    src = fb.to_speculators(zlab, target, tmp_path / "spec")
    assert hf.read_config(src)["aux_hidden_state_layer_ids"] == [1, 3, 4]
    result = df.normalise(src, tmp_path / "out", target, hf.read_config(target))
    assert result.config["dflash_config"]["target_layer_ids"] == [0, 2, 3]
    assert any("embed_tokens" in n for n in result.notes) and any("d2t" in n for n in result.notes)


def test_speculators_with_its_own_lm_head_is_refused(pair, tmp_path):
    target, zlab, _ = pair
    src = fb.to_speculators(zlab, target, tmp_path / "spec", own_lm_head=True)
    with pytest.raises(DFlashError, match="lm_head.weight.*differs from the target"):
        df.normalise(src, tmp_path / "out", target, hf.read_config(target))


def test_speculators_with_a_reduced_vocab_is_refused(pair, tmp_path):
    target, zlab, _ = pair
    src = fb.to_speculators(zlab, target, tmp_path / "spec", draft_vocab=32)
    with pytest.raises(DFlashError, match="draft_vocab_size"):
        df.normalise(src, tmp_path / "out", target, hf.read_config(target))


def test_causal_modelopt_export_is_refused(pair, tmp_path):
    target, zlab, _ = pair
    src = fb.to_modelopt(zlab, tmp_path / "mo")
    cfg = hf.read_config(src)
    cfg["dflash_config"]["causal"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DFlashError, match="causal"):
        df.normalise(src, tmp_path / "out", target, hf.read_config(target))


def test_unknown_format_lists_the_known_ones(pair):
    target, _, _ = pair
    with pytest.raises(DFlashError) as err:
        df.detect(hf.read_config(target), set())
    for fmt in df.KNOWN_FORMATS:
        assert fmt in str(err.value)
    with pytest.raises(DFlashError, match="drafter_format"):
        df.canonical_config({}, "eagle3", {})


def test_unknown_and_missing_tensors(pair, tmp_path):
    target, zlab, _ = pair
    sd = load_file(str(zlab / "model.safetensors"))
    cfg = hf.read_config(zlab)
    with pytest.raises(DFlashError, match="mtp_head.weight"):
        df.canonical_weights({**sd, "mtp_head.weight": torch.zeros(1)}, "z-lab", cfg, None, [])
    del sd["fc.weight"]
    with pytest.raises(DFlashError, match="fc.weight.*missing"):
        df.canonical_weights(sd, "z-lab", cfg, None, [])


def test_prefixed_tensor_names_are_stripped(pair):
    _, zlab, _ = pair
    sd = load_file(str(zlab / "model.safetensors"))
    notes = []
    out = df.canonical_weights({f"draft_model.{k}": v for k, v in sd.items()}, "specforge", hf.read_config(zlab),
                               None, notes)
    assert set(out) == set(sd) and "draft_model." in notes[0]


def test_missing_dflash_fields(pair):
    _, zlab, _ = pair
    cfg = hf.read_config(zlab)
    del cfg["dflash_config"]["mask_token_id"]
    with pytest.raises(DFlashError, match="mask_token_id"):
        df.canonical_config(cfg, "z-lab", {"num_hidden_layers": 4})


def test_block_size_inside_dflash_config_is_lifted(pair):
    _, zlab, _ = pair
    cfg = hf.read_config(zlab)
    cfg["dflash_config"]["block_size"] = cfg.pop("block_size")
    out = df.canonical_config(cfg, "z-lab", {"num_hidden_layers": 4})
    assert out.config["block_size"] == 16 and any("top level" in n for n in out.notes)
