# SPDX-License-Identifier: Apache-2.0
"""dflash-bench: the measurement tools by short name; each is also ``python -m trtllm_dflash.bench.<module>``.

    dflash-bench                       # the list of tools
    dflash-bench step --models smollm2-135m --batch 1,64
    dflash-bench soak --deployment_dir out/smollm2 --streams 64 --duration 600 --sigterm
"""
from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

# short name -> module under trtllm_dflash.bench (the modules' own names where they are already short)
TOOLS = {
    "step": "step", "load": "load", "soak": "soak", "acceptance": "acceptance", "acceptance_compare": "acceptance_compare",
    "quant_report": "quant_report",
    "cuda_check": "cuda_check", "tp": "tp", "tp_allreduce": "tp_allreduce", "serving_overhead": "serving_overhead",
    "guard_overhead": "guard_overhead", "aiperf_openai": "aiperf_openai", "gemm": "gemm", "fp8_gemm": "fp8_gemm",
    "sample": "sample", "mxfp4": "mxfp4", "mxfp4_probe": "mxfp4_probe", "gpt_oss_kernels": "gpt_oss_kernels", "gpt_oss_step": "gpt_oss_step",
    "gpt_oss_tp": "gpt_oss_tp", "layer_op_counts": "layer_op_counts", "draft_policy_tables": "draft_policy_tables",
    "cpu_generate_parity": "cpu_generate_parity", "gpu_tests": "gpu_tests", "gpu_test_report": "gpu_test_report",
    "e2e_summary": "e2e_summary", "sweep2_summary": "sweep2_summary", "bit_exact_summary": "bit_exact_summary",
    "tp_scaling": "tp_scaling", "resume": "resume", "train_step": "train_step", "triton_send_rate": "triton_send_rate",
    "quickstart_repeat": "quickstart_repeat", "random_pair": "random_pair", "tp_sweep_summary": "tp_sweep_summary",
    "client_capacity": "client_capacity", "drafter_scaling": "drafter_scaling",
}


def summary(module: str) -> str:
    """The first line of a tool's docstring, read without importing it (some import torch or CUDA)."""
    doc = ast.get_docstring(ast.parse((Path(__file__).parent / f"{module}.py").read_text())) or ""
    return doc.split("\n")[0]


def _clip(text: str, room: int) -> str:
    return text if len(text) <= room else text[:room - 3].rstrip() + "..."


def usage() -> str:
    width = max(map(len, TOOLS))
    room = 118 - width - 2        # one terminal line per tool
    lines = [f"  {name:<{width}}  {_clip(summary(module), room)}" for name, module in TOOLS.items()]
    return ("usage: dflash-bench TOOL [flags...]   (dflash-bench TOOL --help: the tool's flags)\n\ntools:\n"
            + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"error: dflash-bench has no tool {name!r}. Fix: one of {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    module = f"trtllm_dflash.bench.{TOOLS[name]}"
    sys.argv = [module, *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:       # the tools end with sys.exit(main())
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
