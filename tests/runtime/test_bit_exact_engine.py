# SPDX-License-Identifier: Apache-2.0
"""Bit-exact generation in bfloat16 with RuntimeConfig.batch_invariant (DESIGN.md decision 10), on the CPU.

The torch path (the embedded default on a CPU), tiny Llama and Qwen3 pairs in bfloat16: greedy and seeded DFlash
== AR token for token (with the untrained drafter and with a drafter that proposes the AR answer with a planted
error every 5 tokens, so that verify blocks accept up to 5 tokens); a request's tokens alone == among 5 others
in 4 slots (other prompts, other lengths, requests joining and leaving); a prompt's KV cache (target and drafter)
the same bits prefilled in one chunk, in chunks or beside another prompt.

The Triton kernels in the interpreter (float16: the interpreter has no bfloat16 tl.dot), where triton is
installed: the same prefill-cache bits, and a decode row == the same token verified inside a block, through the
tiny target's layers. Kernel by kernel: tests/runtime/test_batch_invariance.py.
"""
from __future__ import annotations

import os

import pytest
import torch

from tests.runtime.oracle import PeriodicOracle
from trtllm_dflash.testing import VOCAB
from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"   # before the kernels are imported (the interpreter tests below)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PAIRS = ["tiny_pair", "tiny_qwen3_pair"]
CFG = dict(max_seq_len=160, max_batch_size=4, dtype="bfloat16", kernels="torch", batch_invariant=True)


def prompts(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB - 2, (k,), generator=g).tolist() for k in [3, 17, 1, 40, 9, 25][:n]]


def outputs(engine, ps, params):
    return [r.output_ids for r in engine.generate(ps, params)]


PARAMS = {"greedy": SamplingParams(max_new_tokens=40, ignore_eos=True),
          "seeded": [SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=1.0, seed=s) for s in range(6)]}


@pytest.mark.parametrize("pair_name", PAIRS)
@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_bf16_dflash_equals_ar_token_for_token(request, pair_name, mode):
    pair = request.getfixturevalue(pair_name)
    ps, params = prompts(), PARAMS[mode]
    ar = outputs(Engine.from_dirs(pair[0], None, RuntimeConfig(block_size=1, **CFG)), ps, params)
    assert outputs(Engine.from_dirs(pair[0], pair[1], RuntimeConfig(**CFG)), ps, params) == ar
    PeriodicOracle.truth = {tuple(p): out for p, out in zip(ps, ar)}
    oracle = PeriodicOracle.from_dirs(pair[0], pair[1], RuntimeConfig(**CFG))
    reqs = oracle.generate(ps, params)
    assert [r.output_ids for r in reqs] == ar
    assert min(r.stats.tau for r in reqs) > 3.5   # blocks of up to 5 tokens verified: the rows that differ from AR


@pytest.mark.parametrize("pair_name", PAIRS)
@pytest.mark.parametrize("block_size", [1, None])
def test_bf16_a_request_alone_equals_it_among_others(request, pair_name, block_size):
    """4 slots, 6 requests: the batch and its longest context change every few steps around each request."""
    pair = request.getfixturevalue(pair_name)
    engine = Engine.from_dirs(pair[0], pair[1], RuntimeConfig(block_size=block_size, **CFG))
    ps, params = prompts(), PARAMS["greedy"]
    together = outputs(engine, ps, params)
    assert [outputs(engine, [p], params)[0] for p in ps] == together
    assert len({tuple(t) for t in together}) == len(ps)


def _prefill(engine, plan, ps):
    """Run the prefill ``plan`` (steps of (slot, begin, end) chunks) through the runner -> the caches."""
    for chunks in plan:
        engine.runner.prefill(chunks, {s: ps[s] for s, _, _ in chunks})
    return engine.runner.cache, engine.runner.draft_cache


