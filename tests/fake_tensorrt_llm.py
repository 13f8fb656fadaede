# SPDX-License-Identifier: Apache-2.0
"""A stand-in ``tensorrt_llm`` (it cannot be installed here) that is as strict as the real one about its inputs.

``LLM(**kwargs)`` validates like TensorRT-LLM's pydantic ``TorchLlmArgs`` (``extra: forbid``, strict types):
an unknown field or a mistyped value raises ``ValueError`` naming it. The types come from the pinned schema in
tests/test_llm_api_options.py (read from TensorRT-LLM 1.4.0rc1's API reference), checked here by code of its
own, not by the package's ``check_options``. ``update_llm_args_with_extra_dict`` merges as trtllm-serve does
for ``--extra_llm_api_options`` (the YAML's values override the command line's; nested mappings replace).
"""
from __future__ import annotations

import asyncio
import sys
import types

from tests.test_llm_api_options import PINNED

TOP_LEVEL = {"model": "str", "backend": ("pytorch",), **PINNED}


def _validate(value, kind, where: str) -> None:
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: Input should be a valid dictionary")
        for key, item in value.items():
            if key not in kind:
                raise ValueError(f"{where}.{key}: Extra inputs are not permitted")
            _validate(item, kind[key], f"{where}.{key}")
        return
    if isinstance(kind, tuple):
        ok = value in kind
    elif kind in ("int>0", "int>=0"):
        ok = type(value) is int and value >= (1 if kind == "int>0" else 0)
    elif kind == "fraction":
        ok = type(value) is float and 0 < value < 1
    elif kind == "list[int]":
        ok = isinstance(value, list) and all(type(v) is int for v in value)
    elif kind == "dict[int,int]":
        ok = isinstance(value, dict) and all(type(k) is int and type(v) is int for k, v in value.items())
    else:
        ok = type(value) is {"str": str, "bool": bool}[kind]
    if not ok:
        raise ValueError(f"{where}: {value!r} is not a valid {kind}")


class _Output:
    def __init__(self, text, diff, finish_reason=None):
        self.text, self.text_diff, self.finish_reason, self.stop_reason = text, diff, finish_reason, None
        spec = types.SimpleNamespace(acceptance_rate=0.5, total_accepted_draft_tokens=3, total_draft_tokens=6)
        self.request_perf_metrics = types.SimpleNamespace(speculative_decoding=spec)


class _Result:
    """GenerationResult as the backend uses it: an async iterator of updates, and abort()."""

    def __init__(self, prompt):
        self.prompt, self.aborted = prompt, False

    def abort(self):
        self.aborted = True

    async def _gen(self):
        text = ""
        for i, piece in enumerate(["Hel", "lo", "!"]):
            await asyncio.sleep(0)
            text += piece
            last = i == 2
            yield types.SimpleNamespace(finished=last, outputs=[_Output(text, piece, "length" if last else None)])

    def __aiter__(self):
        return self._gen()


def install(monkeypatch) -> dict:
    """Put the fake in sys.modules; returns the record of what it was called with."""
    calls: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            for key, value in kwargs.items():
                if key not in TOP_LEVEL:
                    raise ValueError(f"{key}: Extra inputs are not permitted")
                _validate(value, TOP_LEVEL[key], key)
            calls["llm_kwargs"] = kwargs

        def generate_async(self, prompt, sampling_params, streaming=False):
            calls.setdefault("generate", []).append((prompt, sampling_params, streaming))
            return _Result(prompt)

        def shutdown(self):
            calls["shutdown"] = True

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    def update_llm_args_with_extra_dict(llm_args, extra, extra_llm_api_options=None):
        calls["merged"] = (dict(llm_args), dict(extra))
        return {**llm_args, **extra}

    root = types.ModuleType("tensorrt_llm")
    root.LLM, root.SamplingParams = LLM, SamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    llm_args.update_llm_args_with_extra_dict = update_llm_args_with_extra_dict
    root.llmapi, llmapi.llm_args = llmapi, llm_args
    for name, mod in (("tensorrt_llm", root), ("tensorrt_llm.llmapi", llmapi),
                      ("tensorrt_llm.llmapi.llm_args", llm_args)):
        monkeypatch.setitem(sys.modules, name, mod)
    assert "tensorrt_llm" in sys.modules
    return calls
