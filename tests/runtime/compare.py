# SPDX-License-Identifier: Apache-2.0
"""How far a result is from its reference, and the float64 references, for the runtime's numeric tests
(the decode kernels' CPU tests and their GPU twins in tests/gpu/ compare against the same references)."""
from __future__ import annotations

import pytest
import torch


def default_subset(values: list, keep: tuple[int, ...]) -> list:
    """Parametrize ``values`` with only the cases at ``keep`` in the default run; the others are marked
    ``exhaustive`` (pytest --exhaustive runs them). For interpreter-mode kernel tests, where one case costs
    seconds on a CPU: the default keeps one of each kind (decode and multi-tile shapes, each path)."""
    return [v if i in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.exhaustive)
            for i, v in enumerate(values)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ||a - b|| / ||b|| in float64 on the host (either tensor may be on a GPU)."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def rope_f64(x, cos, sin, w, eps):
    """RoPE (after the q/k RMS norm with weight ``w``, when given) in float64."""
    x = x.double()
    if w is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    half = x.shape[-1] // 2
    return x * cos.double() + torch.cat([-x[..., half:], x[..., :half]], -1) * sin.double()


def attend_f64(q, k, v, visible, scale, sinks=None):
    """Attention in float64: q [n, T, Hq, d], k/v [n, Hkv, S, d], visible [n, 1, T, S] -> [n, T, Hq * d], plain GQA
    expansion. ``sinks`` [Hq] (gpt-oss, as transformers' eager_attention_forward): one more logit per head in the
    softmax, its column dropped after."""
    n, T, Hq, _ = q.shape
    G = Hq // k.shape[1]
    k, v = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = (q.double().transpose(1, 2) @ k.transpose(-1, -2)) * scale                  # [n, Hq, T, S]
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is None:
        p = s.softmax(-1)
    else:
        sink = sinks.double().view(1, Hq, 1, 1).expand(n, Hq, T, 1)
        p = torch.cat([s, sink], -1).softmax(-1)[..., :-1]
    return (p @ v).transpose(1, 2).flatten(2)


def compile_for_h100(code: str | list[str], timeout: int = 300) -> str:
    """Run ``code`` (which calls triton.compile(..., target=GPUTarget("cuda", 90, 32))), or a script and its
    arguments (a list), in a fresh process without TRITON_INTERPRET: the interpreter accepts code the compiler
    refuses (a plain global in a kernel, a value defined in one branch), and Triton's front end, passes and bundled
    ptxas all run on the CPU, no GPU needed. The process must exit 0; its output's tails are the failure message.
    Returns its stdout."""
    import os
    import subprocess
    import sys
    import pytest
    pytest.importorskip("triton", reason="OpenAI Triton is not installed (pip install triton)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    args = ["-c", code] if isinstance(code, str) else code
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def random_cache(slots: int, Hkv: int, S: int, d: int, dtype, kv_len: int, g: torch.Generator):
    """A one-layer CPU KVCache of ``slots`` rows with random K/V; keys past ``kv_len`` are set to 1e4, so an
    attention that counts them is far off."""
    from trtllm_dflash.runtime.kv_cache import KVCache
    cache = KVCache(1, slots, Hkv, S, d, dtype, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    cache.k[..., kv_len:, :] = 1e4
    return cache


ERROR_MARKS = ("Traceback", "Error", "error:", "Killed", "BAD TERMINATION", "signal", "Abort", "terminate called")


def job_failure(proc, tail: int = 2000) -> str:
    """What a failed mpiexec job said: its exit code, every line of any rank that looks like an error (a rank's
    traceback can sit far above the launcher's cleanup messages that end the output), then the output's end."""
    text = (proc.stdout or "") + (proc.stderr or "")
    marked = [ln for ln in text.splitlines() if any(m in ln for m in ERROR_MARKS)]
    return (f"exit code {proc.returncode}\n-- lines that look like errors ({len(marked)}):\n" + "\n".join(marked[:60])
            + f"\n-- the last {tail} characters:\n" + text[-tail:])


def clamping_tiny_experts():
    """Layer 0's MXFP4 experts of the tiny gpt-oss-20b (4 experts, hidden = intermediate = 64), with weights large
    enough that the gates reach the SwiGLU clamp at 7 (so a library's clamp is exercised), and 5 tokens' x, top-2
    ids and routing weights for them: (experts, x, ids, weights). The library-layout tests' common input."""
    from trtllm_dflash.bench import gpt_oss_step
    target, _ = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 32, "triton")
    mx = target.layers[0].mlp.experts
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        mx.gate_up_proj_scales.copy_(torch.randint(124, 128, mx.gate_up_proj_scales.shape, generator=g))
        mx.down_proj_scales.copy_(torch.randint(118, 122, mx.down_proj_scales.shape, generator=g))
        mx.gate_up_proj_bias.normal_(0.0, 1.0, generator=g)
        mx.down_proj_bias.normal_(0.0, 0.05, generator=g)
    x = torch.randn(5, 64, generator=g)
    ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(5)])
    weights = torch.softmax(torch.randn(5, 2, generator=g), -1)
    return mx, x, ids, weights
