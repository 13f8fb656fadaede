# SPDX-License-Identifier: Apache-2.0
"""Growing a drafter (trtllm_dflash/training/grow.py): the grown drafter drafts exactly what the original does (same
tokens, same acceptance per step, the real SmolLM2 pair included), its new layers are zero-output copies and its new
taps zero columns of fc, dflash-train warm-starts a deeper run from it, and refusals name the field and write
nothing."""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.checkpoints import hf
from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import DFlashError, exit_code
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.testing import write_tiny_pair
from trtllm_dflash.training.grow import grow, layer_plan, main

from .test_train import needs_modelopt


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a 2-layer drafter tapping 3 target layers (taps stay when it grows)."""
    return write_tiny_pair(tmp_path_factory.mktemp("grow"), "llama", block_size=4, drafter_layers=2)


@pytest.fixture(scope="module")
def modelopt_shaped(pair, tmp_path_factory):
    """A 2-layer drafter of the same target tapping one target layer per draft layer, as ModelOpt trains them."""
    target, drafter = pair
    mask = hf.read_config(drafter)["dflash_config"]["mask_token_id"]
    return write_random_drafter(target, tmp_path_factory.mktemp("mo") / "d", num_layers=2, block_size=4,
                                target_layer_ids=[0, 3], mask_token_id=mask, seed=5)


def _generate(target, drafter, prompts, max_new_tokens=32):
    eng = Engine.from_dirs(target, drafter, RuntimeConfig(max_seq_len=128, max_batch_size=2, dtype="float32"))
    out = [(r.output_ids, r.stats.acceptance_lengths)
           for r in eng.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))]
    eng.shutdown()
    return out


def test_plan_copies_the_last_layers_by_default_and_as_asked():
    assert layer_plan(3, 2, None) == [0, 1, (1,), 2, (2,)]
    assert layer_plan(2, 3, None) == [0, (0,), 1, (1,), (1,)]
    assert layer_plan(3, 1, [0]) == [0, (0,), 1, 2]


def test_new_layers_are_copies_with_zero_residual_outputs(pair, tmp_path):
    _, drafter = pair
    rec = grow(str(drafter), tmp_path / "g", 4, copy_of=[0, 1])
    old, new = hf.load_state_dict(drafter), hf.load_state_dict(tmp_path / "g")
    assert rec["layers"][0] == "layer 0" and rec["layers"][1].startswith("copy of 0")
    source = {0: 0, 1: 0, 2: 1, 3: 1}
    for key, tensor in new.items():
        if not key.startswith("layers."):
            assert torch.equal(tensor, old[key]), key
            continue
        k, name = int(key.split(".")[1]), key.split(".", 2)[2]
        want = old[f"layers.{source[k]}.{name}"]
        if k in (1, 3) and name.startswith(("self_attn.o_proj.", "mlp.down_proj.")):
            want = torch.zeros_like(want)
        assert tensor.dtype == want.dtype and torch.equal(tensor, want), key
    cfg = hf.read_config(tmp_path / "g")
    assert cfg["num_hidden_layers"] == 4 and cfg["dflash_training"]["grown_from"]["num_layers"] == 2
    assert {k: v for k, v in cfg.items() if k not in ("num_hidden_layers", "layer_types", "dflash_training")} == \
        {k: v for k, v in hf.read_config(drafter).items()
         if k not in ("num_hidden_layers", "layer_types", "dflash_training")}


PROMPTS = [[3, 5, 7, 9, 3, 5, 7, 9], [11, 2, 4]]


def test_grown_drafter_drafts_what_the_original_does(pair, tmp_path):
    """Same output tokens and the same accepted length at every verify step, in float32 on the CPU."""
    target, drafter = pair
    grow(str(drafter), tmp_path / "g", 5)
    assert hf.read_config(tmp_path / "g")["dflash_config"] == hf.read_config(drafter)["dflash_config"]
    orig = _generate(target, drafter, PROMPTS)
    assert _generate(target, tmp_path / "g", PROMPTS) == orig
    assert any(a > 1 for _, lengths in orig for a in lengths)   # the drafter's drafts do get accepted


def test_new_taps_are_zero_columns_of_fc_and_change_nothing(pair, modelopt_shaped, tmp_path):
    target, _ = pair
    rec = grow(str(modelopt_shaped), tmp_path / "g", 3, target_layer_ids=[0, 2, 3])
    old, new = hf.load_state_dict(modelopt_shaped), hf.load_state_dict(tmp_path / "g")
    h = old["fc.weight"].shape[1] // 2
    fc = new["fc.weight"]
    assert fc.shape == (old["fc.weight"].shape[0], 3 * h) and rec["taps"] == [0, 2, 3]
    assert torch.equal(fc[:, :h], old["fc.weight"][:, :h]) and torch.equal(fc[:, 2 * h:], old["fc.weight"][:, h:])
    assert not fc[:, h:2 * h].any()
    cfg = hf.read_config(tmp_path / "g")
    assert cfg["dflash_config"]["target_layer_ids"] == [0, 2, 3] and cfg["dflash_training"]["new_taps"] == [2]
    assert _generate(target, tmp_path / "g", PROMPTS) == _generate(target, modelopt_shaped, PROMPTS)


@needs_modelopt
def test_dflash_train_warm_starts_a_deeper_run_from_it(pair, modelopt_shaped, tmp_path):
    from trtllm_dflash.training import modelopt_model
    from trtllm_dflash.training.settings import TrainConfig

    target, _ = pair
    grow(str(modelopt_shaped), tmp_path / "g", 3, target_layer_ids=[0, 2, 3])
    mask = hf.read_config(modelopt_shaped)["dflash_config"]["mask_token_id"]
    base = dict(target=str(target), data="x", out=str(tmp_path / "w"), block_size=4, num_anchors=8, max_seq_len=64)
    model, _ = modelopt_model.build(TrainConfig(**base, num_layers=3, target_layer_ids=(0, 2, 3),
                                                init_drafter=str(tmp_path / "g")), target, mask, torch.device("cpu"))
    got, want = model.dflash_module.state_dict(), hf.load_state_dict(tmp_path / "g")
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor.float()), name
    with pytest.raises(DFlashError, match=r"has num_layers 3, this run trains 2\. Fix: pass --num_layers 3"):
        modelopt_model.build(TrainConfig(**base, num_layers=2, target_layer_ids=(0, 3),
                                         init_drafter=str(tmp_path / "g")), target, mask, torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_shipped_drafter_grown_to_five_layers_accepts_the_same(tmp_path):
    """The real pair: SmolLM2's 3-layer drafter grown to 5 (taps 1, 14, 27 -> 1, 8, 14, 20, 27) drafts what it did."""
    from trtllm_dflash.checkpoints import packaged
    from trtllm_dflash.data import apply_chat_template

    rec = grow("smollm2-135m-dflash", tmp_path / "g", 5)
    assert rec["taps"] == [1, 8, 14, 20, 27] and len(rec["layers"]) == 5
    target = packaged.smollm2_target_dir()
    questions = ["Write a Python function that checks whether a number is prime.", "Explain how a hash table works."]
    runs = {}
    for name, d in (("orig", "smollm2-135m-dflash"), ("grown", tmp_path / "g")):
        from trtllm_dflash.checkpoints.resolve import resolve

        eng = Engine.from_dirs(target, resolve(str(d), role="drafter", download=False).path,
                               RuntimeConfig(max_batch_size=2, max_seq_len=512))
        prompts = [apply_chat_template(eng.tokenizer, [{"role": "user", "content": q}]) for q in questions]
        runs[name] = [(r.output_ids, r.stats.acceptance_lengths)
                      for r in eng.generate(prompts, SamplingParams(max_new_tokens=48))]
        eng.shutdown()
    assert runs["grown"] == runs["orig"]
    lengths = [k for _, ls in runs["orig"] for k in ls]
    assert sum(lengths) / len(lengths) > 1.25   # a trained drafter: the comparison is not between two ~1.0s


