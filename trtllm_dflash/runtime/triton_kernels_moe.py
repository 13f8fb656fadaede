# SPDX-License-Identifier: Apache-2.0
"""gpt-oss's MXFP4 experts on ``triton_kernels`` (triton-lang/triton's python/triton_kernels: the Triton MoE kernels
vLLM runs gpt-oss on, as vLLM 0.26.0 vendors them), from the same bytes as runtime/mxfp4_moe.py.

One MoE layer is two ``matmul_ogs`` calls over routing data built from our own ids and weights
(``routing_from_bitmatrix``): fc1 gathers each token's rows, adds the bias and applies gpt-oss's SwiGLU to
adjacent column pairs (gate, linear) in its epilogue; fc2 adds the bias, scales by the router weight and
scatter-adds into the tokens' rows. ``matmul_ogs`` wants W as [E, K, N] with the MXFP4 axis on K: our
[E, N, K/2] blocks transposed (the interleaved gate/up rows already are its adjacent column pairs). On the GPU the
library re-lays them out in its default Hopper layouts (``make_default_matmul_mxfp4_w_layout`` /
``..._w_scale_layout``): a second copy of the experts' bytes, which is what makes it fast (on views of our
tensors in its plain strided layout it measured 2-3x slower on an H200: ``strided=True``).

Used by models/gpt_oss.TritonKernelsExperts (RuntimeConfig.mxfp4_moe = "triton_kernels") and by
``gpt_oss_step --compare triton_kernels``.
"""
from __future__ import annotations

import dataclasses

import torch

from ..errors import DFlashError
from .models.gpt_oss import SWIGLU_ALPHA

INSTALL = ("install a triton_kernels wheel on the GPU host (scripts/triton_kernels_wheel.sh builds one from the copy "
           "vLLM vendors as vllm/third_party/triton_kernels)")
SCALE_K_MULTIPLE = 4    # on Hopper vLLM pads each column's scale groups to a multiple of 4 before the layout
# vLLM rounds the intermediate size up to a multiple of 64 for these kernels: a TP-2 rank of gpt-oss (1440) read
# unpadded measured 10% off float64 on an H200; zero columns / rows make the padding contribute nothing
INTER_MULTIPLE = 64


def load(field: str = "mxfp4_moe") -> dict:
    """The triton_kernels modules this path calls; a DFlashError naming ``field`` when they do not import."""
    try:
        import triton_kernels.swiglu as swiglu
        from triton_kernels import matmul_ogs, routing, tensor
        from triton_kernels.matmul_ogs_details import opt_flags
        from triton_kernels.numerics import InFlexData
        from triton_kernels.tensor_details import layout
    except ImportError as err:
        raise DFlashError(field, f"'triton_kernels' needs the triton_kernels package, not importable here ({err})",
                          INSTALL) from None
    return dict(matmul_ogs=matmul_ogs, routing=routing, tensor=tensor, layout=layout, opt_flags=opt_flags,
                swiglu=swiglu, InFlexData=InFlexData)


def check_device(dev: torch.device, field: str = "mxfp4_moe") -> None:
    """Its MXFP4 weight layouts are built for Hopper and later (sm90+)."""
    cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    if cap is None or cap < (9, 0):
        raise DFlashError(field, f"'triton_kernels' needs a Hopper or later GPU (sm90+), not {dev} (compute "
                          f"capability {cap})", "run it on an H100/H200/B200, or use mxfp4_moe='triton'")


