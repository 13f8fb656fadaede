# SPDX-License-Identifier: Apache-2.0
"""Bench fixtures: the serving tests' tiny deployment (random 2-layer Llama with SmolLM2's tokenizer and an
untrained drafter) for fast in-process sweeps, and the real SmolLM2 demo deployment for the Triton sweep."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving.conftest import make_deployment, tiny_target_with_tokenizer  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]


def in_a_process_of_its_own(args: list[str]) -> subprocess.CompletedProcess:
    """python ARGS in a child process: spawning client processes starts multiprocessing's resource tracker, a
    child that lives as long as its parent, which must not be the test process (tests elsewhere check that a
    server leaves the test process no children)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="session")
def tiny_engine_dir(tmp_path_factory, tiny_target_with_tokenizer) -> Path:  # noqa: F811
    """A deployment with manifest runtime max_batch_size 8, max_seq_len 256, block_size 8, float32."""
    return make_deployment(tmp_path_factory.mktemp("bench") / "tiny", *tiny_target_with_tokenizer, fill=False)


@pytest.fixture(scope="session")
def demo_engine_dir(tmp_path_factory) -> Path:
    """The README demo, exactly as documented: dflash-build --config build_configs/smollm2-135m_cpu_tp1.yaml."""
    from trtllm_dflash import build

    out = tmp_path_factory.mktemp("demo") / "smollm2"
    assert build.main(["--config", str(REPO / "build_configs" / "smollm2-135m_cpu_tp1.yaml"), "--out", str(out)]) == 0
    assert json.loads((out / "manifest.json").read_text())["runtime"]["max_batch_size"] >= 2
    return out


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SETTINGS_KEYS = {"server", "engine_dir", "mode", "concurrency", "dataset", "num_requests", "warmup", "input_len",
                 "max_new_tokens", "ignore_eos", "temperature", "seed", "streaming", "target", "drafter",
                 "drafter_untrained", "block_size", "tp_size", "num_gpus", "gpu_name", "gpu_profile", "device", "dtype",
                 "max_batch_size", "max_seq_len", "num_prompts_skipped"}
VERSION_KEYS = {"trtllm_dflash", "python", "git_sha", "torch", "transformers", "tritonclient", "tensorrt_llm"}
DIST_KEYS = {"mean", "p50", "p90", "p99"}
METRIC_KEYS = {"num_requests", "num_errors", "first_error", "finish_reasons", "wall_s", "num_output_tokens", "isl",
               "osl", "total_tok_s", "tok_s_gpu", "request_throughput", "tok_s_user", "tok_s_user_e2e",
               "effective_concurrency", "ttft_ms", "tpot_ms", "e2e_ms", "itl_chunk_ms", "itl_token_ms",
               "acceptance_length_mean", "acceptance_histogram", "acceptance_source", "acceptance_rate",
               "tokens_per_chunk_mean"}


def check_row(row: dict, concurrency: int) -> None:
    """The JSONL schema of one level, and that its numbers agree with each other."""
    assert row["schema"] == "trtllm_dflash.sweep/1" and row["label"] and row["timestamp"] and row["command"]
    assert SETTINGS_KEYS <= row["settings"].keys(), SETTINGS_KEYS - row["settings"].keys()
    assert VERSION_KEYS <= row["versions"].keys() and row["versions"]["trtllm_dflash"]
    m = row["metrics"]
    assert METRIC_KEYS <= m.keys(), METRIC_KEYS - m.keys()
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_chunk_ms", "itl_token_ms"):
        assert m[key].keys() == DIST_KEYS and m[key]["p50"] <= m[key]["p90"] <= m[key]["p99"], (key, m[key])
    s = row["settings"]
    assert s["concurrency"] == concurrency and m["num_requests"] == s["num_requests"] and m["num_errors"] == 0
    rel = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b))  # noqa: E731
    # Identities that hold whatever the timing noise:
    assert rel(m["total_tok_s"], m["request_throughput"] * m["osl"]["mean"])
    assert rel(m["tok_s_gpu"], m["total_tok_s"] / s["num_gpus"])
    assert rel(m["effective_concurrency"], m["request_throughput"] * m["e2e_ms"]["mean"] / 1e3)   # Little's law
    assert rel(m["num_output_tokens"], m["osl"]["mean"] * m["num_requests"])
    # Closed loop: C in flight except while the last ones drain.
    assert 0.5 * concurrency <= m["effective_concurrency"] <= concurrency * 1.001
    # tok/s/user x concurrency = total tok/s: exact for the pooled per-user rate (mean OSL / mean E2E) and the
    # effective concurrency...
    assert rel(m["osl"]["mean"] / (m["e2e_ms"]["mean"] / 1e3) * m["effective_concurrency"], m["total_tok_s"])
    # ...and within noise for the reported mean of per-request rates and the set concurrency. The mean of rates
    # is at least the pooled rate (Jensen) and C at least the effective C, so the product bounds the total from
    # above; how far below it lies depends on how unequal the requests were, which is measurement noise: a
    # stalled step (a busy CI machine) slows some requests and not others. Checked tightly when they were equal.
    product = m["tok_s_user_e2e"] * concurrency
    assert m["total_tok_s"] <= 1.1 * product, (m["total_tok_s"], product)
    if m["e2e_ms"]["p99"] <= 1.5 * m["e2e_ms"]["p50"]:
        assert m["total_tok_s"] >= 0.4 * product, (m["total_tok_s"], product, m["e2e_ms"])
    # Excluding TTFT can only make a request look faster (up to the rounding of one token).
    assert m["tok_s_user"] >= 0.8 * m["tok_s_user_e2e"]
    assert m["itl_token_ms"]["mean"] <= m["itl_chunk_ms"]["mean"] * 1.0001
    hist = m["acceptance_histogram"]
    assert all(1 <= int(k) <= s["block_size"] for k in hist) and sum(hist.values()) > 0
    assert 1.0 <= m["acceptance_length_mean"] <= s["block_size"]
