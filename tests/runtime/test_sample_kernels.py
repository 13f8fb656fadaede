# SPDX-License-Identifier: Apache-2.0
"""The sampling + acceptance kernels (runtime/kernels/sample.py) on the CPU, in Triton's interpreter: against
the torch path they replace (sampling.sample / accept / commit: tokens must be identical), against an
independent float64 reference (the noise hash in Python integers, the Gumbel-max score in float64), the law of
their draws (chi-square), and a tiny engine whose greedy and sampled tokens are the same with them as without.

float64 tolerance: the kernel scores in float32, so its pick may differ from the float64 argmax only where two
scores are within float32 rounding of each other: the score of its token must be within 8 ulp of the largest
score's magnitude (|score| 2^-23 each for the division, the two logs and the add, with margin); a wrong noise
key or index is off by O(1). Tokens vs the torch path are compared exactly: both run the same float32 ops
(numpy's and torch's logf agree here; on the GPU tests/gpu/test_sample_cuda.py checks the same).
Shapes are tiny (the interpreter runs one numpy program per (position, split)). Skipped without triton.
"""
from __future__ import annotations

import math
import os
from collections import Counter

import pytest
import torch

from tests.runtime.compare import compile_for_h100
from tests.runtime.kernel_engine import TWO_PROMPTS, count_calls, same_generation
from tests.runtime.test_sampling import chi_square_p
from trtllm_dflash.config import SamplingParams
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.sampling import Commit, SamplingBatch, accept, commit, filtered_logprobs, sample

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

M32 = 0xFFFFFFFF


def kernels():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.runtime.kernels import sample as K
    return K


def batch(temps: list[float], seeds: list[int]) -> SamplingBatch:
    n = len(temps)
    return SamplingBatch(torch.tensor(temps), torch.zeros(n, dtype=torch.long), torch.ones(n),
                         torch.tensor(seeds, dtype=torch.long), all(t == 0 for t in temps), False, False)


def logits_with_ties(n, T, V, dtype, seed=0) -> torch.Tensor:
    """Random logits [n, T, V] whose maximum is planted twice at chosen places: within one tile, across
    tiles and across splits (for block_v 16), and at the first and last vocab ids."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, T, V, generator=g)
    pairs = [(3, 9), (5, 40), (0, V - 1), (17, 70), (V - 20, V - 1)]
    for r in range(n):
        for t in range(T):
            i, j = pairs[(r * T + t) % len(pairs)]
            x[r, t, i] = x[r, t, j] = 8.0
    return x.to(dtype)


def mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x045D9F3B) & M32
    x ^= x >> 16
    x = (x * 0x045D9F3B) & M32
    return x ^ (x >> 16)


def reference_tokens(logits, temps, seeds, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference, written from the definition: (tokens [n, T], scores [n, T, V] float64)."""
    n, T, V = logits.shape
    x = logits.double()
    scores = x.clone()
    for r in range(n):
        if temps[r] == 0:
            continue
        seed = seeds[r] & ((1 << 64) - 1)
        s = (seed & M32) ^ mix32(seed >> 32)
        for t in range(T):
            h = mix32(s ^ mix32(int(positions[r, t]) & M32))
            g = torch.tensor([-math.log(-math.log(((mix32(h ^ mix32(v + 0x9E3779B)) >> 9) + 0.5) / 2**23))
                              for v in range(V)], dtype=torch.float64)
            scores[r, t] = x[r, t] / temps[r] + g
    return scores.argmax(-1), scores


def run(K, logits, sb, positions, draft, commit_state=None, **plan):
    n, T, _ = logits.shape
    t, a = torch.full((n, T), -1), torch.full((n,), -1)
    K.sample_accept(logits, sb, positions, draft, t, a, commit_state, **plan)
    return t, a


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("plan", [dict(block_v=16, programs=1), dict(block_v=16, programs=200),
                                  dict(block_v=32, programs=48), dict(block_v=128, programs=1)])
