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


# (name, K, N, gated): at 1,024 rows the compute tile (128 x 128 x 64 for the 8B shapes, 128 x 64 x 64 for SmolLM2's),
# in launches of 1 and 16 rows pick_config's 16-row tile (at K >= 2048 BLOCK_K 256 for the plain ones, 128 for
# gate_up), of 64 its 64-row tile (BLOCK_K 128)
PREFILL_GEMMS = [("qwen3-8b/qkv", 4096, 6144, False), ("qwen3-8b/o_proj", 4096, 4096, False),
                 ("qwen3-8b/gate_up", 4096, 12288, True), ("qwen3-8b/down", 12288, 4096, False),
                 ("smollm2/o_proj", 576, 576, False), ("smollm2/gate_up", 576, 1536, True)]


@pytest.mark.parametrize("name,K,N,gated", PREFILL_GEMMS)
def test_gemm_rows_of_a_prefill_sized_launch_are_those_of_an_ar_step(name, K, N, gated):
    """1,024 rows in one launch (the compute tile, above INVARIANT_DECODE_ROWS rows) give each row the bits it gets
    alone (an AR step) and in launches of 16 and 64 rows (verify blocks; the decode tiles): no tl.dot tile moves a
    row's bits on the GPU (tests/gpu/test_gemm_tile_bits_cuda.py), and the invariant mode never takes another."""
    from trtllm_dflash.runtime.kernels import gemm as G
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev, rows = torch.device("cuda"), 1024
    g = torch.Generator(dev).manual_seed(0)
    x = torch.randn(rows, K, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * N if gated else N, K, device=dev, generator=g) * K ** -0.5).to(torch.bfloat16)
    f = (lambda x: G.gate_up_silu(x, w, invariant=True)) if gated else (lambda x: G.linear(x, w, invariant=True))
    tiles = {m: G.invariant_config(m, N, K, gated, 2, G.num_sms(dev)) for m in (1, 16, 64, rows)}
    assert tiles[rows].block_m == G.COMPUTE_BLOCK_M and tiles[1] == G.pick_config(1, N, K, gated, 2, G.num_sms(dev))
    print(f"{name}: invariant tiles by rows per launch {tiles}")
    full = f(x)
    bits = full.view(torch.int16)
    for m in (16, 64):
        parts = torch.cat([f(x[a:a + m]) for a in range(0, rows, m)])
        same = (parts.view(torch.int16) == bits).all(dim=-1)
        assert bool(same.all()), f"{name}: {int((~same).sum())} of {rows} rows differ in launches of {m} and {rows}"
    alone = torch.cat([f(x[a:a + 1]) for a in range(rows)])
    same = (alone.view(torch.int16) == bits).all(dim=-1)
    assert bool(same.all()), f"{name}: {int((~same).sum())} of {rows} rows differ between M = 1 and M = {rows}"
