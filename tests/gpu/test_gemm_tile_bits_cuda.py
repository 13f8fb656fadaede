# SPDX-License-Identifier: Apache-2.0
"""Which tile shape decides a row's bits in the Triton GEMM (``pytest -m gpu``)? The batch-invariant mode fixes one
tile for every row count (kernels/gemm.py invariant_config: BLOCK_M 64, BLOCK_N 16 at the 8B shapes), which re-reads
each weight tile once per 64 rows: a DFlash verify of 64 x 16 rows cost 3.8x the default path on an H200. If a
row's bits depend only on BLOCK_K and the instruction family (Hopper's wgmma from BLOCK_M 64 on), the mode can widen
BLOCK_N and BLOCK_M with the row count and still be batch invariant. This measures it: the same 1,024 rows through
tiles that differ in BLOCK_M, BLOCK_N, warps and stages, at a fixed BLOCK_K, against the narrowest tile's bits; and
which changes do alter them (BLOCK_K; BLOCK_M 16 and 32, which Triton runs on mma.sync rather than wgmma).
First answer (benchmarks/results/gemm_tile_bits_h200.log, one H200, triton 3.6): at BLOCK_K 128 every tile kept
every row's bits, and BLOCK_K 256, BLOCK_M 16 and BLOCK_M 32 changed none of the 1,024 rows either (that run's
BLOCK_K 256 case asked for more shared memory than a block has; _fit now drops pipeline stages until it fits)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

N, K, ROWS = 4096, 4096, 1024


def _rows(cfg, x, w):
    from trtllm_dflash.runtime.kernels.gemm import linear
    return linear(x, w, cfg=_fit(cfg))


def _fit(cfg):
    """cfg with as few pipeline stages as its tiles need to fit the shared memory (the kernel refuses more)."""
    from dataclasses import replace

    from trtllm_dflash.runtime.kernels.gemm import MAX_SMEM
    while cfg.num_stages > 1 and cfg.smem(False, 2) > MAX_SMEM:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


@pytest.fixture(scope="module")
def data():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, K, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16)
    return x, w


@pytest.mark.parametrize("block_k", [128, 256])
def test_rows_keep_their_bits_across_block_m_block_n_warps_and_stages_at_one_block_k(data, block_k):
    from trtllm_dflash.runtime.kernels.gemm import Config
    x, w = data
    ref = _rows(Config(64, 16, block_k, 4, 3), x, w)
    for cfg in (Config(64, 32, block_k, 4, 3), Config(64, 64, block_k, 4, 3), Config(64, 128, block_k, 4, 2),
                Config(128, 64, block_k, 4, 2), Config(128, 128, block_k, 8, 2), Config(64, 64, block_k, 8, 2),
                Config(64, 16, block_k, 4, 2)):
        out = _rows(cfg, x, w)
        same = (out.view(torch.int16) == ref.view(torch.int16)).all(dim=-1)
        assert bool(same.all()), f"{cfg}: {int((~same).sum())} of {ROWS} rows differ from {Config(64, 16, block_k)}"
    # and a row alone: its bits as in the batch of 1,024 (rows past M are masked, not computed differently)
    for cfg in (Config(64, 16, block_k, 4, 3), Config(128, 128, block_k, 8, 2)):
        assert torch.equal(_rows(cfg, x[5:6], w), ref[5:6]), cfg


def test_what_does_change_the_bits(data):
    """Recorded, not required: BLOCK_K (the K order of the float32 accumulation) and BLOCK_M below 64."""
    from trtllm_dflash.runtime.kernels.gemm import Config
    x, w = data
    ref = _rows(Config(64, 16, 128, 4, 3), x, w)
    changed = {}
    for cfg in (Config(64, 16, 256, 4, 3), Config(16, 16, 128, 4, 3), Config(32, 16, 128, 4, 3)):
        out = _rows(cfg, x, w)
        changed[str(cfg)] = int((out.view(torch.int16) != ref.view(torch.int16)).any(dim=-1).sum())
    print("rows whose bits differ from Config(64, 16, 128):", changed)
    # and what each tile costs on all 1,024 rows (a DFlash verify of 64 requests x 16 tokens), beside cuBLAS
    import triton.testing
    ms = {str(_fit(cfg)): triton.testing.do_bench(lambda cfg=cfg: _rows(cfg, x, w))
          for cfg in (Config(64, 16, 256, 4, 3), Config(64, 64, 256, 4, 2), Config(128, 64, 256, 8, 2),
                      Config(128, 128, 128, 8, 3), Config(128, 128, 256, 8, 2))}
    ms["cublas"] = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w))
    print("ms for 1024 x 4096 x 4096:", {k: round(v, 4) for k, v in ms.items()})
