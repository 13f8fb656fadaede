# SPDX-License-Identifier: Apache-2.0
"""The bf16 divergence policy (trtllm_dflash/bench/divergence.py) on CPU: a token outside the float32 top 2 is never allowed,
however close its logit; the margin is the gap between the two tokens involved; the committed cuda_check file's
verdicts are what the policy says of its own float32 numbers; --rejudge rewrites a file whose verdicts are wrong."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trtllm_dflash.bench.divergence import MARGIN_BOUND, judge, near_tie, policy_met

ROOT = Path(__file__).resolve().parent.parent
CUDA_CHECK = ROOT / "benchmarks" / "results" / "cuda_check_h100.json"


class FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits are given: near_tie's arithmetic on known numbers."""

    def __init__(self, logits: list[float]):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(logits), requires_grad=False)

    def forward(self, ids):
        return SimpleNamespace(logits=self.logits.expand(1, ids.shape[1], -1))


def test_a_token_outside_the_float32_top2_is_not_allowed_however_close():
    # the recorded H100 case: 351 vs 3910 where the float32 top 2 are 1625 and 3910, 351 only 0.13 below the best
    v = judge([351, 3910], [1625, 3910], [0.1286, 0.0])
    assert v == {"in_f32_top2": False, "f32_margin": 0.1286, "allowed": False}
    assert not judge([5, 9], [1, 9], [0.01, 0.0])["allowed"]   # a third token a hair below: still not allowed
    assert not judge([5, 7], [1, 9], [0.01, 0.02])["allowed"]  # neither token in the top 2


def test_the_top2_with_a_small_margin_is_allowed_and_the_margin_is_their_own_gap():
    assert judge([8389, 940], [940, 8389], [0.0142, 0.0]) == {"in_f32_top2": True, "f32_margin": 0.0142,
                                                              "allowed": True}
    assert judge([1, 2], [1, 2], [0.0, MARGIN_BOUND - 0.01])["allowed"]
    assert not judge([1, 2], [1, 2], [0.0, MARGIN_BOUND])["allowed"]      # the bound is strict
    with pytest.raises(ValueError, match="two different tokens"):
        judge([3, 3], [3, 4], [0.0, 0.0])


def test_near_tie_reads_the_float32_logits():
    # token 0 best (5.0), token 3 second (4.95), token 1 third (4.9): a three-way near-tie
    model = FixedLogits([5.0, 4.9, -1.0, 4.95])
    out = near_tie(model, [2, 2], [0], 1, 3)            # diverged to 1 (outside the top 2) vs 3
    assert out["position"] == 1 and out["f32_top2"] == [0, 3] and out["f32_top2_margin"] == pytest.approx(0.05)
    assert out["f32_gaps"] == pytest.approx([0.1, 0.05], abs=1e-4)
    assert out["f32_margin"] == pytest.approx(0.05, abs=1e-4)       # the gap between tokens 1 and 3 themselves
    assert out["in_f32_top2"] is False and out["allowed"] is False
    ok = near_tie(model, [2, 2], [], 3, 0)
    assert ok["allowed"] is True and ok["f32_margin"] == pytest.approx(0.05, abs=1e-4) and ok["position"] == 0


def _row(divergences, equal, n=8, dtype="bfloat16"):
    at = [None] * n
    for d in divergences:
        at[d["prompt"]] = d["position"]
    return {"dtype": dtype, "n_prompts": n, "dflash_eq_ar_greedy": equal, "diverged_at": at, "divergences": divergences}


def test_policy_met_rejudges_and_does_not_trust_the_recorded_flags():
    tie = {"prompt": 2, "position": 35, "tokens": [8389, 940], "f32_top2": [940, 8389], "f32_gaps": [0.0142, 0.0],
           "allowed": True}
    third = {"prompt": 7, "position": 22, "tokens": [351, 3910], "f32_top2": [1625, 3910], "f32_gaps": [0.1286, 0.0],
             "allowed": True}      # a file that wrongly says allowed
    assert policy_met(_row([tie], equal=7))
    assert not policy_met(_row([tie, third], equal=6))
    assert not policy_met(_row([tie], equal=6))          # one more prompt differs with no divergence recorded
    assert policy_met(_row([], equal=8, dtype="float32")) and not policy_met(_row([], equal=7, dtype="float32"))


def test_the_committed_cuda_check_verdicts_are_the_policys():
    data = json.loads(CUDA_CHECK.read_text())
    for row in data["smollm2"]:
        for d in row.get("divergences", []):
            assert {k: d[k] for k in ("in_f32_top2", "f32_margin", "allowed")} == judge(
                d["tokens"], d["f32_top2"], d["f32_gaps"]), f"{CUDA_CHECK.name}: prompt {d['prompt']}"
        assert row["policy_met"] == policy_met(row), f"{CUDA_CHECK.name}: {row['dtype']} policy_met"


def test_rejudge_rewrites_wrong_verdicts_and_says_so(tmp_path, capsys):
    from trtllm_dflash.bench import cuda_check
    data = json.loads(CUDA_CHECK.read_text())
    bf16 = next(r for r in data["smollm2"] if r["dtype"] == "bfloat16")
    old = copy.deepcopy(data)           # the file as the old code wrote it: every divergence allowed, policy met
    old.pop("rejudged", None)
    old_bf16 = next(r for r in old["smollm2"] if r["dtype"] == "bfloat16")
    for d in old_bf16["divergences"]:
        d.update(allowed=True, f32_margin=d.get("f32_top2_margin", d["f32_margin"]))
        d.pop("in_f32_top2", None), d.pop("f32_top2_margin", None)
    old_bf16["policy_met"] = True
    path = tmp_path / "cuda_check.json"
    path.write_text(json.dumps(old))
    want_met = policy_met(bf16)
    assert cuda_check.main(["--rejudge", str(path)]) == (0 if want_met else 1)
    got = json.loads(path.read_text())
    got_bf16 = next(r for r in got["smollm2"] if r["dtype"] == "bfloat16")
    assert got_bf16["divergences"] == bf16["divergences"] and got_bf16["policy_met"] == want_met
    if not want_met:
        record = got["rejudged"][-1]
        assert "bfloat16 policy_met: true -> false" in record["changed"] and record["git"]["sha"]
    capsys.readouterr()
    before = path.read_text()
    cuda_check.main(["--rejudge", str(path)])            # a second pass changes nothing and adds no record
    assert path.read_text() == before and "already holds" in capsys.readouterr().out
