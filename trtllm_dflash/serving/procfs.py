# SPDX-License-Identifier: Apache-2.0
"""What /proc says about the server's processes: a process's state and parent, a process tree (the benchmarks
check none of it outlives its server), the python backend's shared-memory regions a process maps (dflash-serve
and the engine process remove the ones a killed tritonserver or stub leaves in /dev/shm)."""
from __future__ import annotations

import os
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


def _proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, start time in clock ticks), from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        rest = text[text.rindex(")") + 2:].split()
        table[int(entry)] = (int(rest[1]), comm, int(rest[19]))
    return table


def descendants(root: int) -> dict[int, tuple[str, int]]:
    """The process tree under ``root`` (itself included): pid -> (comm, start time)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out[pid] = (table[pid][1], table[pid][2])
            todo += children.get(pid, [])
    return out


def alive(pid: int, start: int) -> bool:
    """The process ``pid`` still runs and is the one that started at ``start`` (not a reuse of its pid)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(text[text.rindex(")") + 2:].split()[19]) == start and text[text.rindex(")") + 2] != "Z"
