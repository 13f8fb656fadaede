# SPDX-License-Identifier: Apache-2.0
"""Bad checkpoints and mismatched pairs: one clear error each, before (or while) loading."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from trtllm_dflash.checkpoints import hf
from trtllm_dflash.config import RuntimeConfig
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.engine import Engine


@pytest.fixture
def pair(tmp_path, tiny_pair):
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(tiny_pair[0], t)
    shutil.copytree(tiny_pair[1], d)
    return t, d


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if key == "dflash_config":
            cfg["dflash_config"].update(value)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def load(pair, **kw):
    return Engine.from_dirs(pair[0], pair[1], RuntimeConfig(max_seq_len=64, max_batch_size=1), **kw)


@pytest.mark.parametrize("where,changes,match", [
    ("drafter", dict(hidden_size=32), "drafter hidden_size: 32 != target hidden_size 64"),
    ("drafter", dict(vocab_size=1000), "drafter vocab_size: 1000 != target vocab_size 96"),
    ("drafter", dict(dflash_config={"target_layer_ids": [0, 4]}), r"target_layer_ids: \[4\] out of range"),
    ("drafter", dict(dflash_config={"mask_token_id": 96}), "mask_token_id: 96 is outside the vocabulary"),
    ("drafter", dict(num_target_layers=36), "num_target_layers: 36 != target num_hidden_layers 4"),
    ("drafter", dict(block_size=None), "block_size: missing"),
    ("target", dict(architectures=["GPT2LMHeadModel"]), "GPT2LMHeadModel is not supported"),
])
def test_mismatched_pair(pair, where, changes, match):
    edit_config(pair[0] if where == "target" else pair[1], **changes)
    with pytest.raises(DFlashError, match=match) as err:
        load(pair)
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_tp_size_must_divide_heads(pair):
    with pytest.raises(DFlashError, match=r"tp_size: 3 does not divide num_attention_heads \(4\) of the target.*"
                                          r"use one of \[1, 2, 4\]"):
        load(pair, tp_size=3)


def test_a_bad_tp_size_lists_every_size_that_suits_target_and_drafter():
    """The fix names the sizes both models allow: listing the target's alone sent the user to a size the drafter
    then refused (`--tp 16` said one thing, the next try another)."""
    from trtllm_dflash.checkpoints import validate

    target = validate.head_counts({"num_attention_heads": 32, "num_key_value_heads": 8})
    drafter = (12, 4)   # a parsed drafter's (num_heads, num_kv_heads)
    for tp, who, cfg, other in ((3, "target", target, drafter), (8, "drafter", drafter, target)):
        with pytest.raises(DFlashError) as err:
            validate.check_tp(cfg, tp, who, together_with=(other,))
        assert str(err.value).endswith("use one of [1, 2, 4]"), str(err.value)
    assert validate.tp_sizes(validate.head_counts({"num_attention_heads": 9, "num_key_value_heads": 3})) == [1, 3, 9]


def test_missing_tensor(pair):
    sd = hf.load_state_dict(pair[1])
    del sd["layers.1.mlp.down_proj.weight"]
    hf.save_state_dict(sd, pair[1])
    with pytest.raises(DFlashError, match="tensor layers.1.mlp.down_proj.weight: missing"):
        load(pair)


def test_wrong_shape(pair):
    sd = hf.load_state_dict(pair[1])
    sd["fc.weight"] = sd["fc.weight"][:, :64]  # trained on fewer target layers than its config says
    hf.save_state_dict(sd, pair[1])
    with pytest.raises(DFlashError, match=r"tensor fc.weight: has shape \(64, 64\), expected \(64, 192\)"):
        load(pair)


def test_unexpected_tensor(pair):
    sd = hf.load_state_dict(pair[1])
    sd["embed_tokens.weight"] = torch.zeros(96, 64)
    hf.save_state_dict(sd, pair[1])
    with pytest.raises(DFlashError, match="embed_tokens.weight: is not part of this architecture"):
        load(pair)


def test_pickle_only_checkpoint_is_refused_unless_allowed(pair):
    sd = hf.load_state_dict(pair[0])
    for f in pair[0].glob("*.safetensors"):
        f.unlink()
    torch.save(sd, pair[0] / "pytorch_model.bin")
    with pytest.raises(DFlashError, match="only pickle weights.*--allow_pickle"):
        load(pair)
    eng = load(pair, allow_pickle=True)
    assert eng.generate([[3, 4, 5]])[0].output_ids


def test_missing_folder_and_config(tmp_path, pair):
    with pytest.raises(DFlashError, match="is not a directory"):
        Engine.from_dirs(tmp_path / "nope", pair[1])
    (pair[1] / "config.json").unlink()
    with pytest.raises(DFlashError, match="config.json: missing"):
        load(pair)


def test_sharded_safetensors_index(tmp_path, tiny_pair):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0])
    model.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = Engine.from_dirs(tiny_pair[0], None, RuntimeConfig(block_size=1, max_seq_len=64))
    b = Engine.from_dirs(tmp_path / "sharded", None, RuntimeConfig(block_size=1, max_seq_len=64))
    assert a.generate([[5, 6, 7]])[0].output_ids == b.generate([[5, 6, 7]])[0].output_ids
