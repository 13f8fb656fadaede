# SPDX-License-Identifier: Apache-2.0
"""Compile runtime/mxfp4_moe.py's kernels for an H100 (sm_90) without a GPU: Triton's front end, its MLIR passes
and the bundled ptxas all run on the CPU, so a kernel that would fail to compile on the GPU host fails here
(Triton 3.6 has refused some tile shapes of code the interpreter runs). Prints one JSON line per kernel with
its registers and spill stack (cuobjdump) for the occupancy a tile config gets.

Argument types and the 16-divisibility hints are the ones the JIT specialises on at gpt-oss shapes (hidden and
intermediate 2880, rows of 1440 bytes). Run in its own process: TRITON_INTERPRET must be unset.

  python tests/runtime/mxfp4_sm90_compile.py tc:16:64:128:4 gemv:16:32:256:4 mma:16:64:128:4 swap:16:64:128:4

``--loop`` (gemv configs): the SASS instructions each thread issues per K step of the gemv kernels' K loops, and
per weight value it decodes there: the one-pair loop (1 token), and the many-pair loop's step and its loop over a
slot's rows (per further token); with the registers per thread. An SM issues 4
warp instructions per clock, so at H100 clocks (132 SMs, ~1.75 GHz) N instructions per value cap the weights a
kernel can stream at ~29.6e12 / N values/s, 2 values per byte: the integer decode's share of the bandwidth limit,
read without a GPU.
"""
from __future__ import annotations

import collections
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from trtllm_dflash.runtime import mxfp4_moe as M  # noqa: E402

TYPES = {  # argument name -> Triton type, for every kernel (the rest are i32)
    "x_ptr": "*bf16", "ids_ptr": "*i64", "w_ptr": "*u8", "s_ptr": "*u8", "b_ptr": "*bf16", "act_ptr": "*bf16",
    "part_ptr": "*fp32", "cnt_ptr": "*i32", "rw_ptr": "*fp32", "out_ptr": "*bf16", "y_ptr": "*fp32",
    "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "num_blocks_ptr": "*i32", "limit": "fp32", "alpha": "fp32"}
DIV16 = {"K", "I", "H", "stride_xm", "stride_we", "stride_wn", "stride_se", "stride_be"}


# the gemv path's act buffer is float32 (fused_experts allocates it so: the down kernel FMAs it as it is); tc's
# is bf16 (the down kernel's MMA operand)
KERNEL_TYPES = {"_gemv_down_kernel": {"act_ptr": "*fp32"}, "_gemv_gate_up_kernel": {"act_ptr": "*fp32"}}


def _cubin(kernel, consts: dict, num_warps: int, num_stages: int = 4) -> bytes:
    types = {**TYPES, **({} if consts.get("TC") else KERNEL_TYPES.get(kernel.__name__, {}))}
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in kernel.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n].startswith("*") or n in DIV16}
    return triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages}).asm["cubin"]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """What Triton's bundled cuobjdump prints for a cubin (``-sass``, ``--dump-resource-usage``)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mxfp4_sm90_{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return subprocess.run([str(tool), flag, str(path)], capture_output=True, text=True).stdout
    finally:
        path.unlink()


def loops(cubin: bytes) -> list[tuple[int, int]]:
    """Each loop of the kernel's SASS as (first, last) instruction address (a backward branch's span)."""
    sass = cuobjdump(cubin, "-sass")
    spans = []
    for addr, target in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA[^;]*?0x([0-9a-f]+)", sass):
        a, t = int(addr, 16), int(target, 16)
        if t < a:
            spans.append((t, a))
    return spans


def opcodes(cubin: bytes, span: tuple[int, int]) -> dict[str, int]:
    """How many SASS instructions of each opcode (FFMA, LDG, BAR, ...) the loop at ``span`` holds, most first: where
    a K step's instructions go (the decode's integer ops, the conversions, the FMAs, a shared-memory round trip)."""
    ops = collections.Counter()
    for addr, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", cuobjdump(cubin, "-sass")):
        if span[0] <= int(addr, 16) <= span[1]:
            ops[re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()[0].split(".")[0]] += 1
    return dict(ops.most_common())


def size(span: tuple[int, int]) -> int:
    return (span[1] - span[0]) // 16 + 1          # one SASS instruction per 16 bytes on sm_90


def gemv_loops(spans: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(one-pair K loop, many-pair K loop, its per-row loop) in instructions. _gemv_k_loop compiles to two K
    loops side by side: the one-pair path's holds no loop, the other holds the loop over an expert's pairs."""
    inside = lambda s, o: o != s and o[0] <= s[0] and s[1] <= o[1]  # noqa: E731
    outer = [s for s in spans if not any(inside(s, o) for o in spans)]
    many = next(s for s in outer if any(inside(i, s) for i in spans))
    one = next(s for s in outer if s != many and not any(inside(i, s) for i in spans))   # absent: the layout changed
    row = max((i for i in spans if inside(i, many)), key=size)
    return size(one), size(many), size(row)


