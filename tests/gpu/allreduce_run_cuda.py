# SPDX-License-Identifier: Apache-2.0
"""Run under `mpiexec -n N` on N GPUs: RuntimeConfig.allreduce_strategy "oneshot" against NCCL on the same inputs,
eager and inside a CUDA graph; rank 0 writes what it saw as JSON.

usage: allreduce_run_cuda.py OUT.json TP_SIZE
"""
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")                # NVLink multicast off, as the runtime runs
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trtllm_dflash.errors import exit_code  # noqa: E402
from trtllm_dflash.runtime.distributed import init_tp  # noqa: E402


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
    everywhere = [None] * size
    dist.all_gather_object(everywhere, {"cases": cases, "graph": graph_diffs})
    if tp.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ranks": everywhere, "max_bytes": small.max_bytes}, f)
    tp.close()
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, sys.argv[1:]))