def layout(experts) -> dict:
    """The experts' MXFP4 bytes in matmul_ogs's logical orientation (any device): w1 [E, H/2, 2Ip] and s1
    [E, H/32, 2Ip] (K first; columns the interleaved gate/up pairs as they are), w2 [E, Ip/2, H], s2 [E, Ip/32, H],
    float32 biases b1 [E, 2Ip] and b2 [E, H] (b2 None on the ranks that do not add it: moe_rank != 0). Ip: the
    intermediate size I rounded up to INTER_MULTIPLE with zero pairs (views of our tensors where I already is).
    The packed K stays the stride-1 dimension: the library finds the packed axis by its stride."""
    E, I = experts.num_local, experts.inter
    H = experts.down_proj_blocks.shape[1]
    pad = -I % INTER_MULTIPLE
    b2 = experts.down_proj_bias.detach().float().contiguous() if experts.moe_rank == 0 else None

    def zeros_after(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:   # [E, ...]: n zero slices after ``dim``
        return torch.cat([t, t.new_zeros(*t.shape[:dim], n, *t.shape[dim + 1:])], dim) if n else t

    # padded in our orientation ([E, outputs, K]), then transposed: K keeps stride 1
    return {"H": H, "Ip": I + pad,
            "w1": zeros_after(experts.gate_up_proj_blocks.reshape(E, 2 * I, H // 2), 1, 2 * pad).transpose(1, 2),
            "s1": zeros_after(experts.gate_up_proj_scales, 1, 2 * pad).transpose(1, 2),
            "w2": zeros_after(experts.down_proj_blocks.reshape(E, H, I // 2), 2, pad // 2).transpose(1, 2),
            "s2": zeros_after(experts.down_proj_scales, 2, pad // 32).transpose(1, 2),
            "b1": zeros_after(experts.gate_up_proj_bias.detach().float(), 1, 2 * pad).contiguous(), "b2": b2}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclasses.dataclass(frozen=True)
class Flags:
    """How the two matmuls are tiled: matmul_ogs opt-flag constraints for fc1 (gate_up, SwiGLU fused) and fc2 (down,
    scatter), in the library's names (on Hopper: block_m, block_k, split_k, num_stages, is_persistent, ...), and the
    warps its Hopper scale layout is swizzled for (the kernels then run that many, and a 4-warp layout makes the
    library pick 128 output columns per tile instead of 256). Default: vLLM's Hopper settings (split_k 1) but 4 warps
    where vLLM takes 8: one gpt-oss-120b MoE layer on an H200 (gpt_oss_step --compare, eight flag sets) ran a
    block of 10 tokens in 0.201 ms against 0.233 (uniform routing) and 0.112 against 0.134 (skewed), 4 tokens in 0.101
    against 0.120; no other flag set was faster by more than the timing noise."""
    fc1: dict = dataclasses.field(default_factory=lambda: {"split_k": 1})
    fc2: dict = dataclasses.field(default_factory=lambda: {"split_k": 1})
    scale_warps: int = 4

    @classmethod
    def parse(cls, spec: str) -> Flags:
        """'fc2.block_k=256+fc2.num_stages=4+scale_warps=8' -> Flags (the defaults above for what it leaves out)."""
        base = cls()
        out = {"fc1": base.fc1, "fc2": base.fc2, "scale_warps": base.scale_warps}
        for item in filter(None, spec.split("+")):
            key, eq, value = item.partition("=")
            if not eq or not value.lstrip("-").isdigit():
                raise DFlashError("triton_kernels flags", f"{item!r} is not KEY=INTEGER",
                                  "write e.g. fc2.block_k=256+scale_warps=4")
            which, dot, name = key.partition(".")
            if key == "scale_warps":
                out["scale_warps"] = int(value)
            elif dot and which in ("fc1", "fc2") and name:
                out[which] = {**out[which], name: int(value)}
            else:
                raise DFlashError("triton_kernels flags", f"{key!r} names neither fc1.FLAG, fc2.FLAG nor scale_warps",
                                  "write e.g. fc1.num_stages=4")
        return cls(out["fc1"], out["fc2"], out["scale_warps"])


class MatmulOgsExperts:
    """Callable like Mxfp4Experts (x [N, H], ids, weights [N, k] -> [N, H]) on triton_kernels' matmul_ogs, from the
    experts' own MXFP4 bytes (no requantisation). Whole experts on this rank (no expert parallelism); with the
    intermediate dimension split (moe_tp > 1) it returns this rank's partial sum, as Mxfp4Experts does."""

    def __init__(self, experts, tk: dict | None = None, strided: bool = False, field: str = "mxfp4_moe",
                 flags: Flags | None = None):
        """``strided``: the weights as views of our own tensors in the library's plain strided layout (no copy, no
        scale padding) in place of its default Hopper layouts (a re-laid-out copy). ``flags``: opt-flag
        constraints for each of the two matmuls and the scales' warp layout (Flags; its defaults)."""
        self.tk = tk = tk if tk is not None else load(field)
        self.flags = flags or Flags()
        check_device(experts.gate_up_proj_blocks.device, field)
        if experts.num_local != experts.num_experts:
            raise DFlashError(field, f"'triton_kernels' runs whole experts on each rank; this rank holds "
                              f"{experts.num_local} of {experts.num_experts} (ep_size > 1)",
                              "use ep_size 1 (the intermediate dimension may be split), or mxfp4_moe='triton'")
        self.strided, self.E = strided, experts.num_local
        lay = layout(experts)
        self.w1, self.pc1, s1 = self._weights(lay["w1"], lay["s1"])
        self.w2, self.pc2, s2 = self._weights(lay["w2"], lay["s2"])
        self.b1, self.b2 = lay["b1"], lay["b2"]
        mo = tk["matmul_ogs"]
        self.act = mo.FusedActivation(mo.FnSpecs("swiglu", tk["swiglu"].swiglu_fn, ("alpha", "limit")),
                                      (SWIGLU_ALPHA, float(experts.limit)), 2)
        biases = [b for b in (self.b1, self.b2) if b is not None]
        self.bytes_per_expert = sum(_nbytes(t) for t in (lay["w1"], lay["w2"], s1, s2, *biases)) // self.E

    def _weights(self, w: torch.Tensor, s: torch.Tensor):
        """One weight's values and scales in the library's layouts, its precision config, the scales it reads."""
        t, lay, mo = self.tk["tensor"], self.tk["layout"], self.tk["matmul_ogs"]
        if self.strided:
            wq, sq = t.wrap_torch_tensor(w, dtype=t.FP4), t.wrap_torch_tensor(s)
        else:
            pad = -s.shape[1] % SCALE_K_MULTIPLE
            s = torch.nn.functional.pad(s.transpose(1, 2), (0, pad)).transpose(1, 2)   # pad the K groups
            value_layout, value_opts = lay.make_default_matmul_mxfp4_w_layout(mx_axis=1)
            scale_layout, scale_opts = lay.make_default_matmul_mxfp4_w_scale_layout(
                mx_axis=1, num_warps=self.flags.scale_warps)
            wq = t.convert_layout(t.wrap_torch_tensor(w, dtype=t.FP4), value_layout, **value_opts)
            sq = t.convert_layout(t.wrap_torch_tensor(s), scale_layout, **scale_opts)
        return wq, mo.PrecisionConfig(weight_scale=sq, flex_ctx=mo.FlexCtx(rhs_data=self.tk["InFlexData"]())), s

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        from .kernels import moe_routing
        tk, (n, k) = self.tk, ids.shape
        cols = -(-self.E // 32) * 32
        words, ids16, w, sums = moe_routing.pack_routing(ids, weights, self.E, x.dtype, sums=cols)
        mask = tk["tensor"].Bitmatrix(words.view(torch.uint32), shape=[n, cols], shape_max=[n, None], scratchpad=sums)
        routing, gather, scatter = tk["routing"].routing_from_bitmatrix(mask, w, ids16, self.E, k)
        mm = tk["matmul_ogs"].matmul_ogs
        self._constrain(self.flags.fc1)
        h = mm(x, self.w1, self.b1, routing, gather_indx=gather, precision_config=self.pc1,
               fused_activation=self.act)                                          # [N k, I]
        self._constrain(self.flags.fc2)
        return mm(h, self.w2, self.b2, routing, scatter_indx=scatter, precision_config=self.pc2,
                  gammas=routing.gate_scal)                                        # [N, H]

    def _constrain(self, flags: dict) -> None:
        """The library reads its opt-flag constraints from one module-level dict when a matmul is launched (or
        captured): set this matmul's before it."""
        of = self.tk["opt_flags"]
        of.reset_opt_flags_constraints()
        of.update_opt_flags_constraints(flags)
