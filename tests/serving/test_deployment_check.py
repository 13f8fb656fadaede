# SPDX-License-Identifier: Apache-2.0
"""#37 finding 11 and #35 item 7: a broken deployment directory or a busy port is one line naming the file or
the flag, exit code 2, before tritonserver starts or the model loads (dflash-serve and dflash-openai run as
the user runs them)."""
from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serving.conftest import TEST_ENV, free_port, make_deployment
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.deployment_check import check_safetensors


def _safetensors(path: Path, data: int, declared: int) -> Path:
    header = ('{"w": {"dtype": "F32", "shape": [%d], "data_offsets": [0, %d]}}' % (declared // 4, declared)).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data)
    return path


def test_safetensors_headers_are_checked_against_the_file(tmp_path):
    check_safetensors(_safetensors(tmp_path / "ok.safetensors", 16, 16))
    for name, raw, words in (("short", b"\1\2", "too short"), ("junk", b"garbage garbage!", "not a safetensors"),
                             ("notjson", struct.pack("<Q", 4) + b"{{{{", "not JSON")):
        (tmp_path / f"{name}.safetensors").write_bytes(raw)
        with pytest.raises(DFlashError, match=words):
            check_safetensors(tmp_path / f"{name}.safetensors")
    with pytest.raises(DFlashError, match="truncated: its header declares 16 bytes of tensor data, the file holds 9"):
        check_safetensors(_safetensors(tmp_path / "cut.safetensors", 9, 16))


@pytest.fixture
def broken(tmp_path, tiny_target_with_tokenizer):
    """A deployment whose target weights are cut in half (a copy: the shared one stays intact)."""
    target, drafter = tiny_target_with_tokenizer
    copy = tmp_path / "target"
    shutil.copytree(target, copy)
    weights = next(copy.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return make_deployment(tmp_path / "dep", copy, drafter), weights


def _run(module: str, *args: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=TEST_ENV,
                          timeout=120)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


SERVE = "trtllm_dflash.serving.server"
OPENAI = "trtllm_dflash.serving.openai_server"


def _serve_args() -> list[str]:
    return ["--http_port", str(free_port()), "--grpc_port", str(free_port()), "--metrics_port", str(free_port())]


@pytest.mark.parametrize("module", [SERVE, OPENAI])
def test_truncated_weights_are_one_line_naming_the_file(broken, module):
    dep, weights = broken
    weights = dep / "target" / weights.name      # as the deployment names it (target/ links to the copy)
    args = _serve_args() if module == SERVE else ["--port", str(free_port())]
    rc, out, err, took = _run(module, str(dep), *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, out, err)
    assert str(weights) in lines[0] and "truncated" in lines[0] and "dflash-build --force" in lines[0], lines
    assert "tritonserver from" not in out and took < 60


@pytest.mark.parametrize("module", [SERVE, OPENAI])
@pytest.mark.parametrize("text, words", [("{broken", "is not valid JSON"), ("[1, 2]", "is a JSON list, not an object")])
def test_an_invalid_manifest_is_one_line_naming_it(tmp_path, tiny_target_with_tokenizer, module, text, words):
    dep = make_deployment(tmp_path / "dep", *tiny_target_with_tokenizer)
    (dep / "manifest.json").write_text(text)
    args = _serve_args() if module == SERVE else ["--port", str(free_port())]
    rc, out, err, _ = _run(module, str(dep), *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and str(dep / "manifest.json") in lines[0] and words in lines[0], (out, err)


def test_dflash_openai_on_a_busy_port_fails_before_loading_the_model(tmp_path, tiny_target_with_tokenizer):
    # #35 item 7: it loaded the model and measured step costs for 30 s, then died with uvicorn's "[Errno 98]"
    # and exit code 3.
    dep = make_deployment(tmp_path / "dep", *tiny_target_with_tokenizer)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        rc, out, err, took = _run(OPENAI, str(dep), "--port", str(busy.getsockname()[1]))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: --port: port ") and "not free" in lines[0], err
    assert took < 20, took