def test_kernel_samples_as_the_torch_path_and_float64(dtype, plan):
    K = kernels()
    n, T, V = 6, 4, 96
    temps = [0.0, 1.0, 0.7, 0.0, 2.0, 1.0]                   # greedy and sampled rows in one batch
    seeds = [1, -5, 2**40 + 3, 4, -(2**63), 2**63 - 1]        # negative / high-half seeds as SamplingBatch holds them
    sb = batch(temps, seeds)
    logits = logits_with_ties(n, T, V, dtype)
    pos = torch.randint(0, 5000, (n, T), generator=torch.Generator().manual_seed(1))
    ref = sample(logits, sb, pos)
    draft = torch.randint(0, V, (n, T - 1), generator=torch.Generator().manual_seed(2))
    draft[1], draft[2, :2], draft[4, 0] = ref[1, :-1], ref[2, :2], ref[4, 0]   # accept 3, 2, 1 (others ~0)
    t, a = run(K, logits, sb, pos, draft, **plan)
    assert torch.equal(t, ref)
    assert torch.equal(a, accept(draft, ref))
    assert a[1] == 3 and a[2] >= 2 and a[4] >= 1
    # greedy rows: torch.argmax's first maximal index (the planted ties)
    assert t[0].tolist() == [3, 5, 0, 17] and t[3].tolist() == [0, 17, 76, 3]
    want, scores = reference_tokens(logits, temps, seeds, pos)
    top = scores.max(-1).values
    picked = scores.gather(-1, t[..., None])[..., 0]
    assert (top - picked <= 8 * 2.0**-23 * top.abs().clamp(min=1)).all()
    assert (t == want).float().mean() > 0.95   # near-ties aside, the same tokens


def test_block_of_one_and_all_greedy():
    K = kernels()
    n, V = 3, 96
    logits = logits_with_ties(n, 1, V, torch.float32, seed=3)
    pos = torch.arange(n)[:, None]
    for temps in ([0.0, 0.0, 0.0], [0.0, 1.5, 0.3]):
        sb = batch(temps, [7, 8, 9])
        t, a = run(K, logits, sb, pos, None, block_v=16, programs=8)
        assert torch.equal(t, sample(logits, sb, pos)) and a.tolist() == [0, 0, 0]
    with pytest.raises(DFlashError):
        run(K, logits, sb, pos, torch.zeros(n, 0, dtype=torch.long))


@pytest.mark.parametrize("T", [1, 5])
def test_kernel_commit_equals_sampling_commit(T):
    K = kernels()
    n, V, limit = 6, 96, 20
    sb = batch([0.0, 1.0] * 3, list(range(n)))
    logits = logits_with_ties(n, T, V, torch.float32, seed=4)
    pos = torch.randint(0, 30, (n, T), generator=torch.Generator().manual_seed(5))
    ref_t = sample(logits, sb, pos)
    draft = None if T == 1 else ref_t[:, :-1].clone()
    if draft is not None:
        draft[::2, 1] += 1                                     # even rows accept 1, odd rows all T - 1
    start = torch.tensor([0, 3, 19, 16, 20, 2])
    last = torch.arange(100, 100 + n)
    active = torch.tensor([True, True, True, False, True, True])
    ref_state = Commit(start.clone(), last.clone(), active.clone(), limit)
    ref_a = accept(draft, ref_t)
    commit(ref_t, ref_a, ref_state)
    state = Commit(start.clone(), last.clone(), active.clone(), limit)
    t, a = run(K, logits, sb, pos, draft, state, block_v=16, programs=4)
    assert torch.equal(t, ref_t) and torch.equal(a, ref_a)
    for got, want in zip((state.start, state.last, state.active), (ref_state.start, ref_state.last, ref_state.active)):
        assert torch.equal(got, want)
    assert not state.active[3] and state.start[3] == 16        # inactive rows keep their state
    assert (~state.active).sum() > 1                            # some row crossed the limit


def test_top_k_and_top_p_are_refused():
    K = kernels()
    sb = SamplingBatch.from_params([SamplingParams(temperature=1.0, top_k=3)], "cpu")
    assert not K.handles(sb)
    with pytest.raises(DFlashError):
        run(K, torch.zeros(1, 1, 8), sb, torch.zeros(1, 1, dtype=torch.long), None)


def test_split_plan_covers_the_vocab_without_empty_splits():
    K = kernels()
    for positions in (1, 16, 1024):
        for V in (8, 96, 49152, 151936):
            for bv in (16, 1024, 4096):
                splits, per = K.split_plan(positions, V, bv, 528)
                assert per % bv == 0 and (splits - 1) * per < V <= splits * per


