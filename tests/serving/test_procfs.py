# SPDX-License-Identifier: Apache-2.0
"""serving/procfs.py: a process tree from /proc, and liveness that a reused pid cannot fake."""
from __future__ import annotations

import os
import subprocess
import sys

from trtllm_dflash.serving import procfs


def test_a_child_is_in_the_tree_until_it_ends_and_its_pid_is_tied_to_its_start():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tree = procfs.descendants(os.getpid())
        assert os.getpid() in tree and child.pid in tree
        _, start = tree[child.pid]
        assert procfs.alive(child.pid, start)
        assert not procfs.alive(child.pid, start + 1)      # another process that got the same pid
    finally:
        child.kill()
        child.wait()
    assert not procfs.alive(child.pid, start) and child.pid not in procfs.descendants(os.getpid())