def _same_prompt_cache(make_engine, ps, cuts=(5, 11), first=False):
    """Prompt 0 prefilled in one chunk, in chunks cut at ``cuts`` (the first beside prompt 1's first chunk), and
    beside prompt 1 in slot 1 (prompt 0 the first row if ``first``): its target and drafter cache rows are the same
    bits."""
    L0, L1 = len(ps[0]), len(ps[1])
    ends = [*cuts, L0]
    chunked = [[(0, b, e)] for b, e in zip([0, *cuts], ends)]
    chunked[0].append((1, 0, 9))
    chunked[-1].append((1, 9, L1))
    plans = {"alone": [[(0, 0, L0)]], "chunked": chunked,
             "beside": [[(0, 0, L0), (1, 0, L1)] if first else [(1, 0, L1), (0, 0, L0)]]}
    rows = {}
    for name, plan in plans.items():
        engine = make_engine()
        cache, draft = _prefill(engine, plan, ps)
        rows[name] = [c.k[:, 0, :, :L0].clone() for c in (cache, draft)] + [c.v[:, 0, :, :L0].clone() for c in (cache, draft)]
    for name in ("chunked", "beside"):
        for a, b in zip(rows[name], rows["alone"]):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("pair_name", PAIRS)
def test_bf16_prefill_cache_is_the_same_alone_chunked_or_beside_others(request, pair_name):
    pair = request.getfixturevalue(pair_name)
    ps = [prompts()[3], prompts()[1]]   # 40 and 17 tokens
    _same_prompt_cache(lambda: Engine.from_dirs(pair[0], pair[1], RuntimeConfig(**CFG)), ps)


# ---- the Triton kernels (interpreter) ------------------------------------------------------------------------

def _triton():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    return dict(CFG, dtype="float16", kernels="triton", max_seq_len=96)


@pytest.mark.exhaustive   # minutes in the interpreter: 70-token prompts through 64-row tiles
def test_triton_prefill_cache_is_the_same_alone_chunked_or_beside_others(tiny_qwen3_pair):
    """Chunks cut at a whole GEMM / attention tile (64 rows): in the interpreter a row's bits depend on its place
    in the tile (test_batch_invariance.py says why); on a GPU any cut gives the same bits."""
    cfg = _triton()
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(2, VOCAB - 2, (k,), generator=g).tolist() for k in (70, 20)]
    _same_prompt_cache(lambda: Engine.from_dirs(*tiny_qwen3_pair, RuntimeConfig(**cfg)), ps, cuts=(64,), first=True)


def test_triton_decode_row_equals_the_row_inside_a_verify_block(tiny_qwen3_pair):
    """Through the tiny Qwen3 target with every op in the Triton kernels: a token decoded alone (AR: 1 row, one
    request) == the same token at the same position inside a 5-row verify block beside another request with a
    longer context (the logits' bits), and its cache rows too."""
    cfg = _triton()
    ps = prompts()
    logits, caches = [], []
    for batch in (1, 2):
        engine = Engine.from_dirs(tiny_qwen3_pair[0], None, RuntimeConfig(**dict(cfg, block_size=1)))
        r = engine.runner
        _prefill(engine, [[(0, 0, 9)] + ([(1, 0, 30)] if batch == 2 else [])], {0: ps[3][:9], 1: ps[3][:30]})
        T = 1 if batch == 1 else 5
        ids = torch.tensor([ps[3][9:9 + T]] * batch)
        pos = torch.arange(9, 9 + T).expand(batch, T) + torch.tensor([[0], [21]])[:batch]
        with torch.inference_mode():
            h, _ = engine.target(ids, pos, r.cache, slice(0, batch), 9 + T + (21 if batch == 2 else 0))
            logits.append(engine.target.logits(h)[0, 0])
        caches.append((r.cache.k[:, 0, :, :10].clone(), r.cache.v[:, 0, :, :10].clone()))
    assert torch.equal(logits[0], logits[1])
    assert all(torch.equal(a, b) for a, b in zip(*caches))
