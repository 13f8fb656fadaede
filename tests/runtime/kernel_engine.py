# SPDX-License-Identifier: Apache-2.0
"""An engine whose models run RuntimeConfig.kernels, and what the kernel tests do with it: count the
kernel entry points a run reaches, and compare a torch engine's generations with a triton one's (the CPU and GPU
kernel tests share these)."""
from __future__ import annotations

from trtllm_dflash.config import RuntimeConfig, SamplingParams
from trtllm_dflash.runtime.engine import Engine


def engine_with_kernel(target_dir, drafter_dir, cfg: RuntimeConfig) -> Engine:
    """Engine.from_dirs: the loader builds both models with the kernels cfg.kernels chooses."""
    return Engine.from_dirs(target_dir, drafter_dir, cfg)


def count_calls(monkeypatch, owner, names, calls: dict, key=lambda name, args, kw: name) -> dict:
    """Wrap owner.<name> for each name so that calls[key(name, args, kw)] counts its calls; returns ``calls``."""
    for name in names:
        def counted(*args, _f=getattr(owner, name), _name=name, **kw):
            k = key(_name, args, kw)
            calls[k] = calls.get(k, 0) + 1
            return _f(*args, **kw)
        monkeypatch.setattr(owner, name, counted)
    return calls


def same_generation(target_dir, drafter_dir, cfg: dict, prompts, params: SamplingParams | list[SamplingParams]) -> None:
    """Generations of an engine on the torch path == those of one on the Triton kernels: tokens and every step's
    acceptance length (``cfg``: RuntimeConfig fields besides kernels)."""
    ref = engine_with_kernel(target_dir, drafter_dir, RuntimeConfig(**cfg, kernels="torch"))
    fused = engine_with_kernel(target_dir, drafter_dir, RuntimeConfig(**cfg, kernels="triton"))
    for x, y in zip(ref.generate(prompts, params), fused.generate(prompts, params)):
        assert x.output_ids == y.output_ids
        assert x.stats.acceptance_lengths == y.stats.acceptance_lengths


TWO_PROMPTS = [[5, 9, 14, 3, 22], [7, 41]]
GREEDY_AND_SAMPLED = [SamplingParams(max_new_tokens=6, ignore_eos=True),
                      SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=0.8, seed=3)]
