# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N` on N GPUs: RuntimeConfig.allreduce_strategy "oneshot" (the Lamport kernel for decode-sized
rows, torch's one-shot kernel above) against NCCL on the same inputs, eager and inside a CUDA graph; rank 0 writes
what it saw as JSON.

usage: allreduce_run_cuda.py OUT.json TP_SIZE
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")                # NVLink multicast off, as the runtime runs
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trtllm_dflash.errors import exit_code  # noqa: E402
from trtllm_dflash.runtime.allreduce import LAMPORT_MAX_ROWS  # noqa: E402
from trtllm_dflash.runtime.distributed import init_tp  # noqa: E402


def fused_cases(tp) -> list[dict]:
    """TPGroup.all_reduce_add_norm on the one-shot buffers (kernels/allreduce_norm.py) against the chain it replaces,
    computed from every rank's partial: float32 sum in rank order, rounded, + bias, + residual, norm (the Triton
    norm kernel; gpt-oss's own norm, the weight in float32 before the rounding, against gpt_oss._add_norm's eager
    reference). Eager and from a CUDA graph; the totals must match bit for bit, and every rank get the same bits."""
    from trtllm_dflash.runtime.kernels import norm as norm_kernels
    from trtllm_dflash.runtime.models.gpt_oss import GptOssRMSNorm, _add_norm
    from trtllm_dflash.runtime.models.layers import RMSNorm

    def llama_chain(residual, reduced, norm, bias):
        if bias is not None:
            reduced = (reduced.float() + bias.float()).to(reduced.dtype)
        return norm_kernels.rms_norm(residual, norm.weight, norm.eps, delta=reduced)

    def gpt_oss_chain(residual, reduced, norm, bias):
        return _add_norm.eager(residual, reduced, norm.weight, norm.eps, bias)

    out = []
    for dtype, rows, hidden, with_bias in ((torch.bfloat16, 1, 4096, False), (torch.bfloat16, 16, 4096, True),
                                           (torch.bfloat16, 48, 2880, True), (torch.float32, 7, 576, False),
                                           (torch.bfloat16, LAMPORT_MAX_ROWS, 4096, False)):   # a full slot
        # the barrier kernel below a full slot only: at 64 rows x 4096 its 100-call graph stalled on two H200s
        # (benchmarks/results/tp_h200x2_full_slot/), and the runtime routes no rows to it
        out += _fused_case(tp, RMSNorm, 1e-6, llama_chain, dtype, rows, hidden, with_bias, seeds=(17, 1000),
                           barrier=rows < LAMPORT_MAX_ROWS)
    for rows in (1, 10):
        out += _fused_case(tp, GptOssRMSNorm, 1e-5, gpt_oss_chain, torch.bfloat16, rows, 2880, True, seeds=(5, 2000),
                           barrier=False)
    return out


def _fused_case(tp, norm_cls, eps: float, chain, dtype, rows: int, hidden: int, with_bias: bool,
                seeds: tuple[int, int], barrier: bool) -> list[dict]:
    """One shape: the runtime's route (the Lamport kernel at these rows) and, with ``barrier``, the kernel with
    barriers (llama's norm rounding only), each eager and replayed from a CUDA graph, against ``chain`` (residual,
    the rounded sum over the ranks, norm, bias) -> (total, normed). ``seeds``: of the inputs every rank shares, and
    the step between ranks' partials."""
    from trtllm_dflash.runtime.kernels import Kernels
    shared, per_rank = seeds
    g = torch.Generator("cuda").manual_seed(shared + rows)   # the same residual, weight, bias on every rank
    residual = torch.randn(rows, hidden, dtype=dtype, device="cuda", generator=g)
    norm = norm_cls(hidden, eps, Kernels(triton=True, sampling=True)).to("cuda", dtype)
    norm.weight.data = (torch.rand(hidden, device="cuda", generator=g) + 0.5).to(dtype)
    bias = torch.randn(hidden, dtype=dtype, device="cuda", generator=g) if with_bias else None
    x = torch.randn(rows, hidden, dtype=dtype, device="cuda",
                    generator=torch.Generator("cuda").manual_seed(per_rank * tp.rank + rows))
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x)
    want_total, want_normed = chain(residual, sum(p.float() for p in parts).to(dtype), norm, bias)
    small = tp.small_all_reduce
    assert small.handles(x) and small.pushes(x) == (rows <= LAMPORT_MAX_ROWS)
    assert small.fuses(x, norm.weight_first)
    ways = {"route": lambda: tp.all_reduce_add_norm(x, residual, norm, bias)[::-1]}
    if barrier:
        ways["barrier"] = lambda: small.barrier_add_rms_norm(x, residual, norm.weight, norm.eps, bias)
    out = []
    for way, fn in ways.items():
        total, normed = fn()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            g_total, g_normed = fn()
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        out.append({"way": way, "norm": norm_cls.__name__, "dtype": str(dtype), "rows": rows, "hidden": hidden,
                    "bias": with_bias,
                    "total_equal": torch.equal(total, want_total) and torch.equal(g_total, want_total),
                    "normed_max_abs_diff": max((normed.float() - want_normed.float()).abs().max().item(),
                                               (g_normed.float() - want_normed.float()).abs().max().item()),
                    "normed_scale": want_normed.float().abs().max().item(),
                    "normed_sha": hashlib.sha256(normed.float().cpu().numpy().tobytes()).hexdigest()})
    return out


