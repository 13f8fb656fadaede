# SPDX-License-Identifier: Apache-2.0
"""Sweep results as plot points, from three kinds of file:

- ``*.jsonl`` written by dflash-sweep (one row per level; label from the row);
- a ``trtllm-bench throughput --report_json`` file (one level; tok/s/user = its streaming
  ``token_output_speed_tok_s``, i.e. 1/TPOT);
- a TensorRT-LLM ``benchmark_serving --save-result`` file (one level; tok/s/user = 1000 / mean TPOT ms,
  tok/s/gpu = output throughput / ``num_gpus``, which the file does not hold).

A spec is ``PATH`` or ``LABEL=PATH``; PATH may be a glob (quote it), e.g. ``'EAGLE-3=eagle3_c*.json'``.
A report file holds no concurrency: it comes from ``max_concurrency`` or a ``_c<N>`` in the file name.
"""
from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError


@dataclass(frozen=True)
class Point:
    label: str
    concurrency: int
    tok_s_user: float | None        # 1/TPOT
    tok_s_user_e2e: float | None    # output tokens / end-to-end latency
    tok_s_gpu: float | None
    acceptance_length: float | None
    path: str


def split_spec(spec: str) -> tuple[str | None, list[Path]]:
    label, _, pattern = spec.partition("=") if "=" in spec and not Path(spec).exists() else (None, "", spec)
    paths = sorted(Path(p) for p in glob.glob(pattern)) or ([Path(pattern)] if Path(pattern).exists() else [])
    if not paths:
        raise DFlashError("results", f"{pattern} matches no file", "pass dflash-sweep JSONL or report JSON files")
    return label or None, paths


def load(spec: str, num_gpus: int | None = None) -> list[Point]:
    label, paths = split_spec(spec)
    return [pt for path in paths for pt in load_file(path, label, num_gpus)]


def load_file(path: Path, label: str | None = None, num_gpus: int | None = None) -> list[Point]:
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None   # JSONL with more than one row
    if isinstance(doc, dict) and "performance" in doc:
        return [_trtllm_bench(doc, path, label)]
    if isinstance(doc, dict) and "output_throughput" in doc:
        return [_benchmark_serving(doc, path, label, num_gpus)]
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not rows or any(not isinstance(r, dict) or "metrics" not in r for r in rows):
        raise DFlashError("results", f"{path} is not a dflash-sweep JSONL, trtllm-bench report or benchmark_serving "
                          "result", "pass files written by one of those")
    return [_sweep_row(r, path, label) for r in rows]


def _sweep_row(row: dict, path: Path, label: str | None) -> Point:
    m = row["metrics"]
    return Point(label or row["label"], int(row["settings"]["concurrency"]), m.get("tok_s_user"),
                 m.get("tok_s_user_e2e"), m.get("tok_s_gpu"), m.get("acceptance_length_mean"), str(path))


def _concurrency(path: Path, value) -> int:
    if value:
        return int(value)
    found = re.findall(r"(?:^|[_-])(?:c|concurrency)(\d+)(?=[_-]|$)", path.stem)
    if not found:
        raise DFlashError("results", f"{path} does not say its concurrency",
                          "name it ..._c<N>.json (scripts/trtllm_bench.sh does)")
    return int(found[-1])


def _trtllm_bench(doc: dict, path: Path, label: str | None) -> Point:
    perf, stream = doc["performance"], doc.get("streaming_metrics") or {}
    decoding = doc.get("decoding_stats") or {}
    al = (decoding.get("acceptance_length_percentiles") or {}).get("average")
    name = label or f"TRT-LLM {decoding.get('mode') or 'AR'}"
    return Point(name, _concurrency(path, None), stream.get("token_output_speed_tok_s"),
                 perf.get("output_throughput_per_user_tok_s"), perf.get("output_throughput_per_gpu_tok_s"), al, str(path))


def _benchmark_serving(doc: dict, path: Path, label: str | None, num_gpus: int | None) -> Point:
    if not num_gpus:
        raise DFlashError("--num_gpus", f"{path} (benchmark_serving) does not hold the server's GPU count",
                          "pass --num_gpus N (the server's tensor-parallel size)")
    tpot = doc.get("mean_tpot_ms")
    al = (doc.get("avg_decoded_tokens_per_iter") or {}).get("mean")
    return Point(label or "benchmark_serving", _concurrency(path, doc.get("max_concurrency")),
                 1e3 / tpot if tpot else None, doc.get("user_throughput"), doc["output_throughput"] / num_gpus,
                 al or None, str(path))
