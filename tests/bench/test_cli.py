# SPDX-License-Identifier: Apache-2.0
"""dflash-bench: every measurement module of trtllm_dflash.bench is a tool by name, the list fits a terminal, an
unknown name fails with the fix, and a tool runs as `python -m` runs it (its own flags, its exit code)."""
from __future__ import annotations

import re
from pathlib import Path

from trtllm_dflash.bench import cli

BENCH = Path(cli.__file__).parent
# run by their own console scripts (dflash-sweep, dflash-plot), or no command at all
NOT_TOOLS = {"cli", "sweep", "plot", "__init__"}


def test_every_runnable_module_is_a_tool_and_listed():
    runnable = {p.stem for p in BENCH.glob("*.py") if re.search(r'^if __name__ == "__main__":', p.read_text(), re.M)}
    assert runnable - NOT_TOOLS == set(cli.TOOLS.values())
    text = cli.usage()
    assert all(f"  {name} " in text for name in cli.TOOLS) and max(map(len, text.splitlines())) <= 120


def test_unknown_tool_names_the_fix(capsys):
    assert cli.main(["stepp"]) == 2
    err = capsys.readouterr().err
    assert "no tool 'stepp'" in err and "step, load, soak" in err


def test_a_tool_runs_with_its_flags_and_exit_code(tmp_path, capsys):
    assert cli.main(["e2e_summary", "--help"]) == 0 and "--sweep" in capsys.readouterr().out
    assert cli.main(["e2e_summary", "--out", str(tmp_path / "o")]) == 2          # argparse: --sweep is required
    assert "the following arguments are required: --sweep" in capsys.readouterr().err
