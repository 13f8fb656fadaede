# SPDX-License-Identifier: Apache-2.0
"""tests/runtime/test_batch_invariance.py's kernel tests on CUDA (``pytest -m gpu``): there they run in bfloat16 as
well, with rows anywhere in their tile and a verify's token at any place in its block (the interpreter on the CPU
keeps each row's place, since numpy's BLAS tl.dot gives a row other bits at another place)."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.test_batch_invariance import (  # noqa: F401 (collected here, under the gpu mark)
    test_attention_rows_do_not_depend_on_the_block_the_batch_or_the_kv_length,
    test_attention_with_sinks_and_a_window_is_invariant_and_right, test_gemm_rows_do_not_depend_on_the_row_count,
    test_rms_norm_rows_do_not_depend_on_the_row_count,
    test_sampled_and_greedy_tokens_do_not_depend_on_the_batch_and_ties_go_to_the_lowest_id)

pytestmark = pytest.mark.gpu


# (name, K, N, gated) and the wide tile at 1,024 rows: Qwen3-8B's o_proj 128 x 32 at BLOCK_K 256 and gate_up_proj
# 64 x 32 (no 128-row gated tile fits the shared-memory budget at BLOCK_K 256: the 64-row tile stays); SmolLM2's o_proj
# 128 x 128 and gate_up_proj 128 x 64 at BLOCK_K 128
PREFILL_GEMMS = [("qwen3-8b/o_proj", 4096, 4096, False), ("qwen3-8b/gate_up", 4096, 12288, True),
                 ("smollm2/o_proj", 576, 576, False), ("smollm2/gate_up", 576, 1536, True)]


@pytest.mark.parametrize("name,K,N,gated", PREFILL_GEMMS)
def test_gemm_rows_of_a_prefill_sized_launch_are_those_of_an_ar_step(name, K, N, gated):
    """1,024 rows in one launch (the wide tile, from ROWS_WIDE rows) give each row the bits it gets alone (an AR
    step) and in launches of 16 and 64 rows (a verify block; the 64-row tile): the wide tile keeps BLOCK_K, the
    one tile parameter that moves a row's bits on the GPU (tests/gpu/test_gemm_tile_bits_cuda.py)."""
    from trtllm_dflash.runtime.kernels import gemm as G
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev, rows = torch.device("cuda"), 1024
    g = torch.Generator(dev).manual_seed(0)
    x = torch.randn(rows, K, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * N if gated else N, K, device=dev, generator=g) * K ** -0.5).to(torch.bfloat16)
    f = (lambda x: G.gate_up_silu(x, w, invariant=True)) if gated else (lambda x: G.linear(x, w, invariant=True))
    wide, narrow = (G.invariant_config(m, N, K, gated, 2, G.num_sms(dev)) for m in (rows, 1))
    assert wide.block_k == narrow.block_k and narrow.block_m == G.INVARIANT_BLOCK_M, name
    assert wide.block_m == (64 if name == "qwen3-8b/gate_up" else 128), (name, wide)
    full = f(x)
    bits = full.view(torch.int16)
    for m in (16, 64):
        parts = torch.cat([f(x[a:a + m]) for a in range(0, rows, m)])
        same = (parts.view(torch.int16) == bits).all(dim=-1)
        assert bool(same.all()), f"{name}: {int((~same).sum())} of {rows} rows differ in launches of {m} and {rows}"
    alone = torch.cat([f(x[a:a + 1]) for a in range(rows)])
    same = (alone.view(torch.int16) == bits).all(dim=-1)
    assert bool(same.all()), f"{name}: {int((~same).sum())} of {rows} rows differ between M = 1 and M = {rows}"
