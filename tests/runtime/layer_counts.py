# SPDX-License-Identifier: Apache-2.0
"""What one decode step launches, per decoder layer: the Triton kernels (by kernel name), the compiled chains of
models/layers.py and the torch-path entry points (each one kernel on CUDA), and the collectives through the
engine's TPGroup. tp_kernel_counts_run.py records them at TP 1 and on every TP rank; test_tp compares them."""
from __future__ import annotations

import collections
import contextlib
import functools

import torch.nn.functional as F

OUTSIDE = "step"   # launches outside any decoder layer: embedding, lm_head, sampling, the drafter's fc
# Compiled chains of models/layers.py, one kernel each on CUDA. A norm with or without the residual add before it is
# the same kernel: at tp 1 the residual is added in the GEMM's epilogue and the norm runs alone, under TP it joins
# after the all-reduce, in the add + norm (layers.DecoderLayer).
CHAINS = {"rms_norm": "chain:norm", "add_rms_norm": "chain:norm", "norm_rope": "chain:rope", "qk_norm_rope": "chain:rope",
          "masked_softmax": "chain:softmax", "silu_mul": "chain:silu_mul"}
COLLECTIVES = ("all_reduce", "all_gather_last", "broadcast")


class LayerCounts:
    """counts[where][what]: calls made while ``where`` (target.i, drafter.i or OUTSIDE) ran. ``what`` is a Triton
    kernel's name, "chain:..." (CHAINS), "torch:attention" / "torch:linear" / "torch:sample" (the torch path's
    attention, cuBLAS projections and sampling) or "collective:<TPGroup method>" (only where the group is active)."""

    def __init__(self, engine):
        self.engine = engine
        self.where = OUTSIDE
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.on = False

    def add(self, what: str) -> None:
        if self.on:
            self.counts[self.where][what] += 1

    @contextlib.contextmanager
    def installed(self):
        """Wrap every entry point for the life of the block (the engine's modules, its TPGroup, Triton's launch)."""
        from triton.runtime.jit import KernelInterface

        from trtllm_dflash.runtime import runner
        from trtllm_dflash.runtime.models import gpt_oss, layers, llama

        saved: list[tuple[object, str, object]] = []

        def wrap(owner, name, what):
            f = getattr(owner, name)
            saved.append((owner, name, f))

            @functools.wraps(f)   # keeps a chain's .eager, which other chains call
            def counted(*args, **kw):
                self.add(what)
                return f(*args, **kw)
            setattr(owner, name, counted)

        launch = KernelInterface.__getitem__

        def getitem(kernel, grid):   # fn[grid](...) is a launch, in the interpreter and on the GPU alike
            run = launch(kernel, grid)

            def counted(*args, **kw):
                self.add(kernel.__name__)
                return run(*args, **kw)
            return counted
        saved.append((KernelInterface, "__getitem__", launch))
        KernelInterface.__getitem__ = getitem
        for name, what in CHAINS.items():
            wrap(layers, name, what)
        wrap(llama, "attend", "torch:attention")          # the Llama family's and the drafter's (llama.Attention)
        wrap(gpt_oss, "attend_with_sinks", "torch:attention")
        for name in ("_norm", "_add_norm"):                 # gpt-oss's norms in the reference's rounding
            wrap(gpt_oss, name, "chain:norm")
        wrap(gpt_oss, "_grouped_mm", "torch:grouped_mm")    # dequantised experts (MXFP4 ones launch Triton kernels)
        wrap(F, "linear", "torch:linear")    # nn.Linear.forward and project()'s F.linear
        wrap(runner, "sample", "torch:sample")
        tp = self.engine.tp
        if tp.active:
            for name in COLLECTIVES:
                wrap(tp, name, f"collective:{name}")
        hooks = []
        for role, model in (("target", self.engine.target), ("drafter", self.engine.drafter)):
            for i, layer in enumerate(model.layers if model is not None else ()):
                hooks.append(layer.register_forward_pre_hook(lambda *_, w=f"{role}.{i}": self._enter(w)))
                hooks.append(layer.register_forward_hook(lambda *_: self._enter(OUTSIDE)))
        try:
            yield self
        finally:
            for h in hooks:
                h.remove()
            for owner, name, f in reversed(saved):
                if owner is tp:
                    delattr(tp, name)   # the class's methods again
                else:
                    setattr(owner, name, f)

    def _enter(self, where: str) -> None:
        self.where = where

    @contextlib.contextmanager
    def counting(self):
        self.counts.clear()
        self.on = True
        try:
            yield
        finally:
            self.on, self.where = False, OUTSIDE

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {w: dict(sorted(c.items())) for w, c in sorted(self.counts.items())}


def kernels_only(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if not k.startswith("collective:")}


def collectives_only(counts: dict[str, int]) -> dict[str, int]:
    return {k.removeprefix("collective:"): v for k, v in counts.items() if k.startswith("collective:")}


def step_on_torch_path(counts: dict[str, dict[str, int]]) -> list[str]:
    """The places of a step that ran a torch-path entry point (none on the decode kernels)."""
    return sorted(w for w, c in counts.items() if any(k.startswith("torch:") for k in c))

