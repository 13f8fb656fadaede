# SPDX-License-Identifier: Apache-2.0
"""quickstart_repeat: the quick start's arguments stay scripts/quickstart.sh's, and what dflash-generate really
prints and writes parses into the run's figures."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from trtllm_dflash import generate
from trtllm_dflash.bench import quickstart_repeat as qr

ROOT = Path(__file__).resolve().parents[2]


def test_the_arguments_are_the_quick_start_scripts():
    text = (ROOT / "scripts" / "quickstart.sh").read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("dflash-generate ")]
    words = shlex.split(line.replace('"${DRAFTER:-smollm2-135m-dflash}"', "smollm2-135m-dflash"))
    assert words[1:-3] == qr.QUICKSTART_ARGS and words[-3:] == ["--dtype", "$DTYPE", "$@"]
    assert "quickstart_dtype()" in text   # the script's dtype is the one quickstart_repeat runs


def test_the_quick_start_dtype_follows_the_cpus_bf16_hardware():
    amx = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    avx512 = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n"
    assert qr.quickstart_dtype(amx) == "bfloat16"
    assert qr.quickstart_dtype(avx512) == "float32" and qr.quickstart_dtype("") == "float32"
    assert qr.dtype_args(["--dtype", "float16"]) == [] and qr.dtype_args(["--dtype=float32"]) == []
    assert qr.dtype_args([]) == ["--dtype", qr.quickstart_dtype()]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, smollm2_dir):
    from trtllm_dflash.testing import write_tiny_pair_with_tokenizer

    return write_tiny_pair_with_tokenizer(tmp_path_factory.mktemp("qr"), smollm2_dir)


def test_a_real_run_parses(pair, tmp_path, capsys):
    target, drafter = pair
    out = tmp_path / "run.json"
    assert generate.main(["--target", str(target), "--drafter", str(drafter), "--mode", "both", "--rounds", "3",
                          "--max_new_tokens", "12", "--max_seq_len", "256", "--prompt", "Hello",
                          "--prompt", "def f(x):", "--json", str(out)]) == 0
    stderr = capsys.readouterr().err
    run = qr.parse_run(json.loads(out.read_text()), stderr)
    assert len(run["round_speedups"]) == 3 and run["dflash_equals_ar"] is True
    assert run["printed_median_speedup"] == sorted(run["round_speedups"])[1]
    assert run["blocks_ran"] and run["blocks_ran"].startswith("block ")       # the adaptive policy's line was found
    assert run["last_choice"] and "last choice" not in run["last_choice"]
    # how many periods the policy left out depends on the machine's load (a busy CPU stalls steps): the parse
    # must agree with the line dflash-generate printed, whatever the count
    said = re.search(r"(\d+) stalled step period", stderr)
    assert run["stalled_periods_left_out"] == (int(said.group(1)) if said else 0)


def test_stalls_and_the_worst_three_in_a_row():
    stderr = ("[dflash] ran block 4: 10 steps over 5 round(s) (adaptive; last choice: batch 2: block 4; "
              "3 stalled step period(s) left out)\n")
    results = {"rounds": {"ar_wall_s": [2.0], "dflash_wall_s": [1.0], "speedup": [2.0], "median_speedup": 2.0},
               "ar": [{"output_ids": [1, 2]}], "dflash": [{"output_ids": [1, 3]}]}
    run = qr.parse_run(results, stderr)
    assert run["stalled_periods_left_out"] == 3 and run["last_choice"] == "batch 2: block 4"
    assert run["dflash_equals_ar"] is False
    runs = [{"printed_median_speedup": p, "dflash_equals_ar": True} for p in (2.0, 2.2, 2.1, 1.8)]
    s = qr.summarize(runs)
    assert s["worst_three_in_a_row_spread"] == pytest.approx(2.2 / 1.8) and s["median"] == pytest.approx(2.05)
    assert s["runs_with_dflash_equal_ar"] == 4
