# SPDX-License-Identifier: Apache-2.0
"""Statistical checks: the sampler draws from the filtered target law, and DFlash verification keeps the
target's sequence law (a wrong acceptance rule is caught by the same test)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from trtllm_dflash.testing import write_tiny_pair
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime import runner as runner_mod
from trtllm_dflash.runtime.engine import Engine
from trtllm_dflash.runtime.sampling import SamplingBatch, filtered_logprobs, sample, uniform_noise, unit_interval


def chi_square_p(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square p-value; cells expecting < 5 are pooled (the usual validity rule)."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for k, p in probs.items():
        if p * n < 5:
            pool_o, pool_e = pool_o + counts.get(k, 0), pool_e + p * n
        else:
            obs.append(counts.get(k, 0))
            exp.append(p * n)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    obs, exp = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = ((obs - exp) ** 2 / exp).sum()
    return torch.special.gammaincc(torch.tensor((len(exp) - 1) / 2.0, dtype=torch.float64), stat / 2).item()


def test_noise_is_uniform_and_keyed_on_seed_and_position():
    u = uniform_noise(torch.tensor([3, 3, 4]), torch.tensor([[7], [7], [7]]), 50000)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    counts = torch.histc(u[2].double(), bins=10, min=0, max=1)
    assert chi_square_p({i: c.item() for i, c in enumerate(counts)}, {i: 0.1 for i in range(10)}, 50000) > 1e-3
    # the extreme hash values stay inside (0, 1): u = 1 would give a Gumbel score of +inf (that token always wins)
    ends = unit_interval(torch.tensor([0, 2**32 - 1]))
    assert ends.dtype == torch.float32 and 0 < ends[0] and ends[1] < 1
    assert torch.isfinite(-torch.log(-torch.log(ends))).all()


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.5), dict(temperature=1.0, top_k=3),
                                dict(temperature=0.8, top_p=0.7), dict(temperature=2.0, top_k=5, top_p=0.9)])
def test_sampler_draws_from_the_filtered_law(kw):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    n = 20000
    sb = SamplingBatch.from_params([SamplingParams(seed=11, **kw)], "cpu")
    draws = sample(logits.expand(1, n, 8), sb, torch.arange(n)[None])[0]
    law = filtered_logprobs(logits[None, None], sb)[0, 0].exp()
    probs = {i: law[i].item() for i in range(8)}
    counts = Counter(draws.tolist())
    assert all(counts.get(i, 0) == 0 for i in range(8) if probs[i] == 0)  # filtered tokens never appear
    assert chi_square_p(counts, {i: p for i, p in probs.items() if p > 0}, n) > 1e-3
    # the filter itself: top-k keeps k tokens, top-p keeps the smallest prefix of mass >= p
    kept = (law > 0).sum().item()
    if "top_k" in kw:
        assert kept <= kw["top_k"]
    if "top_p" in kw and "top_k" not in kw:
        full = torch.softmax(logits / kw["temperature"], -1)
        assert full[:kept].sum() >= kw["top_p"] > full[: kept - 1].sum()


class FixedDraftEngine(Engine):
    """An adversarial drafter that always proposes token 3."""

    def _propose(self, last, pos, start, rows, ctx_len, num_drafts):
        return torch.full((pos.shape[0], pos.shape[1] - 1), 3, device=self.device)


def _sequence_law(target_dir, prompt: list[int], depth: int) -> dict:
    """Exact P(y1..y_depth | prompt) at T=1 by enumeration with HF transformers (independent reference)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    law = {(): 1.0}
    for _ in range(depth):
        prefixes = list(law)
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        with torch.no_grad():
            probs = model(ids).logits[:, -1].softmax(-1)
        law = {p + (t,): law[p] * probs[i, t].item() for i, p in enumerate(prefixes) for t in range(probs.shape[1])}
    return law


def _draw(target, drafter, prompt, n, monkeypatch=None, wrong_rule=False):
    if wrong_rule:  # accept every draft: commits target samples conditioned on the WRONG prefix
        monkeypatch.setattr(runner_mod, "accept", lambda d, t: torch.full((d.shape[0],), d.shape[1]))
    eng = FixedDraftEngine.from_dirs(target, drafter, RuntimeConfig(max_seq_len=32, max_batch_size=128, block_size=4))
    sps = [SamplingParams(max_new_tokens=3, temperature=1.0, seed=s, ignore_eos=True) for s in range(n)]
    return Counter(tuple(r.output_ids) for r in eng.generate([prompt] * n, sps))


def test_dflash_verification_preserves_the_target_law(tmp_path, monkeypatch):
    target, drafter = write_tiny_pair(tmp_path, vocab=6, block_size=4, target_layer_ids=(1, 2))
    prompt = [1, 4, 2]
    law = _sequence_law(target, prompt, 3)  # 216 sequences
    n = 6000
    assert chi_square_p(_draw(target, drafter, prompt, n), law, n) > 1e-3
    # the same test rejects a wrong acceptance rule (so it has power)
    assert chi_square_p(_draw(target, drafter, prompt, n, monkeypatch, wrong_rule=True), law, n) < 1e-6