@pytest.mark.parametrize("which, args, field", [
    ("pair", ["--num_layers", "2"], "--num_layers"),
    ("pair", ["--num_layers", "4", "--copy_of", "0"], "--copy_of"),
    ("pair", ["--num_layers", "3", "--copy_of", "7"], "--copy_of"),
    ("mo", ["--num_layers", "3"], "--target_layer_ids"),                                   # spread repeats a layer
    ("mo", ["--num_layers", "3", "--target_layer_ids", "0", "1", "2"], "--target_layer_ids"),   # drops tap 3
    ("mo", ["--num_layers", "3", "--target_layer_ids", "3", "0", "2"], "--target_layer_ids"),   # not in order
])
def test_refusals_exit_2_with_one_line_and_write_nothing(pair, modelopt_shaped, tmp_path, capsys, which, args, field):
    drafter = pair[1] if which == "pair" else modelopt_shaped
    assert exit_code(main, ["--drafter", str(drafter), "--out", str(tmp_path / "g"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}:") and "Fix:" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_refuses_an_existing_output(pair, tmp_path):
    _, drafter = pair
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "keep.txt").write_text("mine")
    with pytest.raises(DFlashError, match="--out"):
        grow(str(drafter), tmp_path / "g", 3)
    assert [p.name for p in (tmp_path / "g").iterdir()] == ["keep.txt"]
