# SPDX-License-Identifier: Apache-2.0
"""The KD loss's Triton passes (training/kd_kernels.py) in Triton's interpreter on the CPU: logsumexp, argmax and
softmax of logit rows against torch in float64, with ragged vocabularies and ties placed inside and across the
kernel's vocabulary blocks; and the fused loss run through them equal to the torch ops (float32, a tiny target).
tests/gpu/test_kd_kernels_cuda.py runs them on the GPU at SmolLM2's vocabulary in bf16."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # before the kernels are imported: triton.jit picks the interpreter when it decorates them
    os.environ["TRITON_INTERPRET"] = "1"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kernels():
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    from trtllm_dflash.training import kd_kernels
    return kd_kernels


@pytest.mark.parametrize("V", [7, 2048, 4100])
def test_row_stats_and_softmax_match_float64(V):
    K = kernels()
    g = torch.Generator().manual_seed(V)
    z = (torch.randn(5, V, generator=g) * 4).to(torch.float16).float()   # float16-exact values, as bf16 logits are
    if V > 2048:
        z[1, 3] = z[1, 2050] = z[1].max() + 1         # a tie across two blocks: the first index wins
        z[2, 2049] = z[2, 4099] = z[2].max() + 1      # a tie inside the last, ragged block
    z[3, -1] = z[3].max() + 1                         # the maximum in the last column
    lse, top = K.row_stats(z)
    want = torch.logsumexp(z.double(), dim=-1)
    assert torch.allclose(lse.double(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(top, z.argmax(dim=-1))
    q = K.softmax(z, lse)
    assert q.dtype == torch.float32 and torch.allclose(q.double(), torch.softmax(z.double(), dim=-1), atol=1e-6)


def test_a_strided_chunk_and_empty_rows():
    K = kernels()
    big = torch.randn(6, 40)
    z = big[1:5, :33]                                 # row stride 40, 33 columns
    lse, top = K.row_stats(z)
    assert torch.allclose(lse, torch.logsumexp(z, dim=-1), atol=1e-5) and torch.equal(top, z.argmax(dim=-1))
    assert torch.allclose(K.softmax(z, lse), torch.softmax(z, dim=-1), atol=1e-6)
    e_lse, e_top = K.row_stats(big[:0])
    assert e_lse.shape == e_top.shape == (0,) and K.softmax(big[:0], e_lse).shape == (0, 40)


def test_fused_loss_through_the_kernels_equals_the_torch_ops(monkeypatch):
    from trtllm_dflash.training import kd_loss
    K = kernels()
    g = torch.Generator().manual_seed(0)
    N, H, V, T = 37, 16, 300, 11
    weight = torch.randn(V, H, generator=g) * 0.3
    teacher = torch.randn(T, V, generator=g) * 2
    index = torch.randint(0, T, (N,), generator=g)
    row_w = torch.rand(N, generator=g)
    row_w[::5] = 0
    h0 = torch.randn(N, H, generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:15] = (h0 @ weight.T)[:15].argmax(dim=-1)   # some rows' argmax hits its label
    counted = row_w > 0

    def run():
        h = h0.clone().requires_grad_()
        loss, correct = kd_loss.fused_kd(h, weight, teacher, index, row_w, row_w.sum() + 1e-6, targets, counted,
                                         chunk_rows=8)
        loss.backward()
        return loss.detach(), int(correct), h.grad
    want = run()
    monkeypatch.setattr(kd_loss, "_kernels", lambda *a: K)
    got = run()
    assert torch.allclose(got[0], want[0], rtol=1e-6) and got[1] == want[1] > 0
    assert torch.allclose(got[2], want[2], rtol=1e-5, atol=1e-7)
