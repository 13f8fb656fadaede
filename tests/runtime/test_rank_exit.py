# SPDX-License-Identifier: Apache-2.0
"""A TP job's ranks leave together: no rank exits while rank 0 still writes its results. MPICH's hydra ends the
whole job, and still exits 0, as soon as one rank leaves through os._exit (errors.exit_code's way out), so a
rank 0 still writing was cut off: its file missing or empty. A slow write here makes that race certain."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_tp import mpiexec

ROOT = Path(__file__).resolve().parent.parent.parent

# A disk that takes 2 s per write: without the fix the other rank is long gone, and the job with it, by then.
SLOW_WRITES = """
import pathlib, sys, time
write_text = pathlib.Path.write_text
def slow(self, *a, **k):
    time.sleep(2)
    return write_text(self, *a, **k)
pathlib.Path.write_text = slow
"""

# Rank 0 writes after the group's last collective; both ranks leave through exit_code, group still open.
GROUP_JOB = SLOW_WRITES + """
import torch
from trtllm_dflash.errors import exit_code
from trtllm_dflash.runtime.distributed import init_tp
def main(argv):
    tp = init_tp(2, torch.device("cpu"))
    tp.all_reduce(torch.ones(1))
    if tp.rank == 0:
        pathlib.Path(argv[0]).write_text("done")
    return 0
sys.exit(exit_code(main, sys.argv[1:]))
"""


def _mpiexec(tmp_path, *argv):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.mpi
def test_exit_code_holds_every_rank_until_rank_0_has_written(tmp_path):
    out = tmp_path / "out.txt"
    proc = _mpiexec(tmp_path, GROUP_JOB, str(out))
    assert out.is_file() and out.read_text() == "done", proc.stderr[-3000:]


@pytest.mark.mpi
@pytest.mark.slow   # ~10 s on 2 cores: two ranks load SmolLM2's tokenizer and a tiny pair, two engines each
def test_dflash_generate_under_mpiexec_writes_its_json_and_prints_whole(tmp_path, smollm2_dir):
    from trtllm_dflash.testing import write_tiny_pair_with_tokenizer

    target, drafter = write_tiny_pair_with_tokenizer(tmp_path / "pair", smollm2_dir)
    out = tmp_path / "gen.json"
    run = SLOW_WRITES + "from trtllm_dflash.cli import generate_main\nsys.exit(generate_main())"
    proc = _mpiexec(tmp_path, run, "--target", str(target), "--drafter", str(drafter), "--tp_size", "2",
                    "--mode", "both", "--draft_policy", "fixed", "--max_new_tokens", "8", "--max_seq_len", "128",
                    "--prompt", "Hello", "--json", str(out))
    assert out.is_file(), f"mpiexec exited 0 without {out.name}; stderr:\n{proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    assert res["ar"][0]["output_ids"] == res["dflash"][0]["output_ids"] and len(res["ar"][0]["output_ids"]) == 8
    assert "DFlash tokens identical to autoregressive: yes" in proc.stdout   # rank 0's stdout, flushed in time