def test_kernel_draws_follow_the_target_law():
    """1,000 draws at temperature 0.5 (one row, 1,000 positions): chi-square against softmax(logits / 0.5);
    the same draws as the torch path, whose law test_sampling checks at 20,000 draws."""
    K = kernels()
    V, N = 8, 1000
    base = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    logits = base.expand(1, N, V)
    sb = SamplingBatch.from_params([SamplingParams(temperature=0.5, seed=11)], "cpu")
    pos = torch.arange(N)[None]
    t, _ = run(K, logits, sb, pos, torch.zeros(1, N - 1, dtype=torch.long), block_v=8, programs=1)
    assert torch.equal(t, sample(logits, sb, pos))
    law = filtered_logprobs(base[None, None], sb)[0, 0].exp()
    assert chi_square_p(Counter(t[0].tolist()), {i: law[i].item() for i in range(V)}, N) > 1e-3


def sampling_kernels_only(monkeypatch) -> dict:
    """Engines built after this run the sampling kernels where kernels="triton" but keep the models on the
    torch path (test_decode_attention covers those kernels; here they would only cost interpreter time): the
    choice that loader and engine make keeps only its ``sampling``. Returns {"sample_accept": its call count}."""
    from trtllm_dflash.runtime.kernels import Kernels
    choose = Kernels.choose
    monkeypatch.setattr(Kernels, "choose", classmethod(lambda cls, *a: cls(sampling=choose(*a).sampling)))
    return count_calls(monkeypatch, kernels(), ["sample_accept"], {"sample_accept": 0})


@pytest.mark.parametrize("block", [1, 4])
def test_engine_tokens_are_the_same_with_the_sampling_kernels(tiny_pair, block, monkeypatch):
    calls = sampling_kernels_only(monkeypatch)   # models on the torch attention in both engines (their default)
    ps = [*TWO_PROMPTS, [60, 2, 2]]
    greedy = [SamplingParams(max_new_tokens=8, ignore_eos=True)] * 3
    mixed = [SamplingParams(max_new_tokens=8, ignore_eos=True, temperature=t, seed=s)
             for t, s in ((0.0, 0), (0.8, 3), (1.5, -2))]
    for sp in (greedy, mixed):
        same_generation(*tiny_pair, dict(max_seq_len=64, max_batch_size=3, block_size=block), ps, sp)
    assert calls["sample_accept"] >= 14, calls   # every decode step of both batches sampled in the kernels


COMPILE_SM90 = '''
import itertools, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trtllm_dflash.runtime.kernels import sample as K
target = GPUTarget("cuda", 90, 32)
sig = {"logits_ptr": "*bf16", "s_ln": "i32", "s_lt": "i32", "temp_ptr": "*fp32", "seed_ptr": "*i64",
       "pos_ptr": "*i64", "s_pn": "i32", "s_pt": "i32", "val_ptr": "*fp32", "idx_ptr": "*i32", "T": "i32",
       "V": "i32", "PER_SPLIT": "i32", "SPLITS": "i32", "BLOCK_V": "constexpr", "SAMPLED": "constexpr"}
for sampled in (False, True):
    k = triton.compile(ASTSource(K._vocab_argmax, sig, {"BLOCK_V": 1024, "SAMPLED": sampled}), target=target)
    assert "lg2.approx" not in k.asm["ptx"]   # tl.log is libdevice's logf, as torch's log
sig = {"val_ptr": "*fp32", "idx_ptr": "*i32", "draft_ptr": "*i64", "s_dn": "i32", "t_ptr": "*i64", "s_tn": "i32",
       "a_ptr": "*i64", "start_ptr": "*i64", "last_ptr": "*i64", "active_ptr": "*i1", "limit": "i32", "T": "i32",
       "SPLITS": "i32", "BLOCK_T": "constexpr", "BLOCK_S": "constexpr", "COMMIT": "constexpr"}
for bt, bs, commit in ((16, 64, True), (1, 256, False)):
    triton.compile(ASTSource(K._finish, sig, {"BLOCK_T": bt, "BLOCK_S": bs, "COMMIT": commit}), target=target)
'''


def test_kernels_compile_for_the_h100():
    """The interpreter accepts code the compiler refuses (a plain global in a kernel did): compile both kernels
    to an sm_90 cubin (Triton's bundled ptxas; no GPU needed)."""
    compile_for_h100(COMPILE_SM90)
