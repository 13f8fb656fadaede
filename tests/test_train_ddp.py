# SPDX-License-Identifier: Apache-2.0
"""dflash-train data-parallel on the CPU (gloo): 2 ranks started by a real torchrun / mpiexec train and regenerate
exactly what one process does at the same global batch, and a checkpoint moves between rank counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.test_tp import mpiexec
from tests.test_train import COMMON, _checkpoint_tensors, chat_target, needs_modelopt, prompts_file  # noqa: F401
from trtllm_dflash import train
from trtllm_dflash.training import anchors, batches, loop, regenerate

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _launch(launcher: str, argv: list) -> None:
    if launcher == "torchrun":
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "trtllm_dflash.train"]
    else:
        cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "trtllm_dflash.train"]
    res = subprocess.run(cmd + [str(a) for a in argv], env=ENV, cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def test_rank_slices_cover_the_global_batch_in_order():
    rows = [{"input_ids": list(range(4 + n)), "loss_mask": [0, 0] + [1] * (2 + n)} for n in range(10)]
    data, _ = batches.examples(rows, max_seq_len=64)
    one = batches.BatchStream(data, 4, 8, seed=3)
    two = [batches.BatchStream(data, 4, 8, seed=3, rank=r, ranks=2) for r in range(2)]
    for step in range(5):   # across an epoch boundary (10 samples, 4 a step)
        whole = one.batch(step)
        parts = [s.batch(step) for s in two]
        assert torch.equal(torch.cat([p["sample_ids"] for p in parts]), whole["sample_ids"])
        for k in ("input_ids", "labels"):   # each slice is padded to its own longest row
            got = [p[k][i, : p[k].shape[1]] for p in parts for i in range(2)]
            assert all(torch.equal(g, w[: len(g)]) for g, w in zip(got, whole[k]))
    with pytest.raises(Exception, match="does not split over 3 ranks"):
        batches.BatchStream(data, 4, 8, seed=3, rank=0, ranks=3)


@needs_modelopt
def test_two_ranks_train_like_one_and_resume_across_rank_counts(chat_target, prompts_file, tmp_path):
    """1 process: 4 steps at global batch 4. The same run cut after 2 steps in 1 process and finished under
    torchrun with 2 ranks (2 sequences each, padded each to its own longest): the same loss.csv and the same
    final weights within float tolerance."""
    base = ["--target", chat_target, "--data", prompts_file, "--num_prompts", "8", "--max_new_tokens", "16",
            "--device", "cpu", "--save_every", "100", "--log_every", "2", *COMMON]
    data = tmp_path / "data_run"
    assert train.main([str(a) for a in base + ["--out", data, "--stages", "regenerate"]]) == 0
    # answers cut to unequal lengths: ranks then hold unequal loss weights (a plain mean over ranks would differ)
    path = data / "data" / regenerate.DATA_FILE
    rows = regenerate.read_rows(path)
    for i, r in enumerate(rows):
        n = r["prompt_len"] + 2 + (5 * i) % 13
        r["input_ids"], r["loss_mask"] = r["input_ids"][:n], r["loss_mask"][:n]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):   # regenerated data copied in: each run trains on the same rows
        (d / "data").mkdir(parents=True)
        for f in (data / "data").iterdir():
            (d / "data" / f.name).write_bytes(f.read_bytes())
    argv = base + ["--stages", "train", "--max_steps", "4"]
    assert train.main([str(a) for a in argv + ["--out", whole]]) == 0
    assert train.main([str(a) for a in argv + ["--out", cut, "--stop_after_s", "1e-6"]]) == 0
    assert json.loads((cut / "checkpoint" / "state.json").read_text())["step"] == 2
    _launch("torchrun", argv + ["--out", cut, "--resume"])
    report = json.loads((cut / "report.json").read_text())
    assert report["ranks"] == 2 and report["train"]["steps"] == 4 and report["train"]["per_rank_batch"] == 2
    cols = ("step", "epoch", "tokens", "lr")
    rows = [loop.read_csv(d / "loss.csv") for d in (whole, cut)]
    assert [[r[c] for c in cols] for r in rows[0]] == [[r[c] for c in cols] for r in rows[1]]
    assert [r["step"] for r in rows[0]] == [2, 4]
    for c in ("loss", "acc", "grad_norm"):
        assert [r[c] for r in rows[1]] == pytest.approx([r[c] for r in rows[0]], rel=1e-4, abs=1e-5), c
    a, b = _checkpoint_tensors(whole), _checkpoint_tensors(cut)
    assert a.keys() == b.keys()
    for k in a:
        if not k.startswith("rng."):
            assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-3, atol=1e-5), k
    # ... and the checkpoint the 2 ranks wrote is what one process resumes: the format has no rank count in it
    meta = json.loads((cut / "checkpoint" / "state.json").read_text())
    assert meta["step"] == 4 and meta["tokens"] == rows[0][-1]["tokens"]


@needs_modelopt
def test_anchors_do_not_depend_on_the_batch_or_the_padding(chat_target, prompts_file, tmp_path):
    from trtllm_dflash.training import modelopt_model

    cfg = train.config_from_args([str(a) for a in ["--target", chat_target, "--data", prompts_file, "--out",
                                                   tmp_path, *COMMON, "--num_anchors", "5"]])
    model, _ = modelopt_model.build(cfg, chat_target, 259, torch.device("cpu"))
    anchors.install(model)
    mask = torch.zeros(3, 40)
    mask[0, 3:12], mask[1, 5:30], mask[2, 2:4] = 1, 1, 1
    anchors.set_samples(model, [11, 12, 13])
    a, keep = model._sample_anchor_positions(40, mask, "cpu")
    anchors.set_samples(model, [12])
    b, keep_b = model._sample_anchor_positions(60, torch.nn.functional.pad(mask[1:2], (0, 20)), "cpu")
    assert torch.equal(a[1][keep[1]], b[0][keep_b[0]])   # alone, longer padding: the same anchors
    assert keep.sum(1).tolist() == [5, 5, 2] and all(mask[i, a[i][keep[i]]].all() for i in range(3))
    anchors.set_samples(model, [99, 12, 13])
    c, _ = model._sample_anchor_positions(40, mask, "cpu")
    assert torch.equal(c[1:], a[1:]) and not torch.equal(c[0], a[0])


@needs_modelopt
def test_two_ranks_regenerate_every_shard_once_like_one_then_probe_and_train(tmp_path):
    """mpiexec -n 2: each rank answers its own shards (pending shard k on rank k % 2) with its own engine; rank 0
    writes the manifest; the shards' bytes are those of one process. Then the batch probe times per-rank sizes
    on both ranks and the run trains at the global batch it chose (per-rank size x 2)."""
    from transformers import AutoTokenizer

    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    from tests.test_corpus import _items
    from trtllm_dflash.training import corpus
    from trtllm_dflash.training.decontaminate import Decontaminator

    target = write_tiny_chat_target(tmp_path / "target")
    tok = AutoTokenizer.from_pretrained(str(target))
    s = corpus.CorpusSettings(max_prompt_len=128, shard_size=3, sampled_share=0.5)
    corpus.build(tmp_path / "c", s, items=_items(), tokenizer=tok, decontaminator=Decontaminator({}),
                 progress=False, log=lambda *_: None)
    base = ["--target", target, "--data", tmp_path / "c", "--block_size", "8", "--num_layers", "2",
            "--target_layer_ids", "0", "2", "--max_new_tokens", "12", "--regen_batch_size", "4", "--device", "cpu",
            "--quiet", "--stages", "regenerate", "--num_prompts", "9"]
    assert train.main([str(a) for a in base + ["--out", tmp_path / "one"]]) == 0
    train_args = ["--stages", "regenerate,train", "--probe_batch_sizes", "1", "2", "--probe_s", "0.5",
                  "--batch_size", "2", "--max_steps", "2", "--num_anchors", "8", "--max_seq_len", "128",
                  "--log_every", "1"]
    _launch("mpiexec", base[:-4] + ["--num_prompts", "9"] + train_args + ["--out", tmp_path / "two"])
    one, two = (json.loads((tmp_path / d / "data" / regenerate.MANIFEST).read_text())["shards"] for d in ("one", "two"))
    assert sorted(one) == sorted(two) and len(two) == 3
    for d in ("one", "two"):   # results files: the code, versions and target that made them
        for f in (regenerate.MANIFEST, regenerate.DONE_FILE):
            prov = json.loads((tmp_path / d / "data" / f).read_text())["provenance"]
            assert prov["git"]["source"] and list(prov["checkpoints"]) == ["target"], (d, f)
    assert {k: v["sha256"] for k, v in one.items()} == {k: v["sha256"] for k, v in two.items()}
    assert [two[k]["rank"] for k in sorted(two)] == [0, 1, 0] and all(v["tokens_per_s"] > 0 for v in two.values())
    assert sorted(p.name for p in (tmp_path / "two" / "data" / "shards").iterdir()) == sorted(
        v["file"].split("/")[1] for v in two.values())
    counts = json.loads((tmp_path / "two" / "data" / regenerate.DONE_FILE).read_text())["counts"]
    assert counts["ranks"] == 2 and counts["rows"] == 9 and counts["new_tokens_per_s"] > 0
    probe = json.loads((tmp_path / "two" / "batch_probe.json").read_text())
    assert probe["ranks"] == 2 and set(probe["measured"]) == {"1", "2"} and probe["chosen"] in (1, 2)
    steps = -(-2 * 2 // (2 * probe["chosen"]))   # the command line's 2 x 2 sequences at the chosen global batch
    assert probe["settings"] == {"batch_size": 2 * probe["chosen"], "max_steps": steps}
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["train"]["steps"] == steps and report["train"]["per_rank_batch"] == probe["chosen"]
    assert [r["step"] for r in loop.read_csv(tmp_path / "two" / "loss.csv")] == list(range(1, steps + 1))
