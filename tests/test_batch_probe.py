# SPDX-License-Identifier: Apache-2.0
"""The batch-size probe's bookkeeping (issue #24): what a chosen batch does to the schedule, and that a resumed
run takes the probe's choice instead of the command line's --batch_size. The probe's timing itself runs in the
ModelOpt smoke of benchmarks/gpu_onesitting.sh (SMOKE=1)."""
from __future__ import annotations

import json

import pytest

from trtllm_dflash import train
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training import batch_probe
from trtllm_dflash.training.settings import CONFIG_FILE


def _cfg(tmp_path, *extra):
    return train.config_from_args(["--target", "t", "--data", "d", "--out", str(tmp_path), "--batch_size", "16",
                                   "--probe_batch_sizes", "16", "32", "64", *extra])


def test_the_budget_survives_the_chosen_batch(tmp_path):
    steps = _cfg(tmp_path, "--max_steps", "1000")
    assert batch_probe.settings_for(steps, 64, 0.3) == {"batch_size": 64, "max_steps": 250}   # same sequences
    timed = _cfg(tmp_path, "--train_time_budget_s", "300", "--stop_after_s", "200")  # allowed with a probe
    assert batch_probe.settings_for(timed, 32, 0.25) == {"batch_size": 32, "max_steps": 1200,
                                                         "train_time_budget_s": 0.0}
    with pytest.raises(DFlashError, match="--stop_after_s"):   # without a probe the two still exclude each other
        train.config_from_args(["--target", "t", "--data", "d", "--out", "o", "--train_time_budget_s", "300",
                                "--stop_after_s", "200"])
    with pytest.raises(DFlashError, match="--probe_batch_sizes"):
        _cfg(tmp_path, "--probe_batch_sizes", "0")


def test_a_resumed_run_trains_at_the_probed_batch(tmp_path):
    cfg = _cfg(tmp_path, "--train_time_budget_s", "300", "--stop_after_s", "200")
    assert batch_probe.applied(cfg) == cfg            # not probed yet: the command line as it is
    chosen = batch_probe.settings_for(cfg, 32, 0.25)
    (tmp_path / batch_probe.PROBE_FILE).write_text(json.dumps({"settings": chosen}))
    resumed = batch_probe.applied(cfg)
    assert (resumed.batch_size, resumed.max_steps, resumed.train_time_budget_s) == (32, 1200, 0.0)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(resumed.to_json()))
    resumed.check_resume(tmp_path / CONFIG_FILE)      # the saved settings (probe applied) match a resumed call
    with pytest.raises(DFlashError, match="--batch_size"):
        cfg.check_resume(tmp_path / CONFIG_FILE)      # ... which the raw command line alone would not


def test_the_warm_up_step_runs_the_heaviest_batch_the_data_holds(monkeypatch):
    """A size chosen on average batches ran out of memory 750 steps into a run (batch 64 on one GPU): the probe's
    warm-up step now takes the examples with the most supervised tokens, so a size that cannot hold them fails
    in the probe, not mid-run."""
    from trtllm_dflash.training.batches import BatchStream, Example

    data = [Example(input_ids=list(range(n)), loss_mask=[0] * (n // 2) + [1] * (n - n // 2)) for n in
            (10, 90, 20, 70, 30, 60, 40, 50)]
    assert [len(e.input_ids) for e in batch_probe.heaviest(data, 3)] == [90, 70, 60]
    seen = []
    monkeypatch.setattr(batch_probe, "train_step", lambda model, opt, params, batch, *a: (
        seen.append(batch["input_ids"].shape), {"tokens": 1})[1])
    stream = BatchStream(data, 2, 16, seed=0)
    worst = BatchStream(batch_probe.heaviest(data, 2), 2, 16, seed=0)
    batch_probe._time(None, None, None, stream, 1.0, None, "cpu", 0.0, warmup=worst)
    assert seen[0] == (2, 112)   # 90 tokens + a block - 1, rounded up to blocks of 16: the heaviest pair
    assert len(seen) == 3 and max(s[1] for s in seen[1:]) <= 112
