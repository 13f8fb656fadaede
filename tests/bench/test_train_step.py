# SPDX-License-Identifier: Apache-2.0
"""bench.train_step on the CPU with a tiny chat target: the real training step runs at two batch sizes, its
phases add up to the step, the padding and the synthetic lengths are what the flags say, and the profile lists
ops."""
from __future__ import annotations

import json

import pytest

from tests.test_train import needs_modelopt
from trtllm_dflash.bench import train_step

pytestmark = [needs_modelopt, pytest.mark.usefixtures("one_torch_thread")]


def test_synthetic_lengths_and_mask_id():
    data = train_step.synthetic(50, vocab=40, avoid=3, prompt=10, response=20, cap=24, seed=0)
    for e in data:
        p, r = e.loss_mask.count(0), e.loss_mask.count(1)
        assert 5 <= p <= 15 and 10 <= r <= 24 and e.loss_mask == (0,) * p + (1,) * r
        assert 3 not in e.input_ids and max(e.input_ids) < 40


def test_the_step_by_phase_on_a_tiny_target(tmp_path):
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    target = write_tiny_chat_target(tmp_path / "target")
    out = tmp_path / "ts.json"
    assert train_step.main(["--target", str(target), "--device", "cpu", "--batch", "2,3", "--steps", "2",
                            "--num_layers", "2", "--target_layer_ids", "0", "2", "--block_size", "8",
                            "--num_anchors", "8", "--prompt_tokens", "12", "--response_tokens", "16",
                            "--mask_token_id", "3", "--pad_multiple", "64", "--profile", "--top", "5",
                            "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [r["batch"] for r in d["rows"]] == [2, 3] and d["provenance"]["git_sha"]
    for r in d["rows"]:
        assert set(r["phase_ms"]) == set(train_step.PHASES) and all(v >= 0 for v in r["phase_ms"].values())
        assert r["phase_sum_ms"] <= r["s_per_step"] * 1e3 * 1.01 and r["tokens_per_s"] > 0
        assert r["padded_len_mean"] == 64 and r["distinct_lengths"] == 1
        assert 0 < len(r["top_kernels"]) <= 5


def test_plot_of_earlier_results(tmp_path):
    row = {"batch": 64, "tokens_per_s": 1000.0, "phase_ms": dict.fromkeys(train_step.PHASES, 10.0)}
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"device": "cpu", "rows": [row, {"batch": 128,
                                                                                        "error": "out of memory"}]}))
    png = tmp_path / "p.png"
    assert train_step.main(["--plot", f"first={tmp_path / 'a.json'}", str(tmp_path / "b.json"), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
