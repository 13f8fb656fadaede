# SPDX-License-Identifier: Apache-2.0
"""CUDA-graph capture the way the runner captures its steps; the benchmarks and GPU tests capture through it too."""
from __future__ import annotations

from collections.abc import Callable

import torch


def capture(fn: Callable[[], object], warmups: int = 2, pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn() captured as one CUDA graph: ``warmups`` eager runs on a side stream first, so Triton compiles, cuBLAS
    workspaces and lazy allocations happen outside the capture, then the capture (into ``pool`` when given).
    Returns (graph, what fn returned during the capture: the tensors every replay overwrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
