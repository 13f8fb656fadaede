# SPDX-License-Identifier: Apache-2.0
"""What /proc says about the server's processes: a process's state and parent, the python backend's
shared-memory regions a process maps (dflash-serve and the engine process remove the ones a killed
tritonserver or stub leaves in /dev/shm)."""
from __future__ import annotations

from pathlib import Path

BACKEND_SHM = "/dev/shm/triton_python_backend"


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def backend_regions(pid: int) -> set[Path]:
    """The python backend's /dev/shm files that process ``pid`` maps (none once it is gone)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {Path(line.split(None, 5)[5]) for line in maps.splitlines()
            if BACKEND_SHM in line and len(line.split(None, 5)) == 6}


def group_regions(pgid: int) -> set[Path]:
    """The python backend's /dev/shm files that the processes of group ``pgid`` map."""
    found: set[Path] = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            st = stat(int(proc.name))
            if st is not None and st[2] == pgid:
                found |= backend_regions(int(proc.name))
    return found
