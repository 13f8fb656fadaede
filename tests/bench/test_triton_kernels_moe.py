# SPDX-License-Identifier: Apache-2.0
"""gpt_oss_step --compare triton_kernels on the CPU: a missing library is a one-line error before anything is
built; the bytes handed to matmul_ogs (W as [E, K, N], MXFP4 along K, columns the interleaved gate/linear pairs)
compute our experts under matmul_ogs's documented math (gather, x @ W + bias, SwiGLU on adjacent column pairs
with alpha, the clamp and +1, then x @ W + bias, times the router weight, scatter-add); the routing mask has
one bit per (token, expert)."""
from __future__ import annotations

import sys

import pytest
import torch

from trtllm_dflash.bench import gpt_oss_step, triton_kernels_moe
from trtllm_dflash.bench.routing_trace import Routing
from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture
def no_triton_kernels(monkeypatch):
    for name in ("triton_kernels", "triton_kernels.swiglu"):
        monkeypatch.setitem(sys.modules, name, None)   # import raises ImportError, installed or not


def test_missing_library_is_a_one_line_error(no_triton_kernels):
    with pytest.raises(SystemExit) as err:
        triton_kernels_moe.load()
    msg = str(err.value)
    assert msg.startswith("--compare triton_kernels needs triton_kernels") and "vllm/third_party" in msg
    assert "\n" not in msg


def test_benchmark_stops_before_building_when_the_library_is_missing(no_triton_kernels, monkeypatch):
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare triton_kernels needs triton_kernels"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "triton_kernels"])


def decode_k_major(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """MXFP4 packed along dim 1 (two K values per byte, low nibble first; one E8M0 scale per 32 K values):
    w [E, K/2, N] uint8, s [E, K/32, N] uint8 -> [E, K, N] float64. Written from the OCP MX format, not ours."""
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    nibbles = torch.stack([w & 0xF, w >> 4], 2).flatten(1, 2).long()            # [E, K, N]
    scale = torch.pow(2.0, s.double() - 127).repeat_interleave(32, 1)            # [E, K, N]
    return table[nibbles] * scale


def matmul_ogs_math(lay: dict, x, ids, weights, limit: float, swap_pairs: bool = False) -> torch.Tensor:
    """Two matmul_ogs calls as the library defines them, float64, on the logical layout."""
    w1, w2 = decode_k_major(lay["w1"], lay["s1"]), decode_k_major(lay["w2"], lay["s2"])   # [E, H, 2I], [E, I, H]
    out = torch.zeros(x.shape[0], lay["H"], dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t].double().tolist()):
            h = x[t].double() @ w1[e] + lay["b1"][e].double()
            gate, linear = (h[1::2], h[0::2]) if swap_pairs else (h[0::2], h[1::2])
            gate, linear = gate.clamp(max=limit), linear.clamp(-limit, limit)
            act = gate * torch.sigmoid(SWIGLU_ALPHA * gate) * (linear + 1)
            out[t] += w * (act @ w2[e] + lay["b2"][e].double())
    return out


def test_layout_under_matmul_ogs_math_is_our_experts():
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    mx = target.layers[0].mlp.experts
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # weights large enough that the gates reach the clamp at 7 and the output is theirs
        mx.gate_up_proj_scales.copy_(torch.randint(124, 128, mx.gate_up_proj_scales.shape, generator=g))
        mx.down_proj_scales.copy_(torch.randint(118, 122, mx.down_proj_scales.shape, generator=g))
        mx.gate_up_proj_bias.normal_(0.0, 1.0, generator=g)
        mx.down_proj_bias.normal_(0.0, 0.05, generator=g)
    lay = triton_kernels_moe.layout(mx)
    H = I = 64
    assert lay["w1"].shape == (4, H // 2, 2 * I) and lay["s1"].shape == (4, H // 32, 2 * I)
    assert lay["w2"].shape == (4, I // 2, H) and lay["s2"].shape == (4, I // 32, H)
    assert lay["b1"].dtype == lay["b2"].dtype == torch.float32
    x = torch.randn(5, H, generator=g)
    ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(5)])
    weights = torch.softmax(torch.randn(5, 2, generator=g), -1)
    ours = mx.dequantized(torch.float32)(x, ids, weights).double()
    theirs = matmul_ogs_math(lay, x, ids, weights, mx.limit)
    assert ((theirs - ours).norm() / ours.norm()).item() < 1e-5
    h = x.double() @ decode_k_major(lay["w1"], lay["s1"])[0] + lay["b1"][0].double()
    assert (h[:, 0::2] > mx.limit).any() and (h[:, 1::2].abs() > mx.limit).any()   # both clamps were exercised
    # the pairs read the other way round are not our experts: the test can fail
    wrong = matmul_ogs_math(lay, x, ids, weights, mx.limit, swap_pairs=True)
    assert ((wrong - ours).norm() / ours.norm()).item() > 0.5


def test_routing_mask_has_one_bit_per_token_expert():
    ids = torch.tensor([[0, 31, 32, 127], [5, 63, 64, 100], [31, 30, 1, 96]])
    words = triton_kernels_moe.bitmatrix_words(ids, 128)
    assert words.dtype == torch.int32 and words.shape == (3, 4)
    bits = words.view(torch.uint8).reshape(3, 4, 4)    # little-endian bytes of each word
    got = [[w * 32 + b for w in range(4) for b in range(32) if (int(bits[r, w, b // 8]) >> (b % 8)) & 1]
           for r in range(3)]
    assert got == [sorted(row) for row in ids.tolist()]
    assert triton_kernels_moe.bitmatrix_words(torch.tensor([[3, 9]]), 32).shape == (1, 1)


def test_no_hopper_stops_the_run_and_a_refused_layer_is_an_error_row(monkeypatch):
    fake = type(sys)("triton_kernels")
    monkeypatch.setattr(triton_kernels_moe, "load", lambda: {"fake": fake})
    monkeypatch.setattr(gpt_oss_step, "build", lambda *a, **k: pytest.fail("built the model before the check"))
    with pytest.raises(SystemExit, match="^--compare triton_kernels compares against the MXFP4 kernels"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--compare", "triton_kernels"])
    with pytest.raises(ValueError, match=r"^--compare triton_kernels: its MXFP4 x bf16 MoE layouts need Hopper"):
        triton_kernels_moe.check_device(torch.device("cpu"))
    monkeypatch.undo()
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    rows = gpt_oss_step.moe_layer_vs_library(target, "triton_kernels", {}, [Routing()], [(1, 1)], 2, None)
    assert rows == [{"error": "setup: ValueError: --compare triton_kernels: its MXFP4 x bf16 MoE layouts need Hopper "
                              "or later (sm90+), not cpu (compute capability None); leave --compare off here"}]
