# SPDX-License-Identifier: Apache-2.0
"""The one-shot all-reduce over peer memory (runtime/allreduce.py) on 2 and 4 GPUs: its sums equal NCCL's up to the
order of the additions, eager and replayed from a CUDA graph, and messages past its max_bytes go to NCCL; the
all-reduce fused with the residual add + RMSNorm (kernels/allreduce_norm.py, the Lamport kernel and the kernel with
barriers) gives the unfused chain's results; 66 Lamport calls in one graph, replayed, each equal NCCL's sum; the
Lamport kernel's largest message (a full slot: 64 rows) in every dtype, alone and fused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.test_tp import mpiexec

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent

# A few roundings of the result's dtype, relative to its largest magnitude: the kernels may add the ranks' values in
# other orders (2 ranks: a + b either way, the same bits, in practice).
TOLERANCE = {"torch.bfloat16": 2 ** -7, "torch.float16": 2 ** -10, "torch.float32": 2 ** -22}


@pytest.mark.parametrize("ranks", [2, 4])
def test_oneshot_all_reduce_equals_nccl(tmp_path, ranks):
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    out = tmp_path / "allreduce.json"
    # Open MPI refuses to start ranks as root (GPU hosts run the tests as root) unless both variables say so;
    # MPICH ignores them
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, str(HERE / "allreduce_run_cuda.py"), str(out),
                           str(ranks)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    res = json.loads(out.read_text())
    assert len(res["ranks"]) == ranks
    for rank in res["ranks"]:
        for c in rank["cases"]:
            nbytes = c["numel"] * torch.finfo(getattr(torch, c["dtype"][6:])).bits // 8
            # decode-sized messages (up to 16384 values here: one row) on the Lamport kernel, any float dtype; the
            # rest up to max_bytes on torch's one-shot kernel, which has no float16 build (NCCL)
            assert c["lamport"] == (c["numel"] <= 16384), c
            kernel = c["dtype"] != "torch.float16"
            assert c["oneshot"] == (c["lamport"] or (kernel and nbytes <= res["max_bytes"] and nbytes % 4 == 0)), c
            assert c["max_abs_diff"] <= TOLERANCE[c["dtype"]] * c["scale"], c
        assert all(d <= 0.1 for d in rank["graph"]), rank["graph"]   # bf16 sums of 2-4 normals: |y| < 10
        assert all(d <= 0.1 for d in rank["stream"]), rank["stream"]   # 66 Lamport calls a replay, slots rotating
        assert len(rank["full"]) == 3
        for c in rank["full"]:   # a full slot, eager and replayed
            for key in ("eager_max_abs_diff", "graph_max_abs_diff"):
                assert c[key] <= TOLERANCE[c["dtype"]] * c["scale"], c
        # the all-reduce fused with the residual add + RMSNorm: the chain's bits for the new residual stream, its
        # norm within the norm kernel's rounding, the same on every rank
        for c in rank["fused"]:
            assert c["total_equal"], c
            # one rounding of the largest value (the mean of squares summed in another order): 2 ** -5 at |y| ~ 6
            assert c["normed_max_abs_diff"] <= (2 ** -7 if "bfloat16" in c["dtype"] else 1e-5) * c["normed_scale"], c
    for i in range(len(res["ranks"][0]["fused"])):
        assert len({r["fused"][i]["normed_sha"] for r in res["ranks"]}) == 1, i
