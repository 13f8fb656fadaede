# SPDX-License-Identifier: Apache-2.0
"""Sampled multi-token acceptance, token for token.

An untrained drafter is accepted in ~1-2% of steps, so "sampled DFlash == sampled AR" with it exercises
almost only block position 0. Here an Oracle drafter proposes the target's own *sampled* continuation
(the AR run with the same seed): every draft must be accepted, so the target samples at block positions
1..B-1 must equal AR's samples at those token positions (a noise key wrong for positions >= 1 fails this).
A second Oracle is right for k tokens and then wrong: every step must commit exactly k + 1 tokens (k drafts
+ the target's bonus sample at the first wrong one), and the output must still be AR's.
"""
from __future__ import annotations

import pytest
import torch

# test_sample_kernels is imported at collection: it sets TRITON_INTERPRET (no CUDA) before triton is imported,
# which the tiny_pair fixture's checkpoint writer (transformers) does; imported inside a test, the kernels failed
# in the interpreter
from tests.runtime.oracle import OracleEngine
from tests.runtime.test_sample_kernels import sampling_kernels_only
from trtllm_dflash.testing import VOCAB
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_NEW = 40
CFG = dict(max_seq_len=256, max_batch_size=4)
SETTINGS = {
    "temperature": dict(temperature=1.0),
    "top_k": dict(temperature=0.8, top_k=5),
    "top_p": dict(temperature=1.2, top_p=0.8),
    "mixed": None,  # one batch whose rows use greedy, temperature, top-k and top-p side by side
}
MIXED = [dict(), dict(temperature=1.0), dict(temperature=0.8, top_k=5), dict(temperature=1.2, top_p=0.8)]


def prompts(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, VOCAB - 2, (k,), generator=g).tolist() for k in [5, 19, 2, 33, 11, 7][:n]]


def params(setting: str, n: int, max_new: int) -> list[SamplingParams]:
    kws = [MIXED[i % len(MIXED)] for i in range(n)] if SETTINGS[setting] is None else [SETTINGS[setting]] * n
    return [SamplingParams(max_new_tokens=max_new, ignore_eos=True, seed=100 + i, **kw) for i, kw in enumerate(kws)]


class SampledOracle(OracleEngine):
    """Drafts the request's AR-sampled continuation; ``right`` = how many drafts per block are correct
    (None = all), the next one is made wrong."""

    right: int | None = None

    def wrong(self, k: int, j: int) -> bool:
        return self.right is not None and j == self.right


@pytest.fixture(scope="module")
def ar_truth(tiny_pair):
    """AR sampled outputs, longer than the DFlash run so a draft past its budget is still the true token."""
    ar = Engine.from_dirs(tiny_pair[0], None, RuntimeConfig(block_size=1, **CFG))
    out = {}
    for setting in SETTINGS:
        ps = prompts(6)
        res = ar.generate(ps, params(setting, 6, MAX_NEW + 8))
        out[setting] = {tuple(p): r.output_ids for p, r in zip(ps, res)}
    return out


def run_oracle(tiny_pair, truth, right):
    SampledOracle.truth, SampledOracle.right = truth, right
    return SampledOracle.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(**CFG))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_oracle_with_the_targets_sampled_continuation_is_accepted_in_full(tiny_pair, ar_truth, setting):
    truth = ar_truth[setting]
    eng = run_oracle(tiny_pair, truth, None)
    ps = prompts(6)  # 6 requests over 4 slots: rows join and leave mid-run
    out = eng.generate(ps, params(setting, 6, MAX_NEW))
    B = eng.block_size
    for p, r in zip(ps, out):
        assert r.output_ids == truth[tuple(p)][:MAX_NEW], f"row {ps.index(p)}: DFlash sampled != AR sampled"
        # every step commits the whole block: B-1 accepted drafts + the bonus sample
        assert r.stats.acceptance_lengths == [B] * len(r.stats.acceptance_lengths), r.stats.acceptance_lengths
    assert eng.metrics()["max_active_batch"] == 4
    if setting != "mixed":  # the sampled rows really sampled: they differ from one another
        assert len({tuple(r.output_ids) for r in out}) == 6


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("right", [0, 2, 5])
def test_oracle_right_for_k_tokens_then_wrong_commits_k_plus_one(tiny_pair, ar_truth, setting, right):
    truth = ar_truth[setting]
    eng = run_oracle(tiny_pair, truth, right)
    ps = prompts(4)
    out = eng.generate(ps, params(setting, 4, MAX_NEW))
    for p, r in zip(ps, out):
        assert r.output_ids == truth[tuple(p)][:MAX_NEW], f"row {ps.index(p)}: DFlash sampled != AR sampled"
        assert set(r.stats.acceptance_lengths) == {right + 1}, r.stats.acceptance_lengths
        assert r.stats.num_accepted_draft_tokens == right * len(r.stats.acceptance_lengths)


@pytest.mark.parametrize("right", [None, 2])
def test_oracle_with_the_sampling_kernels(tiny_pair, ar_truth, right, monkeypatch):
    """The same with the decode step's sampling + acceptance in the Triton kernels (runtime/kernels/sample.py, in
    the interpreter on the CPU): DFlash sampled == AR sampled (AR on the torch path), token for token."""
    calls = sampling_kernels_only(monkeypatch)
    truth = ar_truth["temperature"]
    SampledOracle.truth, SampledOracle.right = truth, right
    eng = SampledOracle.from_dirs(tiny_pair[0], tiny_pair[1], RuntimeConfig(**CFG, kernels="triton"))
    ps = prompts(4)
    out = eng.generate(ps, params("temperature", 4, 16))
    B = eng.block_size
    for p, r in zip(ps, out):
        assert r.output_ids == truth[tuple(p)][:16], f"row {ps.index(p)}: DFlash sampled != AR sampled"
        assert set(r.stats.acceptance_lengths) == {B if right is None else right + 1}, r.stats.acceptance_lengths
    assert calls["sample_accept"] > 0