def gemv_kernels(bm: int, bn: int, bk: int, tc: bool, mma_from: int = 0, split: dict | None = None):
    """The gemv kernels as _gemv_experts launches them: [(kernel, constexprs, weight rows a program reads)];
    ``split``: {"split": 1} for an unsplit build, {} for the runtime split."""
    common = {"BM": bm, "BN": bn, "BK": bk, "EB": 128, "PB": bm * 4, "ASM": True, "MMA_FROM": mma_from,
              "CDT": tl.bfloat16, "TC": tc, **({"split": 1} if split is None else split)}
    return [(M._gemv_gate_up_kernel, common, 2 * bn),
            (M._gemv_down_kernel, {**common, "TOPK": 4, "HAS_BIAS": True, "TB": bm}, bn)]


def registers(cubin: bytes) -> int:
    return int(cuobjdump(cubin, "--dump-resource-usage").split("REG:")[1].split()[0])


def loop_cost(spec: str) -> list[dict]:
    """--loop: per gemv kernel, the instructions per thread of its K-step loops and per weight value in them: the
    one-pair path (1 token, or any expert with one pair), and the many-pair path's K step and per-row cost; for a
    tc spec its K-step loop (the kernel's largest: tc has no per-row loop), any pair count up to block_m alike
    (the MMA's N side)."""
    variant, bm, bn, bk, warps = (int(v) if v.isdigit() else v for v in spec.split(":"))
    tc = variant == "tc"
    rows = []
    for kernel, consts, weight_rows in gemv_kernels(bm, bn, bk, tc):
        cubin = _cubin(kernel, consts, warps, 3 if tc else 4)
        regs = registers(cubin)
        values = weight_rows * bk / (32 * warps)          # weight values a thread decodes per K step
        # 64K registers per SM: how many of these programs fit on one SM at a time
        occupancy = {"registers_per_thread": regs, "programs_per_sm_by_registers": 65536 // (regs * 32 * warps)}
        if tc:
            step = max(size(s) for s in loops(cubin))
            rows.append({"config": spec, "kernel": kernel.__name__, "loop_instructions": step,
                         "weight_values_per_thread": values, "instructions_per_value": round(step / values, 2),
                         "mma_instructions": len(re.findall(r"\bHG?MMA\.", cuobjdump(cubin, "-sass"))),  # wgmma, mma.sync
                         **occupancy})
            continue
        spans = loops(cubin)
        one, many, per_row = gemv_loops(spans)
        rows.append({"config": spec, "kernel": kernel.__name__, "loop_instructions_1_token": one,
                     "many_pair_loop_instructions": many,   # its K step with one pass of the row loop
                     "row_loop_instructions": per_row, "weight_values_per_thread": values,
                     "instructions_per_value_1_token": round(one / values, 2),
                     "instructions_per_value_per_more_token": round(per_row / values, 2),
                     "h100_issue_bound_tb_per_s_1_token": round(29.6e12 / (one / values) / 2 / 1e12, 2),
                     "opcodes_1_token": opcodes(cubin, next(s for s in spans if size(s) == one)),
                     **occupancy})
    return rows


def compile_sm90(kernel, consts: dict, num_warps: int, num_stages: int = 4) -> dict:
    usage = cuobjdump(_cubin(kernel, consts, num_warps, num_stages), "--dump-resource-usage")
    line = next((u for u in usage.splitlines() if "REG:" in u), "")
    field = lambda key: int(line.split(key + ":")[1].split()[0]) if key + ":" in line else None  # noqa: E731
    return {"kernel": kernel.__name__, "regs": field("REG"), "stack": field("STACK")}


def configs(spec: str):
    """variant:block_m:block_n:block_k:num_warps[:mmaN] -> [(kernel, constexprs, num_warps)] as fused_experts
    launches them (gemv / tc: split 1 and a runtime split, ``mmaN``: TileConfig.mma_from = N; mma / swap: split 1
    and 2, dot_scaled both ways)."""
    variant, bm, bn, bk, warps, *hybrid = spec.split(":")
    bm, bn, bk, warps = int(bm), int(bn), int(bk), int(warps)
    if variant in ("gemv", "tc"):
        # mmaN: experts with N+ pairs on tc's tensor-core step (bf16 operands, as on CUDA); 0 as fused_experts
        # passes it by default (a constexpr: left out, the signature would make it a runtime i32). tc with the 3
        # stages it was measured with
        for split in ({"split": 1}, {}):
            for kernel, consts, _ in gemv_kernels(bm, bn, bk, variant == "tc",
                                                  int(hybrid[0].removeprefix("mma")) if hybrid else 0, split):
                yield kernel, consts, warps, 3 if variant == "tc" else 4
        return
    mode = M.VARIANTS.index(variant)
    for ds in (True, False):
        for split in (1, 2):
            common = {"BM": bm, "BN": bn, "BK": bk, "MODE": mode, "DOT_SCALED": ds, "SPLIT": split, "CDT": tl.bfloat16}
            yield M._gate_up_kernel, common, warps
            yield M._down_kernel, {**common, "HAS_BIAS": True}, warps
    yield M._swiglu_kernel, {"BM": bm, "BN": bn, "SPLIT": 2}, 4
    yield M._combine_kernel, {"TOPK": 4, "HAS_BIAS": True, "TB": 4, "BN": 256, "SPLIT": 2}, 4
    yield M._route_kernel, {"BM": bm, "EB": 128, "CP": 64}, 4


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles for the GPU")
    if sys.argv[1:2] == ["--loop"]:
        # --loop SPEC... [--out FILE]: the rows on stdout, and with their provenance in FILE
        args, out = sys.argv[2:], None
        if "--out" in args:
            out = Path(args[args.index("--out") + 1])
            args = args[:args.index("--out")] + args[args.index("--out") + 2:]
        rows = [row for spec in args for row in loop_cost(spec)]
        for row in rows:
            print(json.dumps(row), flush=True)
        if out is not None:
            from trtllm_dflash.provenance import record
            out.write_text(json.dumps({"what": "SASS instructions per weight value in the MXFP4 gemv / tc kernels' loops, "
                                               "compiled for sm_90 on the CPU (Triton's bundled ptxas, cuobjdump)",
                                       "triton": triton.__version__, "rows": rows,
                                       "provenance": record(["mxfp4_sm90_compile.py", *sys.argv[1:]])}, indent=1) + "\n")
        raise SystemExit(0)
    for spec in sys.argv[1:]:
        for kernel, consts, warps, *stages in configs(spec):
            print(json.dumps({"config": spec, **compile_sm90(kernel, consts, warps, *stages),
                              "constexprs": {k: str(v) for k, v in consts.items()}}), flush=True)
