# SPDX-License-Identifier: Apache-2.0
"""errors.leave_job: how a rank of a multi-process job ends."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_tp import mpiexec

ROOT = Path(__file__).resolve().parents[1]


def test_a_rank_that_used_mpi_leaves_it_finalised(tmp_path):
    """A run that used MPI but never reached init_tp's rendezvous (TP 1 under mpirun: bench/tp.py's barrier) leaves
    with MPI finalised, so the launcher sees a clean exit (Open MPI's mpirun exits 1 for a rank that does not). One
    rank: with two and no torch group to wait on, MPICH's launcher may end the second before it prints."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "MPI.COMM_WORLD.barrier()\n"
        "import os\n"
        "import trtllm_dflash.errors as errors\n"
        "real_exit = os._exit\n"
        "def exit_(rc):\n"
        "    print('finalized', MPI.Is_finalized(), 'rc', rc, flush=True)\n"
        "    real_exit(rc)\n"
        "os._exit = exit_\n"
        "errors.leave_job(0)\n")
    proc = subprocess.run([mpiexec(), "-n", "1", sys.executable, str(probe)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finalized True rc 0" in proc.stdout, proc.stdout
