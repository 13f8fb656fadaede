# SPDX-License-Identifier: Apache-2.0
"""Averaging drafters (trtllm_dflash/training/average.py): the float64 mean of real safetensors checkpoints, refusals
that name the field, nothing written on a refusal, and the averaged drafter loads and stays lossless."""
from __future__ import annotations

import json

import pytest
import torch

from trtllm_dflash.checkpoints import hf
from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
from trtllm_dflash.checkpoints.manifest import sha256_file
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.testing import write_tiny_pair
from trtllm_dflash.training.average import average, main


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A tiny target, two drafters of one shape (different weights), one of another shape."""
    root = tmp_path_factory.mktemp("avg")
    target, a = write_tiny_pair(root, "llama", block_size=4, drafter_layers=2)
    kw = dict(block_size=4, target_layer_ids=[0, 2, 3], mask_token_id=hf.read_config(a)["dflash_config"]["mask_token_id"])
    b = write_random_drafter(target, root / "b", num_layers=2, seed=11, **kw)
    other = write_random_drafter(target, root / "other", num_layers=1, seed=12, **kw)
    return target, a, b, other


def test_mean_is_the_float64_weighted_sum_cast_back(lineage, tmp_path):
    _, a, b, _ = lineage
    rec = average([str(a), str(b)], tmp_path / "soup", [0.25, 0.75])
    sa, sb, got = hf.load_state_dict(a), hf.load_state_dict(b), hf.load_state_dict(tmp_path / "soup")
    assert set(got) == set(sa) and len(got) == rec["tensors"]
    for k in sa:
        want = (0.25 * sa[k].double() + 0.75 * sb[k].double()).to(sa[k].dtype)
        assert got[k].dtype == sa[k].dtype and torch.equal(got[k], want), k
    assert not torch.equal(got[next(iter(sorted(sa)))], sa[next(iter(sorted(sa)))])   # the weights moved
    soup_cfg = hf.read_config(tmp_path / "soup")
    assert {k: v for k, v in soup_cfg.items() if k != "dflash_training"} == hf.read_config(a)
    assert [s["weight"] for s in soup_cfg["dflash_training"]["averaged"]] == [0.25, 0.75]
    assert rec["model.safetensors"] == sha256_file(tmp_path / "soup" / "model.safetensors")
    assert soup_cfg["dflash_training"]["averaged"][1]["files"]["model.safetensors"] == sha256_file(b / "model.safetensors")
    assert sorted(p.name for p in (tmp_path / "soup").iterdir()) == ["config.json", "model.safetensors"]


def test_training_records_may_differ_and_are_kept(lineage, tmp_path):
    """Exported drafters carry a dflash_training record (data, steps, what they continued from) that differs
    between versions of one lineage: it does not shape the weights, so it is no reason to refuse."""
    _, a, b, _ = lineage
    for d, steps in ((a, 475), (b, 506)):
        cfg = hf.read_config(d)
        cfg["dflash_training"] = {"tool": "dflash-train (trtllm-dflash)", "steps": steps}
        (tmp_path / d.name).mkdir()
        (tmp_path / d.name / "config.json").write_text(json.dumps(cfg))
        (tmp_path / d.name / "model.safetensors").symlink_to(d / "model.safetensors")
    average([str(tmp_path / a.name), str(tmp_path / b.name)], tmp_path / "soup")
    averaged = hf.read_config(tmp_path / "soup")["dflash_training"]["averaged"]
    assert [x["dflash_training"]["steps"] for x in averaged] == [475, 506]


def test_a_drafter_averaged_with_itself_is_itself_bit_for_bit(lineage, tmp_path):
    _, a, _, _ = lineage
    average([str(a), str(a)], tmp_path / "same", [0.3, 0.7])
    same, orig = hf.load_state_dict(tmp_path / "same"), hf.load_state_dict(a)
    assert all(torch.equal(same[k], orig[k]) for k in orig)


def test_averaged_drafter_is_lossless_in_the_engine(lineage, tmp_path):
    target, a, b, _ = lineage
    average([str(a), str(b)], tmp_path / "soup")
    cfg = RuntimeConfig(max_seq_len=128, max_batch_size=2)
    ar = Engine.from_dirs(target, None, RuntimeConfig(block_size=1, max_seq_len=128, max_batch_size=2))
    df = Engine.from_dirs(target, tmp_path / "soup", cfg)
    sp = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[3, 5, 7, 9], [11, 2, 4]]
    assert [r.output_ids for r in df.generate(prompts, sp)] == [r.output_ids for r in ar.generate(prompts, sp)]
    ar.shutdown()
    df.shutdown()


@pytest.mark.parametrize("case, field", [
    ("one", "--drafters"), ("weights_count", "--weights"), ("weights_sum", "--weights"),
    ("negative", "--weights"), ("shape", "other/config.json"),
])
def test_refusals_name_the_field_and_write_nothing(lineage, tmp_path, case, field):
    _, a, b, other = lineage
    args = {"one": ([a], None), "weights_count": ([a, b], [1.0]), "weights_sum": ([a, b], [0.5, 0.6]),
            "negative": ([a, b], [1.5, -0.5]), "shape": ([a, other], None)}[case]
    with pytest.raises(DFlashError) as err:
        average([str(p) for p in args[0]], tmp_path / "soup", args[1])
    assert field in err.value.field and "\n" not in str(err.value) and "Fix:" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_refuses_an_existing_output_and_exits_2_with_one_line(lineage, tmp_path, capsys):
    from trtllm_dflash.errors import exit_code

    _, a, b, _ = lineage
    (tmp_path / "soup").mkdir()
    (tmp_path / "soup" / "keep.txt").write_text("mine")
    assert exit_code(main, ["--drafters", str(a), str(b), "--out", str(tmp_path / "soup")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --out:")
    assert [p.name for p in (tmp_path / "soup").iterdir()] == ["keep.txt"]
