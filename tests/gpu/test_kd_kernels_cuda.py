# SPDX-License-Identifier: Apache-2.0
"""The KD loss's Triton passes (training/kd_kernels.py) on the GPU at SmolLM2's vocabulary (49,152) in bf16, a
training chunk of 4,096 rows: logsumexp and softmax against float64, argmax exactly against torch's (same bf16
values, first index on ties); and the fused loss on CUDA (kernels + TF32 products) against the float64 loss."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def test_row_stats_and_softmax_at_smollm2_vocab():
    from trtllm_dflash.training import kd_kernels as K
    g = torch.Generator(device=DEV).manual_seed(0)
    z = (torch.randn(4096, 49152, generator=g, device=DEV) * 3).to(torch.bfloat16)
    z[7, 100] = z[7, 40000] = 30.0                     # a tie across blocks
    lse, top = K.row_stats(z)
    want = torch.logsumexp(z.double(), dim=-1)
    assert (lse.double() - want).abs().max() < 1e-4
    assert torch.equal(top, z.argmax(dim=-1)) and top[7] == 100
    q = K.softmax(z, lse)
    assert (q.double() - torch.softmax(z.double(), dim=-1)).abs().max() < 1e-6


def test_fused_loss_on_cuda_matches_float64():
    from trtllm_dflash.training import kd_loss
    g = torch.Generator(device=DEV).manual_seed(1)
    N, H, V, T = 3000, 576, 49152, 600
    weight = (torch.randn(V, H, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
    teacher = (torch.randn(T, V, generator=g, device=DEV) * 3).to(torch.bfloat16)
    index = torch.randint(0, T, (N,), generator=g, device=DEV)
    row_w = torch.rand(N, generator=g, device=DEV)
    targets = torch.randint(0, V, (N,), generator=g, device=DEV)
    h0 = torch.randn(N, H, generator=g, device=DEV)
    norm = row_w.sum() + 1e-6

    h = h0.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = kd_loss.fused_kd(h, weight, teacher, index, row_w, norm, targets, row_w > 0, chunk_rows=1024)
    loss.backward()

    h64 = h0.to(torch.bfloat16).double().requires_grad_()          # the bf16 rows lm_head sees under autocast
    z = h64 @ weight.double().T
    p = torch.softmax(teacher.double()[index], dim=-1)
    ref = ((-(p * torch.log_softmax(z, dim=-1)).sum(-1)) * row_w.double()).sum() / norm.double()
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-3 * abs(ref.item())
    cos = torch.nn.functional.cosine_similarity(h.grad.double().flatten(), h64.grad.flatten(), dim=0)
    assert cos > 0.999, float(cos)
