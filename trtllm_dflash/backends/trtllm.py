# SPDX-License-Identifier: Apache-2.0
"""TensorRT-LLM backend: the deployment directory's ``llm_api_options.yaml`` and running it.

The YAML is ``TorchLlmArgs`` for TensorRT-LLM >= 1.3.0rc15 (``tensorrt_llm/llmapi/llm_args.py``), the same
mapping ``trtllm-serve --extra_llm_api_options``, ``trtllm-bench`` and ``LLM(**kwargs)`` take; the field names
and types we emit are pinned in tests/test_llm_api_options.py. ``tensorrt_llm`` is imported only by
:func:`load_llm`: it ships in NGC containers, not on PyPI.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from ..errors import DFlashError

OPTIONS_FILE = "llm_api_options.yaml"
MIN_VERSION = "1.3.0rc15"


def llm_api_options(*, tp_size: int, ep_size: int | None, dtype: str, max_batch_size: int, max_num_tokens: int,
                    max_seq_len: int, free_gpu_memory_fraction: float, trust_remote_code: bool,
                    moe_backend: str | None, speculative_model: str, max_draft_len: int,
                    target_layer_ids: list[int], mask_token_id: int, attention_backend: str) -> dict:
    """The TorchLlmArgs mapping for a DFlash deployment (``model`` is passed separately)."""
    opts: dict = {"tensor_parallel_size": tp_size}
    if ep_size is not None:
        opts["moe_expert_parallel_size"] = ep_size
    opts.update({
        "dtype": dtype,
        # DFlash with attention data-parallelism is not validated upstream.
        "enable_attention_dp": False,
        "max_batch_size": max_batch_size,
        "max_num_tokens": max_num_tokens,
        # Set explicitly: the DFlash context arena scales with max_seq_len x max_batch_size.
        "max_seq_len": max_seq_len,
        "trust_remote_code": trust_remote_code,
        # The one-model DFlash verify step needs TRTLLM target attention (FlashInfer assumes 1 token/seq).
        "attn_backend": "TRTLLM",
        # Block reuse stays off: TensorRT-LLM's DFlash tests run without it.
        "kv_cache_config": {"free_gpu_memory_fraction": free_gpu_memory_fraction, "enable_block_reuse": False},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": max_batch_size},
    })
    if moe_backend is not None:
        opts["moe_config"] = {"backend": moe_backend}
    opts["speculative_config"] = {
        "decoding_type": "DFlash",
        "speculative_model": speculative_model,
        "max_draft_len": max_draft_len,
        # Set both explicitly: TensorRT-LLM auto-fills them only for a local drafter folder.
        "target_layer_ids": list(target_layer_ids),
        "mask_token_id": mask_token_id,
        "attention_backend": attention_backend,
    }
    return opts


def dump_options(options: dict, quant: str | None = None) -> str:
    header = (f"# TorchLlmArgs for TensorRT-LLM >= {MIN_VERSION} (PyTorch backend), written by dflash-build.\n"
              "# Use: trtllm-serve <dir>/target --extra_llm_api_options <this file>  (or --config)\n")
    if quant is not None:
        # ModelConfig.from_pretrained (tensorrt_llm/_torch/model_config.py) reads hf_quant_config.json from the
        # checkpoint folder: quantization.{quant_algo, kv_cache_quant_algo, group_size, exclude_modules}. A
        # quant_config here would only duplicate it. The drafter loads from its own folder, unquantized.
        header += (f"# Quantization: {quant.upper()} (ModelOpt), read by TensorRT-LLM from "
                   "<dir>/target/hf_quant_config.json\n")
    return header + yaml.safe_dump(options, sort_keys=False, default_flow_style=None)


def serve_command(directory: Path, *, host: str = "0.0.0.0", port: int = 8000) -> list[str]:
    directory = Path(directory).resolve()
    return ["trtllm-serve", str(directory / "target"), "--backend", "pytorch", "--host", host, "--port", str(port),
            "--extra_llm_api_options", str(directory / OPTIONS_FILE)]


def bench_commands(directory: Path, manifest: dict, *, input_len: int = 1024, output_len: int = 1024,
                   num_requests: int = 512, concurrency: int = 64) -> list[list[str]]:
    """Dataset preparation, then ``trtllm-bench throughput`` on this directory."""
    directory = Path(directory).resolve()
    target, dataset = directory / "target", directory / "bench" / f"dataset_{input_len}_{output_len}.jsonl"
    name = manifest["target"]["source"]
    prepare = ["trtllm-bench", "--model", name, "--model_path", str(target), "prepare-dataset", "--output",
               str(dataset), "token-norm-dist", "--input-mean", str(input_len), "--output-mean", str(output_len),
               "--input-stdev", "0", "--output-stdev", "0", "--num-requests", str(num_requests)]
    bench = ["trtllm-bench", "--model", name, "--model_path", str(target), "throughput", "--backend", "pytorch",
             "--dataset", str(dataset), "--tp", str(manifest["tp_size"]), "--ep", str(manifest["ep_size"]),
             "--concurrency", str(concurrency), "--streaming", "--num_requests", str(num_requests),
             "--extra_llm_api_options", str(directory / OPTIONS_FILE),
             "--report_json", str(directory / "bench" / f"report_c{concurrency}.json")]
    return [prepare, bench]


def shell_line(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def read_options(directory: Path) -> dict:
    """The directory's options with paths pointing at where the directory is now (it may have moved)."""
    directory = Path(directory).resolve()
    path = directory / OPTIONS_FILE
    if not path.is_file():
        raise DFlashError(str(directory), f"has no {OPTIONS_FILE} (built for CPU?)",
                          "rebuild with --gpu h100/h200/b200/b300/gb200")
    options = yaml.safe_load(path.read_text())
    options["speculative_config"]["speculative_model"] = str(directory / "drafter")
    return options


def load_llm(directory: str | Path, **overrides):
    """``tensorrt_llm.LLM`` for a deployment directory, configured exactly as trtllm-serve would be."""
    try:
        import tensorrt_llm
        from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
    except ImportError as err:
        raise DFlashError("backend trtllm", f"TensorRT-LLM is not installed ({err})",
                          f"run inside an NGC TensorRT-LLM >= {MIN_VERSION} container, or use --backend torch") \
            from None
    from ..checkpoints import manifest as manifest_mod

    directory = Path(directory).resolve()
    manifest = manifest_mod.read(directory)
    if manifest["backend"] != "trtllm":
        raise DFlashError("backend", f"{directory} was built for the {manifest['backend']} backend",
                          "rebuild it with dflash-build --backend trtllm")
    options = {**read_options(directory), **overrides}
    llm_args = update_llm_args_with_extra_dict({"model": str(directory / "target"), "backend": "pytorch"}, options)
    return tensorrt_llm.LLM(**llm_args)
