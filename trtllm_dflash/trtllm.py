# SPDX-License-Identifier: Apache-2.0
"""TensorRT-LLM, the runtime of a ``--backend trtllm`` deployment: its ``llm_api_options.yaml``, the schema,
and running it.

The YAML is ``TorchLlmArgs`` (``tensorrt_llm/llmapi/llm_args.py``), the same mapping
``trtllm-serve --extra_llm_api_options``, ``trtllm-bench`` and ``LLM(**kwargs)`` take. :data:`TORCH_LLM_ARGS`
is the part of that schema we write, checked by :func:`check_options` before anything is written or loaded;
tests/test_llm_api_options.py pins it field by field against TensorRT-LLM 1.4.0rc1's API reference.
``tensorrt_llm`` is imported only by :func:`load_llm`: it ships in NGC containers, not on PyPI.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from .errors import DFlashError

OPTIONS_FILE = "llm_api_options.yaml"
# The oldest release with everything a plain DFlash deployment needs (YaRN-RoPE fix, PR #13995 verify width).
MIN_VERSION = "1.3.0rc15"
# The release whose schema :data:`TORCH_LLM_ARGS` follows; fields may move in the next minor release.
SCHEMA_VERSION = "1.4.0rc1"
BELOW_VERSION = "1.5"
# Optional fields and the first release whose API reference we read them in
# (nvidia.github.io/TensorRT-LLM/<release>/llm-api/reference/DFlashDecodingConfig.html).
_SINCE = {"attention_backend=FA4": "1.3.0rc27", "draft_len_schedule": "1.3.0rc27", "max_concurrency": "1.3.0rc27",
          "use_rejection_sampling": "1.3.0rc27", "context_recompute_tail": "1.4.0rc1"}
_RELEASES = ("1.3.0rc15", "1.3.0rc27", "1.4.0rc1")   # in order

# ---- the schema: field -> kind. A kind is a type tag, a tuple of allowed literals, or a nested schema. --------
MOE_BACKENDS = ("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA",
                "TRITON", "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL")
DFLASH_DECODING_CONFIG = {
    "decoding_type": ("DFlash",),
    "speculative_model": "str",
    "max_draft_len": "int>=0",
    "target_layer_ids": "list[int]",
    "mask_token_id": "int>=0",
    "attention_backend": ("VANILLA", "TRTLLM", "FA4"),
    "moe_backend": MOE_BACKENDS,              # the drafter's MoE layers (ours are dense: never written)
    "max_concurrency": "int>0",
    "draft_len_schedule": "dict[int,int]",
    "use_rejection_sampling": "bool",
    "spec_dec_variant": "int>0",              # DFlash 2 drafters (PR #18155); ours are DFlash 1: never written
    "context_recompute_tail": "int>=0",
}
TORCH_LLM_ARGS = {
    "tensor_parallel_size": "int>0",
    "moe_expert_parallel_size": "int>0",
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "enable_attention_dp": "bool",
    "max_batch_size": "int>0",
    "max_num_tokens": "int>0",
    "max_seq_len": "int>0",
    "trust_remote_code": "bool",
    "attn_backend": ("TRTLLM",),    # TorchLlmArgs allows more; DFlash's docs ask for TRTLLM target attention
    "kv_cache_config": {"free_gpu_memory_fraction": "fraction", "enable_block_reuse": "bool"},
    "cuda_graph_config": {"enable_padding": "bool", "max_batch_size": "int>=0"},
    "moe_config": {"backend": MOE_BACKENDS},
    "speculative_config": DFLASH_DECODING_CONFIG,
}
# Without these TensorRT-LLM picks for itself (max_seq_len from the model, the drafter's ids only for a local
# folder), so we always write them.
REQUIRED = ("tensor_parallel_size", "max_batch_size", "max_seq_len", "attn_backend", "speculative_config")
REQUIRED_SPEC = ("decoding_type", "speculative_model", "max_draft_len", "target_layer_ids", "mask_token_id",
                 "attention_backend")


def _kind_ok(kind, value) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(kind, tuple):
        return value in kind
    return {"str": lambda: isinstance(value, str),
            "bool": lambda: isinstance(value, bool),
            "int>=0": lambda: is_int and value >= 0,
            "int>0": lambda: is_int and value > 0,
            "fraction": lambda: isinstance(value, float) and 0.0 < value < 1.0,
            "list[int]": lambda: isinstance(value, list) and all(isinstance(v, int) for v in value),
            "dict[int,int]": lambda: isinstance(value, dict) and all(
                isinstance(k, int) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()),
            }[kind]()


def check_options(options: dict, schema: dict = TORCH_LLM_ARGS, where: str = "") -> None:
    """Raise DFlashError naming the first field TensorRT-LLM would refuse (unknown, mistyped, or against a
    DFlash rule from its docs). ``options`` is the YAML mapping, without ``model``."""
    if not isinstance(options, dict):
        raise DFlashError(where.rstrip(".") or OPTIONS_FILE, "must be a mapping", "rebuild with dflash-build")
    for key, value in options.items():
        field = f"{where}{key}"
        if key not in schema:
            raise DFlashError(field, f"is not a TensorRT-LLM {SCHEMA_VERSION} field we know",
                              f"remove it, or use one of {', '.join(schema)}")
        kind = schema[key]
        if isinstance(kind, dict):
            check_options(value, kind, f"{field}.")
        elif not _kind_ok(kind, value):
            want = f"one of {', '.join(map(str, kind))}" if isinstance(kind, tuple) else kind
            raise DFlashError(field, f"is {value!r}, not {want}", f"write {field} as {want}")
    if schema is TORCH_LLM_ARGS:
        for key in REQUIRED:
            if key not in options:
                raise DFlashError(key, "missing", "rebuild with dflash-build (it always writes it)")
        _check_dflash(options["speculative_config"])


def _check_dflash(spec: dict) -> None:
    for key in REQUIRED_SPEC:
        if key not in spec:
            raise DFlashError(f"speculative_config.{key}", "missing", "rebuild with dflash-build")
    draft = spec["max_draft_len"]
    if draft < 1:
        raise DFlashError("speculative_config.max_draft_len", f"is {draft}; DFlash drafts at least one token",
                          "use 1 <= max_draft_len <= the drafter's block_size - 1")
    schedule = spec.get("draft_len_schedule")
    if schedule is not None:
        check_schedule(schedule, draft, field="speculative_config.draft_len_schedule")
        if spec.get("max_concurrency") is not None:
            # DecodingBaseConfig refuses both (it turns max_concurrency into {max_concurrency: max_draft_len})
            raise DFlashError("speculative_config.max_concurrency", "and draft_len_schedule are mutually exclusive "
                              "in TensorRT-LLM", "drop max_concurrency: batch sizes above the schedule's largest "
                              "key already draft 0")


# ---- draft_len_schedule: TensorRT-LLM's reading of it, and our per-batch draft lengths written in it ----------
# Source: NVIDIA/TensorRT-LLM PR #10860 (merged 2026-03-13, "Dynamic draft length on spec decode one-model path";
# DFlash joined with PR #12262, so every release with DFlash's draft_len_schedule reads it this way, 1.4.0rc1
# included): ``tensorrt_llm/_torch/speculative/utils.py: get_draft_len_for_batch_size`` takes the first key >=
# the batch size (bisect_left) and drafts 0 above the largest key; ``DecodingBaseConfig``'s validator wants keys
# >= 1, lengths in 0..max_draft_len and the smallest key mapped to max_draft_len. Its example: {4: 4, 8: 2,
# 32: 1} = batches 1-4 draft 4, 5-8 draft 2, 9-32 draft 1, 33+ draft 0. (The first version, PR #8194, read keys
# as lower bounds, {batch size >= k: length}, and required key 1; we always write key 1, which both accept.)
def draft_len_for_batch(schedule: dict[int, int] | None, batch_size: int, max_draft_len: int) -> int:
    """The draft length TensorRT-LLM runs at ``batch_size`` under ``schedule`` (its rule, above)."""
    if schedule is None:
        return max_draft_len
    for key in sorted(schedule):
        if key >= batch_size:
            return schedule[key]
    return 0


def schedule_line(schedule: dict[int, int] | None, source: str) -> str:
    """The schedule and where it came from; without one its reason alone (it printed a bare ``-:`` before it)."""
    return f"draft_len_schedule {schedule}: {source}" if schedule else f"draft_len_schedule {source}"


def schedule_from_lengths(lengths: list[int], max_draft_len: int) -> tuple[dict[int, int], bool]:
    """lengths[n - 1] = the draft length wanted at batch size n (n = 1..len(lengths)) -> (the draft_len_schedule
    TensorRT-LLM runs exactly so at every one of those batch sizes, whether batch 1 had to be raised to
    max_draft_len: TensorRT-LLM requires that there). Keys: 1, then the last batch size of each run of equal
    lengths; a final run of zeros is left implicit (above the largest key TensorRT-LLM drafts 0)."""
    want = [max_draft_len, *lengths[1:]]
    schedule = {1: max_draft_len}
    for n in range(2, len(want) + 1):
        if n == len(want) or want[n] != want[n - 1]:
            schedule[n] = want[n - 1]
    while len(schedule) > 1 and schedule[max(schedule)] == 0:
        del schedule[max(schedule)]
    return schedule, lengths[0] != max_draft_len


def check_schedule(schedule: dict, max_draft_len: int, *, field: str = "draft_len_schedule",
                   max_batch_size: int | None = None) -> None:
    """TensorRT-LLM's rules for ``draft_len_schedule`` (read as above: {batch sizes up to k: draft length},
    none above the largest key): every length within 0..max_draft_len, the smallest key mapped to max_draft_len;
    ours on top: it starts at key 1 (accepted by every release), lengths never grow with load, keys stay within
    max_batch_size."""
    if schedule.get(1) != max_draft_len:
        raise DFlashError(field, f"must map batch size 1 to max_draft_len {max_draft_len}, got {schedule}",
                          f"start it with 1:{max_draft_len}")
    for size, length in schedule.items():
        if size < 1 or not 0 <= length <= max_draft_len:
            raise DFlashError(field, f"{size}:{length} is out of range",
                              f"use batch sizes >= 1 and draft lengths 0..{max_draft_len}")
        if max_batch_size is not None and size > max_batch_size:
            raise DFlashError(field, f"batch size {size} exceeds max_batch_size {max_batch_size} (never reached)",
                              f"use batch sizes <= {max_batch_size}")
    lengths = [schedule[k] for k in sorted(schedule)]
    if lengths != sorted(lengths, reverse=True):
        # More load, never a longer draft: verify compute grows with batch x draft length.
        raise DFlashError(field, f"draft lengths must not grow with batch size, got {schedule}",
                          "order the lengths from long (batch 1) to short")


def min_version(options: dict) -> str:
    """The oldest TensorRT-LLM release that has every field ``options`` uses."""
    spec = options.get("speculative_config", {})
    used = {key for key in _SINCE if key in spec}
    if spec.get("attention_backend") == "FA4":
        used.add("attention_backend=FA4")
    return max([MIN_VERSION, *(_SINCE[k] for k in used)], key=_RELEASES.index)


def version_range(options: dict) -> str:
    return f">={min_version(options)},<{BELOW_VERSION}"


def llm_api_options(*, tp_size: int, ep_size: int | None, dtype: str, max_batch_size: int, max_num_tokens: int,
                    max_seq_len: int, free_gpu_memory_fraction: float, trust_remote_code: bool,
                    moe_backend: str | None, speculative_model: str, max_draft_len: int,
                    target_layer_ids: list[int], mask_token_id: int, attention_backend: str,
                    draft_len_schedule: dict[int, int] | None = None, max_concurrency: int | None = None,
                    use_rejection_sampling: bool = False, context_recompute_tail: int | None = None) -> dict:
    """The TorchLlmArgs mapping for a DFlash deployment (``model`` is passed separately).

    ``context_recompute_tail`` given = prefix-cache block reuse on: a cache hit skips the target forward that
    produces the hidden states the drafter reads, so TensorRT-LLM recomputes at least that many prompt tokens."""
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
        # Block reuse only with a recompute tail (TensorRT-LLM's DFlash tests run without reuse).
        "kv_cache_config": {"free_gpu_memory_fraction": free_gpu_memory_fraction,
                            "enable_block_reuse": context_recompute_tail is not None},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": max_batch_size},
    })
    if moe_backend is not None:
        opts["moe_config"] = {"backend": moe_backend}
    spec = {
        "decoding_type": "DFlash",
        "speculative_model": speculative_model,
        "max_draft_len": max_draft_len,
        # Set both explicitly: TensorRT-LLM auto-fills them only for a local drafter folder.
        "target_layer_ids": list(target_layer_ids),
        "mask_token_id": mask_token_id,
        "attention_backend": attention_backend,
    }
    if draft_len_schedule is not None:
        spec["draft_len_schedule"] = {int(k): int(v) for k, v in sorted(draft_len_schedule.items())}
    if max_concurrency is not None:
        spec["max_concurrency"] = max_concurrency
    if use_rejection_sampling:
        spec["use_rejection_sampling"] = True
    if context_recompute_tail is not None:
        spec["context_recompute_tail"] = context_recompute_tail
    opts["speculative_config"] = spec
    check_options(opts)
    return opts


def dump_options(options: dict, quant: str | None = None) -> str:
    header = (f"# TorchLlmArgs for TensorRT-LLM {version_range(options)} (PyTorch backend; schema of {SCHEMA_VERSION}),"
              " written by dflash-build.\n"
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
    check_options(options)
    options["speculative_config"]["speculative_model"] = str(directory / "drafter")
    return options


def llm_kwargs(deployment, **overrides) -> tuple[object, dict]:
    """(tensorrt_llm module, LLM keyword arguments) for a deployment (a ``Deployment`` or its directory), merged the way trtllm-serve
    merges ``--extra_llm_api_options`` (``update_llm_args_with_extra_dict``), checked against the schema."""
    try:
        import tensorrt_llm
        from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict
    except ImportError as err:
        raise DFlashError("backend", f"trtllm needs TensorRT-LLM >={MIN_VERSION},<{BELOW_VERSION}, which is not "
                          f"importable ({err})", "run inside an NGC TensorRT-LLM container (or NGC's "
                          "tritonserver:<yy.mm>-trtllm-python-py3 image), or rebuild with --backend torch") from None
    from .deployment import Deployment

    deployment = Deployment.of(deployment)
    deployment.require_backend("trtllm", "TensorRT-LLM", "rebuild it with dflash-build --backend trtllm")
    directory = deployment.path.resolve()
    options = {**read_options(directory), **overrides}
    check_options(options)
    return tensorrt_llm, update_llm_args_with_extra_dict({"model": str(directory / "target"), "backend": "pytorch"},
                                                         options)


def load_llm(deployment, **overrides):
    """``tensorrt_llm.LLM`` for a deployment (a ``Deployment`` or its directory), configured exactly as
    trtllm-serve would be."""
    tensorrt_llm, kwargs = llm_kwargs(deployment, **overrides)
    return tensorrt_llm.LLM(**kwargs)