def lamport_full(tp) -> list[dict]:
    """The Lamport kernel's largest message in each dtype: LAMPORT_MAX_ROWS rows that fill a slot exactly (bf16:
    64 x 4096, a Qwen3-8B decode layer's all-reduce at batch 64), eager and three calls in a replayed graph, against
    NCCL. The bench's 512 KB point stalled on 2 H200s while 128 KB ran: this is the case no test covered."""
    small, out = tp.small_all_reduce, []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        cap = small.lamport[dtype][3]
        x = torch.randn(LAMPORT_MAX_ROWS, cap // LAMPORT_MAX_ROWS, dtype=dtype, device="cuda",
                        generator=torch.Generator("cuda").manual_seed(77 + tp.rank))
        assert small.pushes(x) and x.numel() == cap
        want = x.clone()
        dist.all_reduce(want)
        eager = (tp.all_reduce(x).float() - want.float()).abs().max().item()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ys = [tp.all_reduce(x) for _ in range(3)]
        graph.replay()
        replayed = max((y.float() - want.float()).abs().max().item() for y in ys)
        out.append({"dtype": str(dtype), "shape": list(x.shape), "eager_max_abs_diff": eager,
                    "graph_max_abs_diff": replayed, "scale": want.float().abs().max().item()})
    return out


def lamport_stream(tp) -> list[float]:
    """Many Lamport all-reduces back to back in one CUDA graph (rows 1, 16, 3 in turn: the slots rotate at every
    call, and a fast rank runs ahead into the next slot), replayed three times on new inputs: each result against
    NCCL's sum of the same inputs. Returns the largest difference per replay."""
    xs = [torch.zeros(rows, 4096, dtype=torch.bfloat16, device="cuda") for rows in (1, 16, 3) * 22]
    assert all(tp.small_all_reduce.pushes(x) for x in xs)
    for x in xs:
        tp.all_reduce(x)   # warm-up: compiles, and moves the slots on by 66 calls before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [tp.all_reduce(x) for x in xs]
    diffs = []
    for step in range(3):
        g = torch.Generator("cuda").manual_seed(tp.rank * 31 + step)
        for x in xs:
            x.copy_(torch.randn(x.shape, generator=g, device="cuda", dtype=x.dtype))
        graph.replay()
        worst = 0.0
        for x, y in zip(xs, ys):
            want = x.clone()
            dist.all_reduce(want)
            worst = max(worst, (y.float() - want.float()).abs().max().item())
        diffs.append(worst)
    return diffs


@torch.no_grad()   # the norm weight is a Parameter: results without autograd history, as the runtime runs
def main(argv) -> int:
    out_path, size = argv[0], int(argv[1])
    tp = init_tp(size, torch.device("cuda"), allreduce_strategy="oneshot")
    small = tp.small_all_reduce
    assert small is not None, "oneshot asked for but not made"
    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        limit = small.max_bytes // dtype.itemsize
        for numel in (1, 7, 4096, 8 * 4096, limit, limit + 64):   # the last one is NCCL's
            g = torch.Generator("cuda").manual_seed(1000 * tp.rank + numel)
            x = torch.randn(numel, dtype=dtype, device="cuda", generator=g)
            want = x.clone()
            dist.all_reduce(want)
            got = tp.all_reduce(x.clone())
            cases.append({"dtype": str(dtype), "numel": numel, "oneshot": small.handles(x),
                          "lamport": small.pushes(x),
                          "max_abs_diff": (got.float() - want.float()).abs().max().item(),
                          "scale": want.float().abs().max().item()})
    # captured in a graph, as the decode step runs it; replayed on new inputs
    x = torch.zeros(2, 4096, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    tp.all_reduce(x.clone())   # warm-up outside the capture
    with torch.cuda.graph(graph):
        y = tp.all_reduce(x)
    graph_diffs = []
    for step in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator("cuda").manual_seed(tp.rank * 7 + step),
                            device="cuda", dtype=x.dtype))
        graph.replay()
        want = x.clone()
        dist.all_reduce(want)
        graph_diffs.append((y.float() - want.float()).abs().max().item())
    fused = fused_cases(tp)
    stream = lamport_stream(tp)
    full = lamport_full(tp)
    everywhere = [None] * size
    dist.all_gather_object(everywhere, {"cases": cases, "graph": graph_diffs, "fused": fused, "stream": stream,
                                        "full": full})
    if tp.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ranks": everywhere, "max_bytes": small.max_bytes}, f)
    tp.close()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, sys.argv[1:]))
