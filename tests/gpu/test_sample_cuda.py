# SPDX-License-Identifier: Apache-2.0
"""The sampling + acceptance kernels (runtime/kernels/sample.py) on the GPU in bf16 at real vocabularies
(SmolLM2 49,152; Qwen3 151,936), rows 1..64 x block 1 and 16, greedy and temperature rows mixed: against the
torch path they replace (sampling.sample / accept / commit), a float64 reference, and inside a CUDA graph.

Tokens vs the torch path are compared exactly: both run the same float32 ops on identical noise bits (a
correctly rounded division, -log(-log(u)), one add), so only a difference between torch's and Triton's float32
log could move a score, by an ulp, which flips a pick only at a near-tie (probability ~1e-6 per position here:
the gap between the top two Gumbel-max scores is ~Exp(1)). float64: the kernel's pick must score within 8 ulp
(float32, relative to the top score) of the float64 maximum; a wrong noise key or index is off by O(1).
"""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.runtime.graphs import capture
from trtllm_dflash.runtime.sampling import Commit, SamplingBatch, accept, commit, sample, uniform_noise

pytestmark = pytest.mark.gpu
DEV, BF16 = torch.device("cuda"), torch.bfloat16
VOCABS = {"smollm2": 49152, "qwen3": 151936}


def kernels():
    from trtllm_dflash.runtime.kernels import sample as K
    return K


def case(n: int, T: int, V: int, greedy: bool, seed: int = 0):
    """bf16 logits [n, T, V] (the lm_head's scale) with ties planted in even rows; a batch whose odd rows sample
    (unless greedy); positions [n, T]; drafts [n, T-1] right for a row-dependent prefix."""
    g = torch.Generator(DEV).manual_seed(seed)
    logits = (3 * torch.randn(n, T, V, device=DEV, generator=g)).to(BF16)
    logits[::2, :, V // 3] = logits[::2, :, V - 1] = 40.0          # first maximal index wins: V // 3
    temps = torch.zeros(n, device=DEV) if greedy else torch.where(
        torch.arange(n, device=DEV) % 2 == 1, 0.5 + torch.rand(n, device=DEV, generator=g), torch.zeros(n, device=DEV))
    seeds = torch.randint(-2**62, 2**62, (n,), device=DEV, generator=g)
    sb = SamplingBatch(temps, torch.zeros(n, dtype=torch.long, device=DEV), torch.ones(n, device=DEV), seeds,
                       greedy, False, False)
    pos = torch.randint(0, 30000, (n, 1), device=DEV, generator=g) + torch.arange(T, device=DEV)
    ref = sample(logits, sb, pos)
    draft = None
    if T > 1:
        draft = ref[:, :-1].clone()
        wrong = torch.arange(n, device=DEV) % T                     # row i: drafts right up to position i % T
        rows = torch.nonzero(wrong < T - 1)[:, 0]
        draft[rows, wrong[rows]] += 1
    return logits, sb, pos, draft, ref


def state(n: int, S: int = 4096, B: int = 16) -> Commit:
    g = torch.Generator(DEV).manual_seed(7)
    start = torch.randint(S - 3 * B, S - B, (n,), device=DEV, generator=g)   # some rows cross the limit
    return Commit(start, torch.arange(n, device=DEV), torch.arange(n, device=DEV) % 5 != 0, S - B)


def float64_gap(logits, sb, pos, t) -> torch.Tensor:
    """Per position: (max float64 score - float64 score of t) / max(|max|, 1)."""
    x = logits.double()
    temp = sb.temperature.double()[:, None, None]
    u = uniform_noise(sb.seed, pos, logits.shape[-1]).double()
    scores = torch.where(temp > 0, x / temp.clamp(min=1e-30) - torch.log(-torch.log(u)), x)
    top = scores.max(-1).values
    return (top - scores.gather(-1, t[..., None])[..., 0]) / top.abs().clamp(min=1)


@pytest.mark.parametrize("vocab", list(VOCABS))
@pytest.mark.parametrize("n,T", [(1, 1), (1, 16), (8, 16), (64, 16), (64, 1)])
@pytest.mark.parametrize("greedy", [True, False])
def test_kernels_equal_the_torch_path_bf16(vocab, n, T, greedy):
    K = kernels()
    logits, sb, pos, draft, ref = case(n, T, VOCABS[vocab], greedy)
    ref_a = accept(draft, ref)
    ref_state, st = state(n), state(n)
    commit(ref, ref_a, ref_state)
    t = torch.full((n, T), -1, dtype=torch.long, device=DEV)
    a = torch.full((n,), -1, dtype=torch.long, device=DEV)
    K.sample_accept(logits, sb, pos, draft, t, a, st)
    torch.cuda.synchronize()
    bad = (t != ref).sum().item()
    assert bad == 0, f"{bad} of {n * T} tokens differ; float64 gaps of the torch picks " \
                     f"{float64_gap(logits, sb, pos, ref)[t != ref].tolist()[:8]}"
    assert torch.equal(a, ref_a)
    assert torch.equal(t[::2, :], torch.full_like(t[::2, :], VOCABS[vocab] // 3))   # ties: the first index
    for got, want in ((st.start, ref_state.start), (st.last, ref_state.last), (st.active, ref_state.active)):
        assert torch.equal(got, want)
    assert (float64_gap(logits, sb, pos, t) <= 8 * 2.0**-23).all()


@pytest.mark.parametrize("vocab", list(VOCABS))
def test_kernels_in_a_cuda_graph(vocab):
    """Captured as the runner does (two eager runs on a side stream, then capture), replayed on new contents."""
    K = kernels()
    n, T, V = 16, 16, VOCABS[vocab]
    logits, sb, pos, draft, _ = case(n, T, V, False, seed=1)
    t = torch.zeros(n, T, dtype=torch.long, device=DEV)
    a = torch.zeros(n, dtype=torch.long, device=DEV)
    st = state(n)

    def fn():
        K.sample_accept(logits, sb, pos, draft, t, a, st)
    graph, _ = capture(fn)
    for seed in (2, 3):   # new logits, temperatures, seeds, positions and drafts, in place
        l2, sb2, p2, d2, ref = case(n, T, V, False, seed=seed)
        for buf, new in ((logits, l2), (sb.temperature, sb2.temperature), (sb.seed, sb2.seed), (pos, p2), (draft, d2)):
            buf.copy_(new)
        s_ref, s_new = state(n), state(n)
        commit(ref, accept(draft, ref), s_ref)
        for x, y in ((st.start, s_new.start), (st.last, s_new.last), (st.active, s_new.active)):
            x.copy_(y)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(t, ref) and torch.equal(a, accept(draft, ref))
        assert torch.equal(st.start, s_ref.start) and torch.equal(st.last, s_ref.last)
        assert torch.equal(st.active, s_ref.active)
