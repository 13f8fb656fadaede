# SPDX-License-Identifier: Apache-2.0
"""Which tile shape decides a row's bits in the Triton GEMM (``pytest -m gpu``)? The batch-invariant mode fixed one
tile for every row count (kernels/gemm.py invariant_config: BLOCK_M 64, BLOCK_N 16 at the 8B shapes), which re-read
each weight tile once per 64 rows: a DFlash verify of 64 x 16 rows cost 3.8x the default path on an H200. If a
row's bits depend only on BLOCK_K and the instruction family (Hopper's wgmma from BLOCK_M 64 on), the mode can widen
BLOCK_N and BLOCK_M with the row count and still be batch invariant. This measures it: the same 1,024 rows through
tiles that differ in BLOCK_M, BLOCK_N, warps and stages, at a fixed BLOCK_K, against the narrowest tile's bits; and
which changes do alter them (BLOCK_K; BLOCK_M 16 and 32, which Triton runs on mma.sync rather than wgmma).
First answer (benchmarks/results/gemm_tile_bits_h200.log, one H200, triton 3.6): at BLOCK_K 128 every tile kept
every row's bits, and BLOCK_K 256, BLOCK_M 16 and BLOCK_M 32 changed none of the 1,024 rows either (that run's
BLOCK_K 256 case asked for more shared memory than a block has; _fit now drops pipeline stages until it fits).

The any-tile test (test_every_dot_tile_gives_a_row_the_bits_of_the_decode_tile) asks the wider question a cheaper
batch-invariant rule would rest on (the default decode tiles for decode-sized row counts and a compute-sized tile,
BLOCK_K 64, for prefill, instead of one BLOCK_K for every row count): at the real Qwen3-8B and SmolLM2 shapes, does
every tl.dot tile, whatever its BLOCK_M (mma.sync or wgmma), BLOCK_N and BLOCK_K, give a row the bits of the decode
tile? Its table (``pytest -s``) is the measurement; the FMA tile (BLOCK_M 1, another inner product) is the control
that should differ."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

N, K, ROWS = 4096, 4096, 1024


def _rows(cfg, x, w):
    from trtllm_dflash.runtime.kernels.gemm import linear
    return linear(x, w, cfg=_fit(cfg))


def _fit(cfg, gated=False):
    """cfg with as few pipeline stages as its tiles need to fit the shared memory (the kernel refuses more)."""
    from dataclasses import replace

    from trtllm_dflash.runtime.kernels.gemm import MAX_SMEM
    while cfg.num_stages > 1 and cfg.smem(gated, 2) > MAX_SMEM:
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


# (name, K, N output columns, gated) at tp 1: Qwen3-8B's decoder GEMMs and the first 8,192 columns of its lm_head (all
# 151,936 would add minutes and gigabytes, not a new inner product), SmolLM2-135M's (N and K not multiples of 128:
# masked column and K tiles)
ANY_TILE_SHAPES = [("qwen3-8b/qkv", 4096, 6144, False), ("qwen3-8b/o_proj", 4096, 4096, False),
                   ("qwen3-8b/gate_up", 4096, 12288, True), ("qwen3-8b/down", 12288, 4096, False),
                   ("qwen3-8b/lm_head[:8192]", 4096, 8192, False), ("smollm2/qkv", 576, 960, False),
                   ("smollm2/o_proj", 576, 576, False), ("smollm2/gate_up", 576, 1536, True),
                   ("smollm2/down", 1536, 576, False)]


def _candidates():
    """(label, Config) of tl.dot tiles: every BLOCK_M x BLOCK_K pair of {16, 32, 64, 128} x {32, 64, 128, 256} once
    (the instruction family and the K step, the two that could plausibly reorder a row's sum), BLOCK_N cycling through
    16, 64 and 128 across them, 8 warps for 128 rows and for a few 64-row tiles; a sample, not the product, so that
    the test compiles a few dozen kernels rather than 200."""
    from trtllm_dflash.runtime.kernels.gemm import Config
    out = []
    for i, bm in enumerate((16, 32, 64, 128)):
        for j, bk in enumerate((32, 64, 128, 256)):
            bn = (16, 64, 128)[(i + j) % 3]
            warps = 8 if bm == 128 or (bm == 64 and bn == 128) else 4
            out.append((f"m{bm}k{bk}", Config(bm, bn, bk, warps, 3)))
    return out


def _label(c):
    return f"m{c.block_m}n{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}"


@pytest.mark.parametrize("name,K,N,gated", ANY_TILE_SHAPES)
def test_every_dot_tile_gives_a_row_the_bits_of_the_decode_tile(name, K, N, gated):
    """1,024 random bf16 rows; the reference is pick_config(16)'s tile in launches of 16 rows (an AR or verify step's
    tile). Every candidate tl.dot tile (_candidates, after _fit; a tile that does not fit even in one stage is left
    out and listed), the batch-invariant mode's tiles (invariant_config at 1, 64, 128 and 1,024 rows) and the default
    tiles at 64 and 1,024 rows each run all 1,024 rows in one launch; the rows whose bits differ are counted per tile
    and every tile is run before the assertion, so one run reports them all. The FMA tile (BLOCK_M 1) is a control:
    reported, not asserted (a different inner product; it should differ)."""
    from trtllm_dflash.runtime.kernels import gemm as G
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    sms = G.num_sms(dev)
    g = torch.Generator(dev).manual_seed(0)
    x = torch.randn(ROWS, K, device=dev, generator=g).to(torch.bfloat16)
    w = (torch.randn(2 * N if gated else N, K, device=dev, generator=g) * K ** -0.5).to(torch.bfloat16)

    def run(cfg, rows=x):
        return G.gate_up_silu(rows, w, cfg) if gated else G.linear(rows, w, cfg=cfg)

    ref_cfg = G.pick_config(16, N, K, gated, 2, sms)
    ref = torch.cat([run(ref_cfg, x[a:a + 16]) for a in range(0, ROWS, 16)]).view(torch.int16)
    tiles = [(f"invariant M={m}", G.invariant_config(m, N, K, gated, 2, sms)) for m in (1, 64, 128, ROWS)]
    tiles += [(f"default M={m}", G.pick_config(m, N, K, gated, 2, sms)) for m in (64, ROWS)] + _candidates()
    controls = [("fma (control)", G.Config(1, 32, 256, 4, 3))]
    rows, differ, skipped = [], {}, []
    for (what, cfg), control in [(t, False) for t in tiles] + [(t, True) for t in controls]:
        cfg = _fit(cfg, gated)
        if cfg.smem(gated, 2) > G.MAX_SMEM:
            skipped.append(f"{what} {_label(cfg)}")
            continue
        n = int((run(cfg).view(torch.int16) != ref).any(dim=-1).sum())
        rows.append((what, _label(cfg), "wgmma" if cfg.block_m >= 64 else "mma" if cfg.block_m > 1 else "fma", n))
        if n and not control:
            differ[f"{what} {_label(cfg)}"] = n
    print(f"\n{name} K={K} N={N} gated={gated}: rows (of {ROWS}) whose bits differ from {_label(ref_cfg)} "
          f"in launches of 16 rows")
    print(f"  {'tile':20s} {'config':20s} {'mma':6s} rows")
    for what, label, family, n in rows:
        print(f"  {what:20s} {label:20s} {family:6s} {n}")
    if skipped:
        print("  not run (over shared memory in one stage):", ", ".join(skipped))
    assert not differ, f"{name}: tl.dot tiles that change a row's bits (rows differing): {differ}"
