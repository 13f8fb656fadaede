# SPDX-License-Identifier: Apache-2.0
"""FlashInfer's fused MoE on the same MXFP4 experts as runtime/mxfp4_moe.py: the library side of
``gpt_oss_step --compare flashinfer``.

flashinfer-python's CUTLASS fused MoE has a Hopper (sm90) path for MXFP4 weights with bf16 activations
(``cutlass_fused_moe(..., use_w4_group_scaling=True)`` on weights re-laid out by
``interleave_moe_{weights,scales}_for_sm90_mixed_gemm``) and a SwiGLU with gpt-oss's alpha, clamp limit and +1 on
the linear half. Its MXFP4 encoding is the published one (E2M1, low nibble first; E8M0 scales), so it gets the
same bytes, only laid out its way: the interleaved gate/up rows split into [up; gate] (its fc1 order) and both
dimensions zero-padded to its multiple of 128 (gpt-oss's 2880 -> 2944, 2.2 % more bytes per expert: the padded
size is reported, and the comparison is against the bytes our kernels read).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_dflash.runtime.models.gpt_oss import SWIGLU_ALPHA

ALIGN = 128          # FlashInfer's SM90 W4A16 MoE: hidden and intermediate sizes must be multiples of it
SWIGLU_BETA = 1.0    # gpt-oss: (up + 1) * glu(gate)
INSTALL = "pip install flashinfer-python on the GPU host (its kernels compile on first use: needs the CUDA toolkit)"


def load():
    """flashinfer.fused_moe, or a one-line SystemExit saying how to get it."""
    try:
        import flashinfer.fused_moe as fm
    except ImportError as err:
        raise SystemExit(f"--compare flashinfer needs flashinfer-python, not importable here ({err}); {INSTALL}") from None
    return fm


def check_device(dev: torch.device) -> None:
    """FlashInfer's MXFP4 x bf16 fused MoE is built for Hopper (sm90) only."""
    cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    if cap != (9, 0):
        raise ValueError(f"--compare flashinfer: its MXFP4 x bf16 MoE runs on Hopper (sm90) only, not on {dev} "
                         f"(compute capability {cap}); leave --compare off here")


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """[E, R, C] -> [E, rows, cols], zeros after (E2M1 byte 0 is +0 +0: padded weights contribute nothing)."""
    return F.pad(t, (0, cols - t.shape[2], 0, rows - t.shape[1]))


def _up_gate(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Interleaved rows (gate0, up0, gate1, ...) [E, 2I, C] -> [up; gate], each half padded to ``rows``."""
    return torch.cat([_pad(t[:, 1::2], rows, cols), _pad(t[:, 0::2], rows, cols)], 1)


def layout(experts) -> dict:
    """The experts' MXFP4 bytes in FlashInfer's logical fc1/fc2 layout, before its SM90 interleave (any device):
    w1 [E, 2 Ip, Hp / 2] and s1 [E, 2 Ip, Hp / 32] with rows [up; gate], w2 [E, Hp, Ip / 2], s2 [E, Hp, Ip / 32],
    biases b1 [E, 2 Ip] (same row order) and b2 [E, Hp]; H and I padded to Hp, Ip (multiples of ALIGN)."""
    E, I = experts.num_local, experts.inter
    H = experts.down_proj_blocks.shape[1]
    Hp, Ip = _round_up(H), _round_up(I)
    bias = experts.gate_up_proj_bias.detach()
    return {"H": H, "Hp": Hp, "Ip": Ip,
            "w1": _up_gate(experts.gate_up_proj_blocks.reshape(E, 2 * I, H // 2), Ip, Hp // 2),
            "s1": _up_gate(experts.gate_up_proj_scales, Ip, Hp // 32),
            "w2": _pad(experts.down_proj_blocks.reshape(E, H, I // 2), Hp, Ip // 2),
            "s2": _pad(experts.down_proj_scales, Hp, Ip // 32),
            "b1": _up_gate(bias[:, :, None], Ip, 1)[:, :, 0].contiguous(),
            "b2": F.pad(experts.down_proj_bias.detach(), (0, Hp - H)).contiguous()}


class FlashInferExperts:
    """Callable like Mxfp4Experts (x [N, H], ids, weights [N, k] -> [N, H]) on FlashInfer's kernel, from the
    experts' own MXFP4 bytes (no requantisation). All experts on this GPU (no expert parallelism)."""

    def __init__(self, experts, fm=None):
        self.fm = fm or load()
        dev = experts.gate_up_proj_blocks.device
        check_device(dev)
        if experts.num_local != experts.num_experts:
            raise ValueError("--compare flashinfer compares whole experts on one GPU; this rank holds "
                             f"{experts.num_local} of {experts.num_experts}")
        lay, E = layout(experts), experts.num_local
        self.H, self.Hp = lay["H"], lay["Hp"]
        self.w1, self.w2 = (self.fm.interleave_moe_weights_for_sm90_mixed_gemm(lay[k].contiguous(), "fp4")
                            for k in ("w1", "w2"))
        self.scales = [self.fm.interleave_moe_scales_for_sm90_mixed_gemm(lay[k].contiguous()).view(torch.int32)
                       for k in ("s1", "s2")]
        self.b1, self.b2 = lay["b1"], lay["b2"]

        def per_expert(v):
            return torch.full((E,), v, dtype=torch.float32, device=dev)
        self.alpha, self.beta, self.limit = per_expert(SWIGLU_ALPHA), per_expert(SWIGLU_BETA), per_expert(experts.limit)
        self.bytes_per_expert = sum(t.numel() * t.element_size() for t in (self.w1, self.w2, *self.scales,
                                                                           self.b1, self.b2)) // E

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        xp = F.pad(x, (0, self.Hp - self.H)) if self.Hp != self.H else x
        out = self.fm.cutlass_fused_moe(
            xp.contiguous(), ids.to(torch.int32), weights.float(), self.w1, self.w2, x.dtype, self.scales,
            fc1_expert_biases=self.b1, fc2_expert_biases=self.b2, swiglu_alpha=self.alpha, swiglu_beta=self.beta,
            swiglu_limit=self.limit, use_w4_group_scaling=True)
        out = out[0] if isinstance(out, (list, tuple)) else out
        return out[:, :self.H]
