# SPDX-License-Identifier: Apache-2.0
"""The quick start's stability figure: the spread of the speed-ups that runs of the same command print."""
import pytest

from trtllm_dflash.bench.cpu_generate_parity import spread, summary


def _run(printed: float, wall_ratio: float = 1.0) -> dict:
    return {"dflash_over_ar_wall": wall_ratio, "same_tokens": True, "quickstart_speedup": printed}


def test_spread_is_max_over_min():
    assert spread([1.0, 1.1, 1.05]) == pytest.approx(0.1)


def test_the_worst_three_runs_in_a_row_are_reported():
    s = summary([_run(x) for x in (1.10, 1.12, 1.11, 1.40, 1.12)])["quickstart_speedup"]
    assert s["median"] == pytest.approx(1.12)
    assert s["spread"] == pytest.approx(1.40 / 1.10 - 1)
    # windows: (1.10, 1.12, 1.11), (1.12, 1.11, 1.40), (1.11, 1.40, 1.12): the last two hold the outlier
    assert s["max_spread_3_in_a_row"] == pytest.approx(1.40 / 1.11 - 1)


def test_fewer_than_three_runs_use_what_there_is():
    s = summary([_run(1.0), _run(1.2)])["quickstart_speedup"]
    assert s["max_spread_3_in_a_row"] == pytest.approx(0.2)
