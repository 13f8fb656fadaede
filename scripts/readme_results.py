# SPDX-License-Identifier: Apache-2.0
"""Render the README's measured sections from the files in benchmarks/results/.

Each block of the README between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` is the output of
``RENDERERS[NAME](results_dir)``: a figure in the README is a figure in a committed results file, and
``--check`` (run by tests/test_readme_results.py in CI) fails when the two disagree.

Only a file that records the commit that made it, a commit in this repository's history, is quoted: a block
whose file does not is rendered as one sentence saying its figures await a re-measurement with provenance, and
``--check`` fails when the README's own text names a ``benchmarks/results/`` file (or folder) that does not.
Deciding needs the git history: in a shallow clone or a copy without .git the script stops and says so.

    python scripts/readme_results.py            # rewrite the blocks in README.md
    python scripts/readme_results.py --check    # exit 1 and print a diff when a block is stale

To add a figure: write a ``render_NAME(results: Path) -> str`` below, register it in RENDERERS, and put the
empty pair of markers where it belongs in the README; the first run fills it.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import functools
import json
import re
import statistics
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the runs that made each SmolLM2 drafter shipped so far, newest last (the shipped one); their summaries name the
# shipped file's sha256
DRAFTER_RUNS = {"v2": "train_smollm2_10x_h200", "v3": "train_smollm2_v3_h200x4", "v4": "train_smollm2_v4_h200x4",
                "v5": "train_smollm2_v5_h200x2", "v6": "train_smollm2_v6_h200x4", "v8": "average_smollm2_v8_h200",
                "v9": "train_smollm2_v9_h200x4"}
DRAFTER_RUN = list(DRAFTER_RUNS.values())[-1]
# Results files record the command that made them; the scripts they name have since become modules of the package.
MOVED = {"step_bench": "step", "engine_load": "load", "gemm_bench": "gemm", "fp8_gemm_bench": "fp8_gemm",
         "sample_bench": "sample", "mxfp4_bench": "mxfp4", "gpt_oss_kernels_bench": "gpt_oss_kernels", "tp_bench": "tp"}


def as_run_now(command: str) -> str:
    """A recorded command as it is typed today: ``python benchmarks/x.py`` -> ``python -m trtllm_dflash.bench.x``."""
    return re.sub(r"(?:(python3?) )?benchmarks/(\w+)\.py",
                  lambda m: f"{m.group(1) or 'python'} -m trtllm_dflash.bench.{MOVED.get(m.group(2), m.group(2))}",
                  command)
BLOCK = re.compile(r"(<!-- results:(?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


SHA = re.compile(r"[0-9a-f]{7,40}(-dirty)?")
QUOTE = re.compile(r"benchmarks/results/([A-Za-z0-9_.\-/]*[A-Za-z0-9_\-/])")


class NoCommit(Exception):
    """A results file the README must not quote: it records no commit of this repository's history."""

    def __init__(self, name: str, why: str):
        super().__init__(f"benchmarks/results/{name} {why}")
        self.name, self.why = name, why


class HistoryUnavailable(Exception):
    """git cannot tell whether a commit is in the history (shallow clone, or no .git)."""


def _git(root: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


@functools.lru_cache(maxsize=None)
def _is_shallow(root: Path) -> bool:
    """Whether the checkout at ``root`` is a shallow clone: asked once per checkout, not once per commit."""
    shallow = _git(root, "rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        raise HistoryUnavailable(f"{root} is not a git checkout; run this script in a clone with its history")
    return shallow.stdout.strip() == "true"


@functools.lru_cache(maxsize=None)
def in_history(sha: str, root: Path = ROOT) -> bool:
    """Whether commit ``sha`` is HEAD or one of its ancestors (a commit only in another branch, or rebased away,
    is not: the code it names is not what this checkout's history holds)."""
    shallow = _is_shallow(root)
    if _git(root, "merge-base", "--is-ancestor", sha, "HEAD").returncode == 0:
        return True
    if shallow:
        raise HistoryUnavailable(f"this clone is shallow, so commit {sha[:10]} may lie beyond it: run "
                                 "git fetch --unshallow, then again")
    return False


def recorded_commits(data) -> list[str]:
    """Every commit a results file names for the code that made it: ``git_sha`` keys, and ``git`` keys holding a
    SHA or a provenance record's ``{"sha": ...}``, at any depth (a JSONL file is the list of its rows)."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("git_sha", "git") and isinstance(value, str):
                found.append(value)
            elif key == "git" and isinstance(value, dict) and isinstance(value.get("sha"), str):
                found.append(value["sha"])
            else:
                found += recorded_commits(value)
    elif isinstance(data, list):
        for value in data:
            found += recorded_commits(value)
    return found


def commit_problem(data) -> str | None:
    """None when the file records at least one commit and every commit it records is in the history; else why not."""
    shas = sorted(set(recorded_commits(data)))
    if not shas:
        return "records no commit"
    for sha in shas:
        if not SHA.fullmatch(sha):
            return f"records {sha!r}, not a commit SHA"
        if not in_history(sha.removesuffix("-dirty")):
            return f"records commit {sha[:10]}, which is not in this repository's history"
    return None


def _checked(name: str, data):
    why = commit_problem(data)
    if why:
        raise NoCommit(name, why)
    return data


def _read(results: Path, name: str):
    """A results file's JSON (a .jsonl file: the list of its rows; .json.gz: gzipped, for the large reports)."""
    if name.endswith(".json.gz"):
        import gzip
        return json.loads(gzip.decompress((results / name).read_bytes()))
    text = (results / name).read_text()
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _load(results: Path, name: str):
    """A results file's JSON, refused (NoCommit) when it records no commit of the history."""
    return _checked(name, _read(results, name))


def owners(results: Path, quoted: str) -> list[str]:
    """The JSON files that give a quoted results path its provenance: the file itself; for a folder or a file in
    one (a plot, a table), the run file beside the folder (``D.jsonl`` / ``D.json``) or else the JSON files in it."""
    path = results / quoted
    if path.suffix in (".json", ".jsonl") or quoted.endswith(".json.gz"):
        return [quoted]
    top = quoted.split("/")[0]
    if (results / top).is_file():       # a plot beside its run file: X.png -> X.json
        top = Path(top).stem
    beside = [f"{top}{ext}" for ext in (".jsonl", ".json") if (results / f"{top}{ext}").is_file()]
    inside = sorted(str(f.relative_to(results)) for pattern in ("*.json", "*.json.gz")
                    for f in (results / top).glob(pattern))
    return beside[:1] or inside


def quote_problems(text: str, results: Path) -> list[str]:
    """Every ``benchmarks/results/...`` path the README names (a block renders a refused file by its bare name)
    must exist and record a commit of the history."""
    problems = []
    for quoted in sorted(set(QUOTE.findall(text))):
        if not (results / quoted).exists():
            problems.append(f"the README names benchmarks/results/{quoted}, which does not exist")
            continue
        names = owners(results, quoted)
        if not names:
            problems.append(f"the README quotes benchmarks/results/{quoted}, and no JSON file beside or in it records "
                            "the commit that made it")
        for name in names:
            why = commit_problem(_read(results, name))
            if why:
                problems.append(f"the README quotes benchmarks/results/{quoted}, but benchmarks/results/{name} {why}: "
                                "re-measure it, or stop quoting it")
    return problems


def _legacy_note(sha: str) -> str:
    """A file that records only its versions' git_sha (no provenance record): the SHA, said to be all there is."""
    return f"legacy: git {sha[:10]}{'-dirty' if sha.endswith('-dirty') else ''} only"


def provenance_note(data: dict, name: str) -> str:
    """Where the figures came from: the file, and its git SHA from the provenance record, or an honest
    'legacy' note for a file that has only its versions' git_sha (a file with no SHA at all is refused)."""
    prov = data.get("provenance")
    if data.get("git_sha"):   # the commit whose code ran, on main; a note says when it was reconstructed
        fixed = " (commit reconstructed after the run: see the file's git_sha_note)" if data.get("git_sha_note") else ""
        return f"`benchmarks/results/{name}`, git {data['git_sha'][:10]}{fixed}"
    if prov:
        git = prov.get("git") or {}
        sha = (git.get("sha") or "unknown")[:10]
        dirty = f", dirty tree, diff sha256 {git['diff_sha256'][:10]}" if git.get("dirty") else ""
        return f"`benchmarks/results/{name}`, git {sha}{dirty}"
    sha = (data.get("versions") or {}).get("git_sha") if isinstance(data.get("versions"), dict) else None
    if sha:
        return f"`benchmarks/results/{name}`, {_legacy_note(sha)}"
    raise NoCommit(name, "records no commit")


def commit_of(data: dict, name: str) -> str:
    """provenance_note without the file: the commit, and the dirty tree's diff where it was dirty."""
    return provenance_note(data, name).split(", ", 1)[1]


def _ms(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _table_head(*columns: str) -> list[str]:
    """A markdown table's header row and its separator."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _step_rows(data: dict, model: str) -> dict[tuple[str, int], dict]:
    return {(r["mode"], r["batch"]): r for r in data["rows"] if r["model"] == model}


# ---------------------------------------------------------------------------------------------- blocks

def render_headline(results: Path) -> str:
    """The README's opening table: the drafter's acceptance, DFlash against AR end to end, how the drafter was made,
    the gpt-oss step.

    Each row is read on its own: a row whose file records no commit says so in its cells, the others still show."""
    rows = []

    def row(what: str, make) -> None:
        try:
            figure, source = make()
        except NoCommit as e:
            figure, source = "awaits a re-measurement with provenance", f"`{e.name}` {e.why}"
        rows.append(f"| {what} | {figure} | {source} |")

    def tau():
        d, name = _load(results, "acceptance_smollm2.json"), DRAFTER_RUN + "/summary.json"
        prev = list(DRAFTER_RUNS)[-2]   # the drafter the shipped one replaced
        before = _load(results, f"acceptance_smollm2_{prev}.json")
        return (f"{d['humaneval']['tau_greedy']:.2f} tokens per step (greedy, block {d['humaneval']['block_size']}; "
                f"MT-Bench {d['mtbench']['tau_greedy']:.2f}; the {prev} drafter, `acceptance_smollm2_{prev}.json`: "
                f"{before['humaneval']['tau_greedy']:.2f} / {before['mtbench']['tau_greedy']:.2f})",
                provenance_note(_load(results, name), name))

    def gpt_oss_triton_kernels():
        name, base = "gpt_oss_120b_step_triton_kernels_h200.json", \
            "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_h200.json"
        s, b = _load(results, name)["summary"], _load(results, base)["summary"]
        return (f"AR {_ms(s['ar_b1_step_ms'])} ms, DFlash {_ms(s['dflash_b1_step_ms'])} ms (block {s['block_size']}): "
                f"break-even {s['break_even_tokens_b1']:.1f} accepted tokens per step under uniform routing, "
                f"{s['break_even_tokens_b1_skewed']:.1f} under skewed (our kernels alone: "
                f"{b['break_even_tokens_b1']:.1f} / {b['break_even_tokens_b1_skewed']:.1f}, `{base.split('/')[-1]}`)",
                provenance_note(_load(results, name), name))

    def drafter_run():
        name = DRAFTER_RUN + "/summary.json"
        d = _load(results, name)
        if "parents" in d["checkpoints"]:   # a weighted mean of earlier drafters (training.average), not a run
            return average_made(d), provenance_note(d, name)
        a, r, t = d["acceptance"], d["regeneration"], d["train"]
        checks = sum(a[k]["ar_check"]["identical_outputs"] for k in a), sum(a[k]["ar_check"]["n_prompts"] for k in a)
        gpus = t.get("gpus", 1)
        per_gpu = f", {t['per_gpu_batch']} per GPU" if gpus > 1 else ""
        return (f"{r['prompts']:,} answers ({r['response_tokens'] / 1e6:.1f} M tokens, {r['data_vs_first_drafter']:.0f}x "
                f"v1's) regenerated by our engine at {r['tok_s']:,} tok/s"
                + (f" on {r['gpus']} GPUs ({r['tok_s_per_gpu'] / 1e3:.1f}k each)" if r.get("gpus", 1) > 1 else "")
                + f"; continued from {t['init']} for "
                f"{t['steps']:,} steps at batch {t['batch_size']}{per_gpu} ({t['epochs']:.2f} epochs, "
                f"{t['tokens'] / 1e6:.1f} M tokens) in {t['elapsed_s']:.0f} s ({t['tokens_per_s'] / 1e3:.0f}k tok/s); "
                f"DFlash == AR on {checks[0]} of {checks[1]} prompts (float32)", provenance_note(d, name))

    row("SmolLM2-135M + the shipped drafter: HumanEval acceptance (tau)", tau)
    def e2e(name):
        d = _load(results, name)
        lv, s = d["summary"]["levels"], d["summary"]
        cells = [f"{lv[f'humaneval_c{c}']['inprocess']['adaptive_over_ar']:.2f}x at concurrency {c} "
                 f"({lv[f'humaneval_c{c}']['inprocess']['ar']['tok_s_user']:,.0f} -> "
                 f"{lv[f'humaneval_c{c}']['inprocess']['adaptive']['tok_s_user']:,.0f})" for c in (1, 4, 64)]
        sets = " and ".join(label for key, label in (("humaneval", "HumanEval"), ("mtbench", "MT-Bench"))
                            if f"{key}_c1" in lv)
        return ("; ".join(cells) + f"; fixed block 16 {s['dflash_over_ar_tok_s_b1_humaneval']:.2f}x at 1; through "
                f"dflash-openai {s['adaptive_over_ar_tok_s_b1_humaneval_openai']:.2f}x at 1 (fixed block 16 "
                f"{s['dflash_over_ar_tok_s_b1_humaneval_openai']:.2f}x); never below AR at any concurrency (worst "
                f"{min(s['min_adaptive_over_ar_inprocess'], s['min_adaptive_over_ar_openai']):.2f}x, {sets})"), \
            provenance_note(d, name)

    # the shipped drafter's run (one H200); the v5 drafter's on the H100 has its own section further down
    e2e_name = E2E_H200
    d = _load(results, e2e_name)
    gpu = (rows_gpu(d["rows"]) or d["provenance"]["device"].get("gpu", "GPU")).replace("NVIDIA ", "").split()[0]
    row(f"SmolLM2-135M + {smollm2_drafter(results, d, 'drafter', e2e_name)}, one {gpu}, in-process, "
        "HumanEval: DFlash (adaptive policy) over AR, tokens/s per user", lambda: e2e(e2e_name))
    row(f"how the shipped drafter ({list(DRAFTER_RUNS)[-1]}) was made", drafter_run)
    row("gpt-oss-120b decode step at batch 1, one H200, `mxfp4_moe=\"triton_kernels\"` (our expert kernels at one "
        "token, vLLM's Triton MoE kernels for the verify block)", gpt_oss_triton_kernels)
    return "\n".join([*_table_head("measured", "figure", "source"), *rows]) + "\n"


def render_quickstart_tau(results: Path) -> str:
    """The shipped drafter's greedy acceptance on HumanEval and MT-Bench."""
    d, name = _load(results, "acceptance_smollm2.json"), DRAFTER_RUN + "/summary.json"
    he, mt = d["humaneval"], d["mtbench"]
    gpu = _load(results, "acceptance_smollm2.meta.json")["device"].replace("NVIDIA ", "").split()[0]
    return (f"Its greedy acceptance on all HumanEval and MT-Bench first turns is {he['tau_greedy']:.2f} tokens per step "
            f"on HumanEval and {mt['tau_greedy']:.2f} on MT-Bench (block {he['block_size']}, {gpu} bf16; "
            f"{provenance_note(_load(results, name), name)}).\n")


def render_quickstart_repeat(results: Path) -> str:
    """The quick start run nine times in a row, before and after the adaptive policy re-times close contenders."""
    name = "quickstart_repeat_cpu.json"
    d = _load(results, name)
    before, after = d["summary"], d["after_refresh"]["summary"]
    rounds = max(max(r["round_speedups"]) / min(r["round_speedups"]) for r in d["runs"] + d["after_refresh"]["runs"])

    def span(s):
        return (f"{s['min']:.2f}-{s['max']:.2f}x, median {statistics.median(s['printed_median_speedups']):.2f}x (any "
                f"three in a row within {100 * (s['worst_three_in_a_row_spread'] - 1):.0f}%)")
    text = (f"The quick start itself (with {smollm2_drafter(results, d, 'drafter', name)}), nine times in a row on "
            f"the same shared 2-core machine "
            f"({provenance_note(d, name)}): printed {span(before)}, the lowest run's policy left on block 16; after "
            f"the policy re-times a drafting block whose price it timed during a burst of load "
            f"(`runtime/draft_policy.py`, \"refresh\"), nine more: {span(after)}, none left on one block. What is "
            f"left of the spread is the machine's: within one run the five rounds' ratios differ by up to "
            f"{rounds:.1f}x.")
    g = _load(results, "quickstart_repeat_cpu_gap.json")
    stalls = {r["stalled_periods_left_out"] for r in g["stall_rule"]["runs"]}
    text += (f" Not all of it: every quick start's policy also priced steps at seconds, the AR round between two "
             f"DFlash rounds read as one step's period (`Engine.generate` returned with a step in flight). Left out as a "
             f"stall ({'/'.join(map(str, sorted(stalls)))} a run), five runs printed {span(g['stall_rule']['summary'])}; "
             f"with the cause gone, six more printed {span(g['gap_fixed']['summary'])}, DFlash == AR in "
             f"{g['gap_fixed']['summary']['runs_with_dflash_equal_ar']} of {len(g['gap_fixed']['runs'])} "
             f"(`benchmarks/results/quickstart_repeat_cpu_gap.json`, {commit_of(g, 'quickstart_repeat_cpu_gap.json')}).")
    for name in ("quickstart_repeat_cpu_v6.json", "quickstart_repeat_cpu_v8.json", "quickstart_repeat_cpu_v9.json"):
        # one run of five per drafter
        q = _load(results, name)
        text += (f" With {smollm2_drafter(results, q, 'drafter', name)}, {len(q['runs'])} quick starts in a row "
                 f"(`python -m trtllm_dflash.bench.quickstart_repeat --runs {len(q['runs'])}`; {provenance_note(q, name)}) "
                 f"printed {span(q['summary'])}, DFlash == AR in {q['summary']['runs_with_dflash_equal_ar']} of "
                 f"{len(q['runs'])}.")
        printed = q["summary"]["printed_median_speedups"]
        best = min(max(printed[i:i + 3]) / min(printed[i:i + 3]) for i in range(len(printed) - 2))
        text += (f" The best three in a row are within {100 * (best - 1):.0f}%; in {_first_round_lowest(q)} of the "
                 f"{len(q['runs'])} runs the first timed round has the lowest ratio.")
    text += " " + _quickstart_warmup(results)
    return "\n".join(textwrap.wrap(text + " " + _quickstart_dtype(results), 115)) + "\n"


def _first_round_lowest(q: dict) -> int:
    """Runs of a quickstart_repeat file whose first timed round printed the lowest ratio."""
    return sum(r["round_speedups"][0] == min(r["round_speedups"]) for r in q["runs"])


def _quickstart_warmup(results: Path) -> str:
    """Why the first timed round was the lowest: three quick starts with the 8-token warm-up, three with a whole
    generation per mode as the warm-up, one after the other on one machine."""
    def said(key):
        name = f"quickstart_repeat_cpu_v9_{key}.json"
        q = _load(results, name)
        s, n = q["summary"], len(q["runs"])
        slow = statistics.median(r["dflash_wall_s"][0] / statistics.median(r["dflash_wall_s"][1:]) for r in q["runs"])
        return (f"{n} quick starts in a row ({provenance_note(q, name)}) printed {s['min']:.2f}-{s['max']:.2f}x (within "
                f"{100 * (s['worst_three_in_a_row_spread'] - 1):.0f}%), the first timed round the lowest in "
                f"{_first_round_lowest(q)} of {n}, its DFlash wall time {slow:.2f}x the later rounds' median")
    return (f"A first round lowest was the warm-up's doing: it generated 8 tokens per mode, so the adaptive policy "
            f"was still learning the acceptance in the first timed round. With that warm-up, {said('warm8')}; with a "
            f"whole generation per mode as the warm-up (now the quick start's), {said('warm_whole')}.")


def _quickstart_dtype(results: Path) -> str:
    """The quick start in bf16 and in float32 on one CPU with AMX-BF16 (quickstart_repeat.quickstart_dtype)."""
    runs = {dt: _load(results, f"quickstart_repeat_cpu_{dt}.json") for dt in ("bf16", "fp32")}

    def wall(d, mode):
        return statistics.median(x for r in d["runs"] for x in r[f"{mode}_wall_s"])

    def block1_share(d) -> float:   # "block 1: 310 steps, block 2: 10 steps" per run
        counts = [(int(b), int(n)) for r in d["runs"]
                  for b, n in re.findall(r"block (\d+): (\d+) steps", r["blocks_ran"])]
        return sum(n for b, n in counts if b == 1) / sum(n for _, n in counts)

    b, f = runs["bf16"], runs["fp32"]
    sb, sf = b["summary"], f["summary"]
    return (f"On a CPU with AMX-BF16 the quick start now runs both modes in bf16 (where bf16 matmuls are emulated it "
            f"stays in float32): on 2 shared cores of such a Xeon (`benchmarks/results/quickstart_repeat_cpu_bf16.json`, "
            f"{commit_of(b, 'quickstart_repeat_cpu_bf16.json')}) three quick starts in a row printed "
            f"{sb['min']:.2f}-{sb['max']:.2f}x, DFlash == AR in {sb['runs_with_dflash_equal_ar']} of {len(b['runs'])} "
            f"(median round: AR {wall(b, 'ar'):.2f} s, DFlash {wall(b, 'dflash'):.2f} s); in float32 on the same "
            f"machine (`quickstart_repeat_cpu_fp32.json`) {sf['min']:.2f}-{sf['max']:.2f}x (AR {wall(f, 'ar'):.2f} s, "
            f"DFlash {wall(f, 'dflash'):.2f} s): there drafting does not pay in float32 (a 16-row float32 step is "
            f"compute-bound), so the policy ran block 1 on {100 * block1_share(f):.0f}% of its steps and DFlash "
            f"stays just below AR (the goal is never below). bf16 AR is the slower AR there, so bf16 DFlash is "
            f"{wall(f, 'ar') / wall(b, 'dflash'):.2f}x the faster AR (float32).")


def render_cpu_parity(results: Path) -> str:
    """Block 1 vs AR on the CPU (step cost and whole generation)."""
    name = "cpu_generate_parity.json"
    d = _load(results, name)
    now, before = d["trees"]["this"], d["trees"].get("before")
    other = next(((label, t) for label, t in d["trees"].items() if label not in ("this", "before")), None)
    s, st = now["summary"], now["block1_summary"]
    ran = now["runs"][0]["blocks_ran"]
    # the other checkout's path is the machine's, not the reader's
    command = re.sub(r"--tree (\w+)=\S+", r"--tree \1=OTHER_CHECKOUT", as_run_now(d.get("command") or d["provenance"]["command"]))
    command = re.sub(r" --note .*?(?= --out )", "", command)   # the machine's note: free text, said elsewhere
    text = (f"Measured on a shared {d['machine'].split()[0]}-core CPU machine (smollm2-135m + "
            f"{smollm2_drafter(results, d, 'drafter')}, "
            f"float32), {s['runs']} runs "
            f"(`{command}`; "
            f"{provenance_note(d, name)}): one decode step at block 1 costs "
            f"{st['median_block1_over_ar_step']:.3f}x an AR step (median; {st['min']:.3f}-{st['max']:.3f})")
    if before is not None:
        text += f", {before['block1_summary']['median_block1_over_ar_step']:.3f}x before the drafter context was batched"
    text += (f"; the whole generation takes {s['median_dflash_over_ar_wall']:.2f}x the AR wall time "
             f"({s['min']:.2f}-{s['max']:.2f}"
             + (f"; {before['summary']['median_dflash_over_ar_wall']:.2f}x before" if before is not None else "")
             + f"; same tokens: {'yes' if s['all_tokens_identical'] else 'NO'}; first run: {ran}).")
    q = s.get("quickstart_speedup")
    if q is not None:   # the quick start's own figure, run after run
        text += (f" The speed-up the quick start prints (median of its {now['runs'][0]['rounds']} alternated rounds) was "
                 f"{q['median']:.2f}x over the {s['runs']} runs ({q['min']:.2f}-{q['max']:.2f}x: any three runs in a row "
                 f"within {100 * q['max_spread_3_in_a_row']:.0f}% of each other).")
    if q is not None and other is not None:   # another checkout, run in turn with this one
        label, t = other
        oq = t["summary"]["quickstart_speedup"]
        text += (f" The checkout labelled {label}, run in turn with it: {oq['median']:.2f}x "
                 f"({oq['min']:.2f}-{oq['max']:.2f}x).")
    return "\n".join(textwrap.wrap(text, 116)) + "\n"


def render_step_bench(results: Path) -> str:
    """Decode step cost on one H100: the torch path against the Triton decode kernels (SmolLM2-135M, Qwen3-8B,
    Llama-3.1-8B); the torch rows of the first two come from the v5 run, Llama's from v6."""
    names = {"v5_torch": "step_bench_h100_v5_torch.json", "v6_torch": "step_bench_h100_v6_torch.json",
             "v6_triton": "step_bench_h100_v6_triton.json"}
    runs = {k: _load(results, f) for k, f in names.items()}
    notes = "; ".join(provenance_note(runs[k], f) for k, f in names.items())
    meta = runs["v6_triton"]["meta"]
    cmd = as_run_now("python " + meta["command"].split(" --out ")[0])
    lines = [
        f"**Decode step cost on one H100 80 GB** (random bf16 weights at real shapes, prompt 512 tokens, CUDA graphs; "
        f"`{cmd}`, and `--attention_kernel torch` for the torch rows; torch {meta['torch']}, triton "
        f"{meta['triton']}; {notes}). Roofline = bytes that must cross HBM per step (every weight once + the KV "
        f"cache) at the copy bandwidth measured in the same run ({meta['copy_bw_bytes_per_s'] / 1e12:.1f} TB/s). "
        f"`triton`: the decode kernels of `RuntimeConfig.kernels` (`auto` = on CUDA, the default): "
        f"attention, the GEMMs with their epilogues, sampling + acceptance.",
        "",
        *_table_head("model", "path (file)", "AR b1 (ms) / roofline", "DFlash b1 (ms)", "DFlash / AR",
                     "kernels per AR step", "kernels per layer (AR / verify / drafter)"),
    ]
    for model, torch_run in (("smollm2-135m", "v5_torch"), ("qwen3-8b", "v5_torch"), ("llama-3.1-8b", "v6_torch")):
        for k in (torch_run, "v6_triton"):
            d = runs[k]
            r, sm = _step_rows(d, model), d["summary"][model]
            kl = sm.get("kernels_per_layer") or {}
            per = " / ".join(str(v["per_layer"]) for v in kl.values())
            lines.append(
                f"| {model} | {k.split('_')[1]} ({k.split('_')[0]}) | {_ms(r[('ar', 1)]['step_ms'])} / "
                f"{_pct(r[('ar', 1)]['roofline_fraction'])} | {_ms(r[('dflash', 1)]['step_ms'])} | "
                f"{sm['dflash_b1_step_over_ar_step']:.2f} | {sm['profile_ar_b1']['kernels_per_step']:.0f} | {per} |")
    return "\n".join(lines) + "\n"


def render_engine_load(results: Path) -> str:
    """Requests arriving and leaving: the closed loop against the steady step (one H100)."""
    name = "engine_load_h100.json"
    d = _load(results, name)
    st = d["settings"]
    lines = [
        f"**Serving at the speed of the step** (one H100, in-process engine, random bf16 weights at the shipped "
        f"SmolLM2 pair's shapes; {st['waves']} waves of requests per level, prompts {st['prompt_len']} tokens, outputs "
        f"{st['output_len']} tokens, a new request as soon as one finishes; `python -m trtllm_dflash.bench.load --batch "
        f"{st['batch']}`; {provenance_note(d, name)}). Steady step = every row decoding, nothing arriving; "
        f"mean / steady = 1 when arrivals cost the running requests nothing.",
        "",
        *_table_head("mode", "concurrency", "new tok/s", "mean step (ms)", "steady step (ms)", "mean / steady",
                     "time per output token p50 (ms)", "graphs captured at start-up / mid-run"),
    ]
    for r in d["rows"]:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['tok_s']:,.0f} | {_ms(r['mean_step_ms'])} | "
                     f"{_ms(r['steady_step_ms'])} | {r['mean_step_over_steady']:.2f} | {_ms(r['tpot_ms_p50'])} | "
                     f"{r['startup_graphs']} / {r['graphs_captured_mid_run']} |")
    return "\n".join(lines) + "\n"


def rows_gpu(rows: list[dict]) -> str | None:
    """The GPU that ran a sweep's rows, from their own provenance (a summary joined on another machine records that
    machine's device)."""
    return (rows[0].get("provenance") or {}).get("device", {}).get("gpu")


def _sweep(results: Path, stem: str):
    """A sweep's summary file name and contents, its rows, their metrics by (label, concurrency), the levels."""
    name = f"{stem}.summary.json"
    d = _load(results, name)
    rows = _read(results, f"{stem}.jsonl")
    at = {(r["label"], r["settings"]["concurrency"]): r["metrics"] for r in rows}
    return name, d, d["summary"], rows, at, sorted({c for _, c in at})


def render_sweep_v3(results: Path) -> str:
    """AR vs DFlash fixed vs adaptive on the real SmolLM2 pair, concurrency 1..256 (one H100)."""
    name, d, s, rows, at, levels = _sweep(results, "sweep_smollm2_h100_v3")
    sha = rows[0]["versions"]["git_sha"][:10]
    lines = [
        f"**SmolLM2-135M + the v1 drafter, in-process, HumanEval prompts, 128 new tokens, one H100** "
        f"(`bash benchmarks/gpu_smollm2.sh sweep3`, git {sha}, see the rows' git_sha_note; summary "
        f"{provenance_note(d, name)}). New tokens/s over all users (tokens/s per user):",
        "",
        *_table_head("concurrency", *map(str, levels)),
    ]
    for label in ("AR", "DFlash", "DFlash adaptive"):
        lines.append(f"| {label} | " + " | ".join(
            f"{at[(label, c)]['total_tok_s']:,.0f} ({at[(label, c)]['tok_s_user']:,.0f})" for c in levels) + " |")
    v2 = _read(results, "sweep_smollm2_h100_v2.jsonl")
    before = next(r["metrics"]["total_tok_s"] for r in reversed(v2)
                  if r["label"] == "AR" and r["settings"]["concurrency"] == 64)
    v2_note = provenance_note(_load(results, "sweep_smollm2_h100_v2.summary.json"), "sweep_smollm2_h100_v2.summary.json")
    lines += ["",
              f"AR at concurrency 64: {s['ar_tok_s_c64']:,.0f} tok/s ({before:,.0f} in sweep v2 before this engine, "
              f"{v2_note}); at 256: "
              f"{s['ar_tok_s_c256']:,.0f}. DFlash adaptive over AR at equal interactivity: "
              f"{s['min_adaptive_over_ar_iso_interactivity']:.2f}x to {s['max_adaptive_over_ar_iso_interactivity']:.2f}x "
              f"(fixed block: {s['min_fixed_over_ar_iso_interactivity']:.2f}x to "
              f"{s['max_fixed_over_ar_iso_interactivity']:.2f}x)."]
    missing = [what for key, what in (("openai_over_inprocess_c64", "through dflash-openai"),
                                      ("triton_over_inprocess_c64", "through Triton"),
                                      ("regen_tok_s_b256", "regeneration at batch 256"),
                                      ("itl_c64_over_steady_b64", "the steady batch-64 step of the real pair"))
               if s.get(key) is None]
    if missing:
        lines[-1] += " Not measured in this run: " + ", ".join(missing) + " (the summary's notes say why)."
    return "\n".join(lines) + "\n"


E2E_H200 = "e2e_smollm2_h200_v9.json"   # the shipped drafter's end-to-end run on an H200


def render_e2e(results: Path, name: str = E2E_H200, before: str | None = "e2e_smollm2_h200_v8.json") -> str:
    """End to end with a shipped drafter (benchmarks/e2e_smollm2.sh): AR vs DFlash vs adaptive per dataset and
    concurrency, in-process and through dflash-openai; tokens/s per user, the ratio to AR under each."""
    d = _load(results, name)
    gpu = rows_gpu(d["rows"]) or d["provenance"]["device"].get("gpu", "GPU")
    at = {}
    for r in d["rows"]:
        s = r["settings"]
        path = "dflash-openai" if s.get("server", s.get("backend")) == "openai" else "in-process"
        at[s["dataset"], path, s["mode"], int(s["concurrency"])] = r["metrics"]["tok_s_user"]
    levels = sorted({k[3] for k in at})
    label = {"ar": "AR", "dflash": "DFlash (block 16)", "adaptive": "DFlash adaptive"}
    lines = [f"**SmolLM2-135M + {smollm2_drafter(results, d, 'drafter', name)}, one {gpu}, 256 new tokens, greedy** (`OUT=DIR bash "
             f"benchmarks/e2e_smollm2.sh`; {provenance_note(d, name)}, rows in `{name[:-5]}.jsonl`). "
             "Tokens/s per user, and over AR on the same path:", ""]
    lines += _table_head("dataset", "path", "mode", *(f"concurrency {c}" for c in levels))
    for dataset in ("humaneval", "mtbench"):
        for path in ("in-process", "dflash-openai"):
            for mode in ("ar", "dflash", "adaptive"):
                if not any((dataset, path, mode, c) in at for c in levels):
                    continue
                cells = []
                for c in levels:
                    v, ar = at.get((dataset, path, mode, c)), at.get((dataset, path, "ar", c))
                    cells.append("-" if v is None else f"{v:,.0f}" + ("" if mode == "ar" or not ar else f" ({v / ar:.2f}x)"))
                lines.append(f"| {dataset} | {path} | {label[mode]} | " + " | ".join(cells) + " |")
    notes = [d["note"]] if d.get("note") else d["summary"].get("notes", [])
    missing = d["summary"].get("missing")
    if missing:
        notes.append("Not measured in this run: " + ", ".join(missing) + ".")
    if before:   # the drafter this run's replaced, same recipe and kind of GPU
        old, b, s = _load(results, before), _load(results, before)["summary"], d["summary"]

        def pairs(x):   # the datasets both runs measured
            return ", ".join(f"{label} {x[f'dflash_over_ar_tok_s_b1_{key}']:.2f}x / "
                             f"{x[f'dflash_over_ar_tok_s_b1_{key}_openai']:.2f}x"
                             for key, label in (("humaneval", "HumanEval"), ("mtbench", "MT-Bench"))
                             if s.get(f"dflash_over_ar_tok_s_b1_{key}") is not None)
        notes.append(f"With {smollm2_drafter(results, old, 'drafter', before)} (`{before}`), DFlash block 16 over "
                     f"AR at concurrency 1, in-process / through dflash-openai: {pairs(b)} (now {pairs(s)})")
    lines += ["", "\n".join(textwrap.wrap("Note: " + _sentences(notes), 115))]
    return "\n".join(lines) + "\n"


def _sentences(notes: list[str]) -> str:
    return " ".join(n if n.rstrip().endswith(".") else n.rstrip() + "." for n in notes)


def render_triton_overhead(results: Path) -> str:
    """bench.serving_overhead --server triton: what dflash-serve delivers of an engine stand-in's tokens, by the
    Triton model's sender (one response per request and step; drain past the engine's acknowledgements; those
    acknowledged once taken in), beside dflash-openai."""
    runs = [("before", "one response per request and step"),
            ("cb0ed9a", "steps queued behind each other joined, acknowledged after sending"),
            ("after", "joined, acknowledged once taken in (engine 4 steps ahead at most)")]
    lines = ["**Streaming through dflash-serve on a 2-core CPU** (`python -m trtllm_dflash.bench.serving_overhead "
             "--server triton --streams N --seconds 8 --busy_ms 1.0 --wait_ms 1.0`: an engine stand-in in its own "
             "process making 2 tokens per request and step, the real dflash-serve, gRPC streaming clients in 2 "
             "processes; CPU time shared by all of them; `benchmarks/results/serving_overhead_cpu_triton_after_64.json` and "
             "its siblings, one per row):", "",
             *_table_head("Triton model's sender", "streams", "tok/s received", "of the engine's alone",
                          "tokens per response", "frontend CPU us per token")]
    for tag, what in runs:
        for n in (16, 64):
            name = f"serving_overhead_cpu_triton_{tag}_{n}.json"
            d = _load(results, name)
            lines.append(f"| {what} | {n} | {d['tok_s_received']:,.0f} | {d['sent_over_alone']:.2f} | "
                         f"{d['tokens_per_response']:.1f} | {d['frontend_cpu_us_per_token']:.0f} |")
    o = _load(results, "serving_overhead_cpu_openai_64.json")
    lines += ["", "\n".join(textwrap.wrap(
        f"dflash-openai in the same setting at 64 streams: {o['tok_s_sent_served']:,.0f} tok/s, "
        f"{o['sent_over_alone']:.2f} of the engine's alone, {o['frontend_cpu_us_per_token']:.0f} us of frontend CPU "
        "per token (`serving_overhead_cpu_openai_64.json`): Triton's python backend and the gRPC relay still cost "
        "several times more per token.", 115))]
    lines += ["", *_unacked_rows(results), "", *_send_rate_rows(results)]
    return "\n".join(lines) + "\n"


def _send_rate_rows(results: Path) -> list[str]:
    """Responses/s through Triton in the GPU sweep at MAX_UNACKED 16, and what the stub's GIL switch interval does
    to the python backend's send rate (bench/triton_send_rate.py)."""
    name = "sweep_smollm2_h200_v5_unacked16"
    _, _, summ, rows, _, _ = _sweep(results, name)
    triton = [r for r in rows if r["label"] == "AR via Triton"]
    rate = lambda r: r["metrics"]["tok_s_gpu"] / r["metrics"]["tokens_per_chunk_mean"]   # noqa: E731 - responses/s
    cells = ", ".join(f"{rate(r):,.0f} at {r['settings']['concurrency']}" for r in triton)
    sr = _load(results, "triton_send_rate_cpu.json")
    busy = {r["interval_ms"]: r for r in sr["rows"] if r["busy_fraction"] == 1.0}
    lines = ["\n".join(textwrap.wrap(
        f"On a GPU (`bash benchmarks/gpu_smollm2.sh sweep4`, {rows[0]['settings']['gpu_name']}, one GPU of a two-GPU "
        f"host whose other GPU ran tests meanwhile; MAX_UNACKED 16; `benchmarks/results/{name}.jsonl`): DFlash through "
        f"Triton at concurrency 64 {summ['triton_over_inprocess_c64']:.2f} of in-process, AR through Triton "
        f"{summ['triton_ar_tok_s_c256']:,.0f} tok/s at 256. Responses/s through Triton (AR) stopped growing past "
        f"concurrency 16 ({cells}), and the engine slowed with them where a sender that pays per response would "
        "have joined more tokens into each. A candidate cause, measured alone: `response_sender.send` lets the GIL go "
        "while Triton takes the response over and must get it back for the next one, and with another thread of the "
        "stub working (the engine client's receiver) it waited out Python's whole 5 ms switch interval. The stub now "
        f"hands the GIL over every {sr['summary']['stub_switch_interval_ms']:g} ms "
        f"(`python -m trtllm_dflash.bench.triton_send_rate`, real tritonserver, "
        f"{provenance_note(sr, 'triton_send_rate_cpu.json')}, {sr['cpus']} CPUs): one sender alone "
        f"{sr['summary']['sends_per_s_alone']:,.0f} sends/s; beside a thread busy all the time "
        + ", ".join(f"{busy[ms]['sends_per_s']:,.0f} at {ms:g} ms" for ms in sorted(busy, reverse=True))
        + f"; beside one busy {next(r['busy_fraction'] for r in sr['rows'] if 0 < r['busy_fraction'] < 1):.0%} of the "
        "time in short stretches it makes no clear difference, so it matters where the receiver is busy most of the "
        "time (a backlog of steps). The GPU sweep above ran before this change; whether it lifts the GPU figures is "
        "still to be measured.",
        115)),
        "", "![Triton python backend send rate](benchmarks/results/triton_send_rate_cpu.png)"]
    return lines


def _unacked_rows(results: Path) -> list[str]:
    """How far the engine process may run ahead of a frontend (engine_core.MAX_UNACKED) against what dflash-serve
    delivers at 64 streams, on this 2-core CPU and on a one-H100 host's 16 cores (serving_overhead_*_unacked_*)."""
    runs = [("2-core CPU", f"serving_overhead_cpu_triton_unacked_{u}.json") for u in (4, 8, 16, 32)]
    runs += [("16-core H100 host", f"serving_overhead_h100host_triton_unacked_{u}.json") for u in (4, 16)]
    rows = [(where, name, _load(results, name)) for where, name in runs]
    d0 = rows[0][2]
    lines = ["\n".join(textwrap.wrap(
        f"How far the engine may run ahead of a frontend that has not taken its steps in (`engine_core.MAX_UNACKED`, "
        f"now 16): Triton's sender pays per response, so its round of one response per running request outlasted 4 "
        f"steps and the engine waited out the rest (`--streams 64 --busy_ms {d0['busy_ms']} --wait_ms "
        f"{d0['wait_ms']}`: steps that leave the interpreter free most of the time, as a GPU's do; "
        f"`benchmarks/results/serving_overhead_cpu_triton_unacked_16.json` and its siblings, one per row, with "
        f"`--tokenizer smollm2`; on the H100 host `serving_overhead_h100host_triton_unacked_16.json` and its sibling, "
        f"`--tokenizer chars`):", 115)), "",
        *_table_head("machine", "steps ahead at most", "tok/s received", "of the engine's alone",
                     "tokens per response", "frontend CPU us per token")]
    for where, name, d in rows:
        lines.append(f"| {where} | {name.rsplit('_', 1)[1][:-5]} | {d['tok_s_received']:,.0f} | "
                     f"{d['sent_over_alone']:.2f} | {d['tokens_per_response']:.1f} | "
                     f"{d['frontend_cpu_us_per_token']:.0f} |")
    return lines


def render_mxfp4_loop_cost(results: Path) -> str:
    """What bounds the MXFP4 gemv experts before any GPU runs: instructions per weight value in their loops."""
    name = "mxfp4_sm90_loop_cost.json"
    d = _load(results, name)
    gu = next(r for r in d["rows"] if r["kernel"] == "_gemv_gate_up_kernel")
    dn = next(r for r in d["rows"] if r["kernel"] == "_gemv_down_kernel" and r["config"] == gu["config"])
    old = {r["kernel"]: r for r in d["before"]["rows"]}
    text = (f"The gemv experts' instruction cost, compiled for sm_90 on the CPU "
            f"(`python tests/runtime/mxfp4_sm90_compile.py --loop {gu['config']} --out FILE`, Triton {d['triton']}; "
            f"{provenance_note(d, name)}): the default gemv tile's gate_up loop issues "
            f"{gu['loop_instructions_1_token']} instructions per thread per K step for "
            f"{gu['weight_values_per_thread']:.0f} weight values, {gu['instructions_per_value_1_token']} per value at "
            f"1 token (+{gu['instructions_per_value_per_more_token']} per further token), down_proj's "
            f"{dn['instructions_per_value_1_token']}; before the PTX E2M1 decode and the per-group scale "
            f"{old['_gemv_gate_up_kernel']['instructions_per_value_1_token']} and "
            f"{old['_gemv_down_kernel']['instructions_per_value_1_token']} (the file's `before`). At an H100's issue "
            f"rate that caps them at {dn['h100_issue_bound_tb_per_s_1_token']}-"
            f"{gu['h100_issue_bound_tb_per_s_1_token']} "
            "TB/s of weights. The measured kernels stay far under that (`benchmarks/results/mxfp4_decode_h200/`), "
            "so the issue rate is no longer their first limit (gate_up holds "
            f"{gu['registers_per_thread']} registers per thread: {gu['programs_per_sm_by_registers']} of its programs "
            "per SM at a time; what was tried there, in that folder's README).")
    return "\n".join(textwrap.wrap(text, 115)) + "\n"


def render_train_step(results: Path) -> str:
    """dflash-train's step before / after the KD loss change, same H100, same call (bench/train_step.py)."""
    runs = {k: _load(results, f"train_step_h100/{k}.json") for k in ("before", "after")}
    rows = {k: {r["batch"]: r for r in d["rows"] if "phase_ms" in r} for k, d in runs.items()}
    parts = []
    for b in sorted(rows["after"]):
        x, y = rows["before"][b], rows["after"][b]
        parts.append(f"batch {b} per GPU {x['s_per_step'] * 1e3:,.0f} -> {y['s_per_step'] * 1e3:,.0f} ms "
                     f"({x['tokens_per_s'] / 1e3:.1f}k -> {y['tokens_per_s'] / 1e3:.1f}k supervised tok/s)")
    b = min(rows["after"])
    ph = rows["after"][b]["phase_ms"]
    text = (f"The training step on one {runs['after']['device']} (`python -m trtllm_dflash.bench.train_step`, "
            f"`benchmarks/results/train_step_h100/`, {provenance_note(runs['after'], 'train_step_h100/after.json')}): "
            f"with the KD loss folded into one expected embedding per target position and its passes over the logits "
            f"in Triton, {'; '.join(parts)}, against the loss of 167fc13 in the same call. At batch {b} the step is "
            f"now the target's forward {ph['target']:.0f} ms, the draft's forward {ph['draft']:.0f} and backward "
            f"{ph['backward']:.0f}, the loss {ph['loss']:.0f}, anchors and mask {ph['prepare']:.0f}.")
    return "\n".join(textwrap.wrap(text, 115)) + "\n"


def render_e2e_h100(results: Path) -> str:
    return render_e2e(results, "e2e_smollm2_h100.json", before=None)


def render_sweep_v4(results: Path) -> str:
    """Issue #31's sweep (gpu_smollm2.sh sweep4, its latest run): AR and DFlash in-process, through dflash-openai and
    through dflash-serve (Triton); the run before it for comparison."""
    name, d, s, rows, at, levels = _sweep(results, "sweep_smollm2_h200_v4")
    before_name = "sweep_smollm2_h200_v5_unacked16.summary.json"
    before = _load(results, before_name)["summary"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    gpu = rows_gpu(rows) or "GPU"
    lines = [f"**SmolLM2-135M + the shipped drafter, HumanEval prompts, 128 new tokens, one {gpu}** (`bash "
             f"benchmarks/gpu_smollm2.sh sweep4`, git {rows[0]['versions']['git_sha'][:10]}; summary "
             f"{provenance_note(d, name)}). New tokens/s over all users (tokens/s per user):", "",
             *_table_head("concurrency", *map(str, levels))]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(
            "-" if (label, c) not in at else f"{at[(label, c)]['total_tok_s']:,.0f} ({at[(label, c)]['tok_s_user']:,.0f})"
            for c in levels) + " |")
    def ratio(key):
        return "not measured" if s.get(key) is None else f"{s[key]:.2f}"
    text = (f"Served over in-process at concurrency 64 (DFlash, tokens/s): dflash-openai {ratio('openai_over_inprocess_c64')}, "
            f"Triton {ratio('triton_over_inprocess_c64')}. AR at concurrency 256: {s['ar_tok_s_c256']:,.0f} tok/s "
            f"in-process, {s['openai_ar_tok_s_c256']:,.0f} through dflash-openai. DFlash adaptive over AR at equal "
            f"interactivity: {s['min_adaptive_over_ar_iso_interactivity']:.2f}x to "
            f"{s['max_adaptive_over_ar_iso_interactivity']:.2f}x."
            + (f" Mean gap between streamed chunks at concurrency 64 over a steady batch of 64 (adaptive): "
               f"{s['itl_c64_over_steady_b64']:.2f}x; the steady batch decodes random prompts, where the policy keeps "
               f"to block 1, so this also holds the drafting blocks' cost" if s.get("itl_c64_over_steady_b64") else "")
            + (f"; at the fixed block, where a step costs the same whatever is accepted: "
               f"{s['itl_c64_fixed_over_steady_b64_fixed']:.2f}x" if s.get("itl_c64_fixed_over_steady_b64_fixed")
               else "")
            + ("." if s.get("itl_c64_over_steady_b64") else "")
            + (" Notes: " + _sentences(s["notes"]) if s.get("notes") else ""))
    prev = (f"The same sweep on the same kind of GPU before Triton's Python-backend stub handed the interpreter "
            f"lock over every 0.1 ms instead of every 5 ms ({provenance_note(_load(results, before_name), before_name)}, "
            f"the engine up to 16 steps ahead of a frontend): dflash-openai {before['openai_over_inprocess_c64']:.2f}, Triton "
            f"{before['triton_over_inprocess_c64']:.2f}, AR at 256 through dflash-openai "
            f"{before['openai_ar_tok_s_c256']:,.0f} tok/s, dflash-openai's TTFT p50 at 64 "
            f"{before['openai_ttft_p50_over_inprocess_c64']:.1f}x in-process's (now "
            f"{s['openai_ttft_p50_over_inprocess_c64']:.1f}x).")
    lines += ["", *textwrap.wrap(text, 115), "", *textwrap.wrap(prev, 115)]
    return "\n".join(lines) + "\n"


# results files written before their tools recorded the checkpoints' digests: the drafter their notes name
DRAFTER_OF_FILE = {"e2e_smollm2_h200_v3.json": "v3", "e2e_smollm2_h200_v2.json": "v2",
                   "quickstart_repeat_cpu.json": "v5", "quickstart_repeat_cpu_gap.json": "v5"}


def smollm2_drafter(results: Path, data: dict, key: str = "smollm2_drafter", file: str | None = None) -> str:
    """Which SmolLM2 drafter a results file measured, by the sha256 its provenance recorded: 'the shipped drafter'
    only while that file is still the one in the package, else its version, so a result made with an earlier
    drafter does not read as the current one's. ``file``: the results file's name, for those DRAFTER_OF_FILE
    names (written before digests were recorded)."""
    sha = (((data.get("provenance") or {}).get("checkpoints") or {}).get(key) or {}).get("files", {}).get(
        "model.safetensors")
    if sha:
        version = next((v for v, run in DRAFTER_RUNS.items()
                        if sha == _read(results, run + "/summary.json")["checkpoints"]["drafter_shipped_sha256"]), None)
    else:
        version = DRAFTER_OF_FILE.get(file)
    if version is None:
        return f"a drafter with sha256 {sha[:12]}" if sha else "a drafter the file does not name"
    return "the shipped drafter" if DRAFTER_RUNS[version] == DRAFTER_RUN else f"the {version} drafter"


def render_bit_exact(results: Path) -> str:
    """The batch-invariant mode: bf16 DFlash == AR on the real pair and the tiny pairs, and what the mode costs a
    decode step (trtllm_dflash/bench/bit_exact_summary.py over `kernels_gpu.sh bitexact`'s files)."""
    name = "bit_exact_h200.json"
    d = _load(results, name)
    s, cc = d["summary"], _load(results, "cuda_check_bit_exact_h200.json")
    on = _load(results, "step_bench_bi_on_h200.json")
    sm = s["smollm2_bf16"]
    lines = [f"**Batch-invariant mode** (`RuntimeConfig.batch_invariant`, off by default; `BITEXACT=check|step_on|step_off "
             f"bash benchmarks/kernels_gpu.sh bitexact`, {s['gpu']}; {provenance_note(d, name)}, from "
             f"`cuda_check_bit_exact_h200.json` ({commit_of(cc, 'cuda_check_bit_exact_h200.json')}) and "
             f"`step_bench_bi_{{on,off}}_h200.json`, {commit_of(on, 'step_bench_bi_on_h200.json')}): SmolLM2 + {smollm2_drafter(results, cc)} in **bf16**, DFlash == AR greedy on "
             f"{s['bf16_identical_prompts']} of {s['bf16_prompts']} prompts at block 16 (block 8: {sm['dflash_eq_ar_greedy_block8']}, "
             f"block 4: {sm['dflash_eq_ar_greedy_block4']}; 128 tokens), each request alone == in a batch of 8 for AR "
             f"({sm['ar_alone_eq_batch']}/8) and DFlash ({sm['dflash_alone_eq_batch']}/8); tiny Llama / Qwen3 pairs in bf16 "
             f"{s['tiny_bf16_identical']} of {s['tiny_bf16_runs']} (greedy and seeded sampling). Under a 64-stream load: "
             + (_soak_under_load(results) if s["load_equals_alone_fraction"] is None
                else f"{100 * s['load_equals_alone_fraction']:.1f}% of greedy answers == alone") + ".", "",
             "What the mode costs a decode step (ms, same GPU, mode on / off):", ""]
    lines += _table_head("model", "mode", "batch", "off", "on", "on / off")
    for r in d["cost"]:
        lines.append(f"| {r['model']} | {r['mode']} | {r['batch']} | {r['off_ms']:.2f} | {r['on_ms']:.2f} | "
                     f"{r['ratio']:.2f}x |")
    lines += ["", f"Worst: AR {s['ar_step_cost_ratio']:.2f}x, DFlash {s['dflash_step_cost_ratio']:.2f}x the step with the "
              "mode off, so it stays off by default until its kernels cost no more than the others. "
              + _bi_sweep(results) + " " + _bi_check_h100(results)]
    return "\n".join(lines) + "\n"


def _bi_check_h100(results: Path) -> str:
    """The mode's exactness checks on an H100 (cuda_check --smollm2 --batch_invariant on): the step costs there
    have not been measured yet, so no bit_exact_h100.json."""
    name = "cuda_check_bit_exact_h100.json"
    d = _load(results, name)
    bf16 = next(r for r in d["smollm2"] if r["dtype"] == "bfloat16")
    tiny = [r for r in d["tiny"] if r["dtype"] == "bfloat16"]
    return (f"On an {d['gpu']} ({name}, {commit_of(d, name)}): SmolLM2 bf16 DFlash == AR on "
            f"{bf16['dflash_eq_ar_greedy']}/{bf16['n_prompts']} prompts at block 16 ({bf16['dflash_eq_ar_greedy_block8']} "
            f"at 8, {bf16['dflash_eq_ar_greedy_block4']} at 4), alone == batched {bf16['ar_alone_eq_batch']}/"
            f"{bf16['n_prompts']} AR and {bf16['dflash_alone_eq_batch']}/{bf16['n_prompts']} DFlash; tiny pairs in bf16 "
            f"{sum(r['dflash_eq_ar_greedy'] for r in tiny)}/{sum(r['n'] for r in tiny)} greedy; the step costs on "
            "that GPU are still to be measured.")


def _bi_sweep(results: Path) -> str:
    """The mode's cost end to end: dflash-sweep on two deployments of the SmolLM2 pair, built with and without
    --batch_invariant, same prompts (batch_invariant_sweep_h100.jsonl)."""
    name = "batch_invariant_sweep_h100.jsonl"
    rows = [json.loads(line) for line in (results / name).read_text().splitlines() if line.strip()]
    at = {(r["settings"]["mode"], r["label"].endswith("=on"), r["settings"]["concurrency"]): r for r in rows}
    cells = []
    for mode, label in (("ar", "AR"), ("dflash", "DFlash")):
        for c in sorted({k[2] for k in at}):
            off, on = at[(mode, False, c)]["metrics"], at[(mode, True, c)]["metrics"]
            cells.append(f"{label} at concurrency {c} {off['total_tok_s']:,.0f} -> {on['total_tok_s']:,.0f} "
                         f"({on['total_tok_s'] / off['total_tok_s']:.2f}x)")
    r0 = rows[0]
    return (f"End to end on the SmolLM2 pair ({r0['settings']['gpu_name']}, dflash-sweep, {r0['settings']['dataset']}, "
            f"{r0['settings']['max_new_tokens']} new tokens, tokens/s over all users, off -> on): " + "; ".join(cells)
            + f" (`benchmarks/results/{name}`, git {r0['versions']['git_sha'][:10]}).")


def _soak_under_load(results: Path) -> str:
    """Greedy answers under the soak's load == the same prompt alone, mode on and off (gpu_smollm2.sh soak, BI=1)."""
    runs = {}
    for mode in ("on", "off"):
        name = f"soak_batch_invariant_h100/soak_bi_{mode}.json.gz"
        d = _load(results, name)
        g = d["checks"]["greedy_equals_solo"]
        runs[mode] = (g["compared"] - g["wrong"], g["compared"], d["summary"]["requests_per_s"], d, name)
    on, off = runs["on"], runs["off"]
    return (f"{on[0]:,} of {on[1]:,} greedy answers == the same prompt alone with the mode on, {off[0]:,} of {off[1]:,} "
            f"with it off ({on[3]['provenance']['device'].get('gpu') or 'GPU'}, dflash-serve, 64 streams, "
            f"{on[2]:.0f} vs {off[2]:.0f} requests/s; `benchmarks/results/soak_batch_invariant_h100/`, "
            f"{provenance_note(on[3], on[4])})")


def render_step_notes(results: Path) -> str:
    """Step cost beside its peers (HF transformers, the dflash reference package) and its history."""
    v1, v2, v3 = (_load(results, f"step_bench_h100_{v}.json") for v in ("v1", "v2", "v3"))
    files = [_load(results, f.name) for f in sorted(results.glob("step_bench_h100_v*.json"))]
    hf = {m: [f["summary"][m].get("hf_ar_b1_ms_per_token") for f in files] for m in ("qwen3-8b", "llama-3.1-8b")}
    hf = {m: [x for x in xs if x is not None] for m, xs in hf.items()}
    speed = [f["summary"][m].get("speedup_vs_hf_ar_b1") for f in files for m in hf]
    speed = [x for x in speed if x is not None]
    s2q, s2l = v2["summary"]["qwen3-8b"], v2["summary"]["llama-3.1-8b"]
    s3q = v3["summary"]["qwen3-8b"]
    r3 = _step_rows(v3, "qwen3-8b")
    bytes_ratio = r3[("dflash", 1)]["bytes_per_step"] / r3[("ar", 1)]["bytes_per_step"]
    prof = s2q["profile_ar_b1"]
    return "\n".join([
        f"- Peers, batch 1, side by side in one run (v2, {provenance_note(v2, 'step_bench_h100_v2.json')}): HF "
        f"transformers `generate` {s2q['hf_ar_b1_ms_per_token']:.1f} ms/token for Qwen3-8B, our AR step "
        f"**{s2q['speedup_vs_hf_ar_b1']:.1f}x** faster; the `dflash` reference package "
        f"{s2q['dflash_ref_b1_ms_per_iteration']:.0f} ms per draft+verify iteration, ours "
        f"**{s2q['speedup_vs_dflash_ref_b1']:.0f}x** faster (Llama-3.1-8B: {s2l['speedup_vs_hf_ar_b1']:.1f}x and "
        f"{s2l['speedup_vs_dflash_ref_b1']:.0f}x). HF's own time moves a lot between runs "
        f"({min(hf['qwen3-8b']):.0f}-{max(hf['qwen3-8b']):.0f} ms/token for Qwen3-8B, "
        f"{min(hf['llama-3.1-8b']):.0f}-{max(hf['llama-3.1-8b']):.0f} for Llama over the {len(files)} step_bench files: "
        f"it is bound by Python launch overhead), so the HF ratio ranges {min(speed):.1f}x-{max(speed):.1f}x.",
        f"- DFlash step / AR step = {s3q['dflash_b1_step_over_ar_step']:.2f} at batch 1 (v3; the bytes alone give "
        f"{bytes_ratio:.2f}: the drafter plus a second lm_head pass).",
        f"- What bounds batch 1: the kernel profile of v2 (older code, the only run made with `--profile`) counts "
        f"{prof['kernels_per_step']:.0f} kernels per Qwen3-8B AR step ({prof['device_ms_per_step']:.2f} ms of device "
        f"time in a {s2q['ar_b1_step_ms']:.2f} ms step): the weight GEMMs plus many small kernels (norms, RoPE, cache "
        f"writes, attention). From v1 to v3 the Qwen3-8B AR step went from {v1['summary']['qwen3-8b']['ar_b1_step_ms']:.1f} "
        f"to {s3q['ar_b1_step_ms']:.1f} ms (v1 already replayed CUDA graphs): fused elementwise chains, grouped-query "
        f"attention that reads each KV row once, matmul attention for decode-sized queries, and a drafter that "
        f"attends its cache in place instead of concatenating it.",
    ]) + "\n"


def render_tp_bench(results: Path) -> str:
    """Tensor parallelism: TP N steps over the TP 1 step of the same machine (bench/tp_scaling.py)."""
    name = "tp_scaling.json"
    d = _load(results, name)
    s, r = d["summary"], d["summary"]["ratios"]
    runs = [_load(results, f.split("benchmarks/results/", 1)[-1]) for f in d["run_files"]]
    steps = {(x["tp_size"], x["mode"], x["batch"]): x["step_ms"] for run in runs for x in run["rows"]}
    tps = sorted(s["tp_sizes"])
    cells = "; ".join(f"{mode} batch {b}: " + " / ".join(f"{steps[(tp, mode, b)]:.2f}" for tp in tps) + " ms"
                      for mode in ("ar", "dflash") for b in (1, 64) if all((tp, mode, b) in steps for tp in tps))
    gpus = f"{max(tps)}x {s['gpu'].replace('NVIDIA ', '')}"
    return (f"- **Tensor parallelism, {gpus}** (`mpirun -n N python3 -m trtllm_dflash.bench.tp --batch 1,64` for N = "
            f"{', '.join(map(str, tps))} on one machine, joined by `python -m trtllm_dflash.bench.tp_scaling`; "
            f"{provenance_note(d, name)}; Qwen3-8B shapes, random bf16 weights, the Triton decode kernels on every rank, "
            f"all-reduce {'/'.join(s['allreduce_strategy'])}): TP {' / '.join(map(str, tps))} step {cells}. TP 2 over TP 1: "
            f"AR {r['qwen3-8b_tp2_over_tp1_ar_b1']:.2f} at batch 1 (goal <= 0.6; perfect scaling of the weight reads: "
            f"0.5), DFlash {r['qwen3-8b_tp2_over_tp1_dflash_b1']:.2f} at batch 1 and "
            f"{r['qwen3-8b_tp2_over_tp1_dflash_b64']:.2f} at batch 64; the decode-size all-reduce "
            f"{s['allreduce_us_p50']:.1f} us per call (median, <= 64 KB); tokens "
            f"{'equal' if s['tokens_equal_tp1'] else 'DIFFER FROM'} TP 1 (tiny pair, float32)."
            + (f" TP 4 over TP 1: AR {r['qwen3-8b_tp4_over_tp1_ar_b1']:.2f} at batch 1 (goal <= 0.4) and "
               f"{r['qwen3-8b_tp4_over_tp1_ar_b64']:.2f} at 64, DFlash {r['qwen3-8b_tp4_over_tp1_dflash_b1']:.2f} and "
               f"{r['qwen3-8b_tp4_over_tp1_dflash_b64']:.2f}." if "qwen3-8b_tp4_over_tp1_ar_b1" in r else "")
            + " Where a rank's step goes (GEMMs, all-reduces, attention, the gaps between kernels), from the profiler: "
            "`benchmarks/results/tp_h200x4/README.md`. " + _tp_host_group(results) + " " + _tp_lamport(results) + "\n")


def _tp_lamport(results: Path) -> str:
    """TP 2 / TP 1 on 2x H200 after the gated tiles, then with the Lamport all-reduce fused with the add + RMSNorm."""
    tiles, lamport = (_load(results, f"{folder}/tp_scaling.json") for folder in ("tp_h200x2_gated_tile", "tp_h200x2_lamport"))
    t, l = tiles["summary"]["ratios"], lamport["summary"]["ratios"]
    rows = {f: {(r["mode"], r["batch"]): r for r in _load(results, f)["rows"]}
            for f in ("tp_h200x2_gated_tile/tp2.json", "tp_h200x2_lamport/tp2_lamport.json")}
    before, after = (rows[f][("ar", 1)] for f in rows)
    lam = next(k for k in after["profile"]["top"] if k["name"] == "_lamport_kernel")
    runs = {f: _load(results, f) for f in rows}
    return (f"Latest at TP 2 (2x H200; `benchmarks/results/tp_h200x2_gated_tile/`, "
            f"{commit_of(runs['tp_h200x2_gated_tile/tp2.json'], 'tp_h200x2_gated_tile/tp2.json')}, and "
            f"`benchmarks/results/tp_h200x2_lamport/`, "
            f"{commit_of(runs['tp_h200x2_lamport/tp2_lamport.json'], 'tp_h200x2_lamport/tp2_lamport.json')}, over the "
            f"same TP 1 run): with the 32-column gated "
            f"tiles TP 2 over TP 1 is AR {t['qwen3-8b_tp2_over_tp1_ar_b1']:.3f} / DFlash "
            f"{t['qwen3-8b_tp2_over_tp1_dflash_b1']:.3f} at batch 1; with each all-reduce and the residual add + RMSNorm "
            f"after it in one Lamport kernel ({lam['count']} calls, {1e3 * lam['ms'] / lam['count']:.1f} us each) the TP 2 "
            f"AR step goes {before['step_ms']:.2f} -> {after['step_ms']:.2f} ms ({before['profile']['kernels_per_step']:.0f} "
            f"-> {after['profile']['kernels_per_step']:.0f} kernels) and the ratios to AR "
            f"{l['qwen3-8b_tp2_over_tp1_ar_b1']:.3f} / DFlash {l['qwen3-8b_tp2_over_tp1_dflash_b1']:.3f} (goal <= 0.6).")


def _tp_host_group(results: Path) -> str:
    """TP 2 with the steps' schedule over the host group against over NCCL (same 2x H200 machine), and the served
    TP sweep's AR rows."""
    folder, sweep_name = "tp_h200x2_host_group", "tp_sweep_h200x2/tp_sweep_h200.json"
    after, before = (_load(results, f"{folder}/{f}") for f in ("tp_scaling.json", "tp_scaling_nccl_object.json"))
    a, b = after["summary"]["ratios"], before["summary"]["ratios"]
    runs = {f: _load(results, f"{folder}/{f}") for f in ("tp2_nccl_object.json", "tp2_host_group.json")}
    ar_old, ar_new = (next(r for r in run["rows"] if (r["mode"], r["batch"]) == ("ar", 1)) for run in runs.values())
    sw = _load(results, sweep_name)
    ar, dflash_tp2 = sw["summary"]["by_mode"]["ar"], sw["summary"]["by_mode"]["dflash"].get("tp2")
    return (f"With rank 0's schedule sent to the other ranks over a host (gloo) group instead of NCCL "
            f"(`benchmarks/results/{folder}/`, {commit_of(runs['tp2_host_group.json'], folder + '/tp2_host_group.json')}; "
            f"2x H200, one machine): TP 2 AR step at batch 1 {ar_old['step_ms']:.2f} -> {ar_new['step_ms']:.2f} ms "
            f"(idle GPU per step {ar_old['profile']['host_gap_ms_per_step']:.2f} -> "
            f"{ar_new['profile']['host_gap_ms_per_step']:.2f} ms), TP 2 over TP 1 AR {b['qwen3-8b_tp2_over_tp1_ar_b1']:.2f} "
            f"-> {a['qwen3-8b_tp2_over_tp1_ar_b1']:.2f} at batch 1 and {b['qwen3-8b_tp2_over_tp1_ar_b64']:.2f} -> "
            f"{a['qwen3-8b_tp2_over_tp1_ar_b64']:.2f} at 64, DFlash {b['qwen3-8b_tp2_over_tp1_dflash_b1']:.2f} -> "
            f"{a['qwen3-8b_tp2_over_tp1_dflash_b1']:.2f} and {b['qwen3-8b_tp2_over_tp1_dflash_b64']:.2f} -> "
            f"{a['qwen3-8b_tp2_over_tp1_dflash_b64']:.2f}. Served (`benchmarks/tp_sweep.sh`, dflash-sweep under mpirun, "
            f"`benchmarks/results/{sweep_name}`): AR at TP 2 {ar['tp2']['c1']['tok_s_user']:.0f} tok/s per user at "
            f"concurrency 1 against {ar['tp1']['c1']['tok_s_user']:.0f} at TP 1 "
            f"({sw['summary']['ratios']['tp2_over_tp1_ar_user_c1']:.2f}x), per GPU at 64 "
            f"{sw['summary']['ratios']['tp2_over_tp1_ar_gpu_c64']:.2f}x"
            + (f"; DFlash (random drafter: the cost of a verify step, ~1 token accepted) at TP 2 "
               f"{dflash_tp2['c1']['tok_s_user']:.0f} tok/s per user at concurrency 1 against "
               f"{sw['summary']['by_mode']['dflash']['tp1']['c1']['tok_s_user']:.0f} at TP 1 "
               f"({sw['summary']['ratios']['tp2_over_tp1_dflash_user_c1']:.2f}x), per GPU at 64 "
               f"{sw['summary']['ratios']['tp2_over_tp1_dflash_gpu_c64']:.2f}x." if dflash_tp2
               else "; DFlash at TP 2 not yet run there."))


def render_tp_allreduce(results: Path) -> str:
    """The all-reduce alone and fused with the residual add + RMSNorm, 2x H200 (bench/tp_allreduce.py)."""
    name = "tp_h200x2_barrier/tp_allreduce_h200x2.json"
    d = _load(results, name)
    small = [r for r in d["rows"] if "oneshot_us" in r]
    fused = d["add_norm_rows"]
    one, last = fused[0], fused[-1]
    return (f"- **All-reduce, 2x H200** (`mpirun -n 2 python3 -m trtllm_dflash.bench.tp_allreduce`, bf16, calls captured "
            f"in a CUDA graph, NVLink multicast off; {provenance_note(d, name)}): the one-shot all-reduce over peer memory "
            f"takes {min(r['oneshot_us'] for r in small):.1f}-{max(r['oneshot_us'] for r in small):.1f} us per call up to "
            f"{small[-1]['bytes'] // 1024} KB against NCCL's {min(r['nccl_us'] for r in small):.1f}-"
            f"{max(r['nccl_us'] for r in small):.1f} us. With the residual add + RMSNorm after it (hidden "
            f"{one['hidden']}), NCCL + norm / one-shot + norm / one fused kernel: {one['nccl_norm_us']:.1f} / "
            f"{one['oneshot_norm_us']:.1f} / {one['fused_us']:.1f} us at {one['rows']} row, {last['nccl_norm_us']:.1f} / "
            f"{last['oneshot_norm_us']:.1f} / {last['fused_us']:.1f} us at {last['rows']} rows: the fused kernel (its "
            "barriers meet all peers at once) ties one-shot + norm from two rows on and loses at one, so no row count "
            "takes it by default (`allreduce.FUSED_MAX_ROWS` = 0). At 4 ranks on a 4x H200 host the one-shot kernel "
            "alone took 7.1-8.6 us per call up to 64 KB against NCCL's 23.7-28.0 (`tp_h200x4/README.md`). Rows up to "
            "`allreduce.LAMPORT_MAX_ROWS` (64) now take a third kernel, without barriers: each rank stores its rows "
            "into the peers' buffers and polls its own for them (Lamport's protocol, as TensorRT-LLM's and "
            "FlashInfer's small all-reduces do), fused with the add + RMSNorm; in the TP 2 step it takes 5.3 us a "
            "call, norm included (`tp_h200x2_lamport/README.md`). " + _lamport_alone(results) + "\n")


def _lamport_alone(results: Path) -> str:
    """The Lamport kernel alone, timed beside NCCL and torch's one-shot in one later run."""
    name = "tp_h200x2_fused_norm/tp_allreduce_h200x2.json"
    d = _load(results, name)
    rows = [r for r in d["rows"] if "lamport_us" in r and r["bytes"] <= 64 * 1024]
    fused = [r for r in d["add_norm_rows"] if "lamport_us" in r and r["bytes"] <= 64 * 1024]
    span = lambda key, rs: f"{min(r[key] for r in rs):.1f}-{max(r[key] for r in rs):.1f}"   # noqa: E731
    return (f"Alone ({provenance_note(d, name)}), up to 64 KB: {span('lamport_us', rows)} us a call against torch's "
            f"one-shot {span('oneshot_us', rows)} and NCCL {span('nccl_us', rows)}; with the add + RMSNorm "
            f"{span('lamport_us', fused)} us. Its largest message, 512 KB (64 rows of 4096, a full slot), stalled "
            "there; the file's note and the folder's README say what is known.")


def render_gpt_oss_tp(results: Path) -> str:
    """gpt-oss-120b at TP 2 on the fused all-reduce + add + RMSNorm path (bench/gpt_oss_tp.py, 2x H200)."""
    name = "tp_h200x2_fused_norm/gpt_oss_120b_tp2_triton_kernels_h200x2.json"
    d = _load(results, name)
    tp2, tp1 = d["summary"]["tp2_ep1"], d["summary"]["tp1"]
    text = ("gpt-oss-120b at TP 2 (`bash benchmarks/gpt_oss_gpu.sh tp2`: `mpirun -n 2 python -m "
            "trtllm_dflash.bench.gpt_oss_tp`, tokens at TP 2 against TP 1 on a tiny float32 gpt-oss, then AR and DFlash "
            "steps at batch 1 and 64 with per-rank rooflines; the same under `mpiexec -n 2` on the CPU in the tests; "
            f"{provenance_note(d, name)}): on 2x H200, EP 1, with the all-reduces fused into the add + RMSNorm, the AR "
            f"step at batch 1 takes {tp2['ar_b1_ms']:.2f} ms at TP 2 against {tp1['ar_b1_ms']:.2f} at TP 1 "
            f"({tp2['ar_b1_ms'] / tp1['ar_b1_ms']:.2f}x; goal 0.6x), DFlash (block {d['block_size']}) "
            f"{tp2['dflash_b1_ms']:.2f} against {tp1['dflash_b1_ms']:.2f}; at batch 64 AR {tp2['ar_b64_ms']:.1f} against "
            f"{tp1['ar_b64_ms']:.1f} ms; tokens == TP 1: {'yes' if tp2['tokens_equal_tp1'] else 'NO'} "
            "(`tp_h200x2_fused_norm/README.md`).")
    return "\n".join(textwrap.wrap(text, 115)) + "\n"


def render_gpt_oss(results: Path) -> str:
    """gpt-oss-20b step cost, bf16 experts."""
    name = "gpt_oss_20b_step_h100.json"
    d = _load(results, name)
    # bf16 experts under uniform routing: a later MXFP4 run (--compare_dequant) holds these rows next to its own
    g = {(r["step"], r["block_size"], r["batch"]): r["median_ms"] for r in d["results"] if r["mode"] == "graph"
         and r.get("experts", "dequant") == "dequant" and r.get("routing", "uniform") == "uniform" and "median_ms" in r}
    blocks = sorted({bs for (s, bs, _) in g if s == "dflash"})
    big = max(b for (_, _, b) in g)
    ar1 = g[("ar", 1, 1)]
    d1 = " / ".join(f"{g[('dflash', bs, 1)]:.1f} ms (block {bs})" for bs in blocks)
    dbig = " / ".join(f"{g[('dflash', bs, big)]:.1f}" for bs in blocks)
    need = min(g[("dflash", bs, 1)] for bs in blocks) / ar1
    return (f"- **gpt-oss-20b shapes** (random bf16, H100, ctx {d['shapes']['ctx']}, `python -m trtllm_dflash.bench.gpt_oss_step`; "
            f"{provenance_note(d, name)}): AR step {ar1:.1f} ms, DFlash step {d1} at batch 1; "
            f"{g[('ar', 1, big)]:.1f} / {dbig} ms at batch {big}: a drafter must average {need:.1f} tokens per step "
            f"to win at batch 1.\n")


def render_sweep(results: Path) -> str:
    """Sweep, SmolLM2-135M AR vs DFlash with the v1 drafter."""
    name = "sweep_smollm2_h100.jsonl"
    rows = _load(results, name)
    al = [r["metrics"]["acceptance_length_mean"] for r in rows if r["settings"]["mode"] == "dflash"]
    table = (results / "sweep_smollm2_h100" / "iso_interactivity.md").read_text()
    ratios = [float(x) for x in re.findall(r"\| ([0-9.]+)x \|", table)]
    sha = rows[0]["versions"].get("git_sha") or "none"
    concs = sorted({r["settings"]["concurrency"] for r in rows})
    return (f"- **Sweep, SmolLM2-135M AR vs DFlash with the v1 drafter** (H100, HumanEval prompts, <= "
            f"{rows[0]['settings']['max_new_tokens']} new tokens, concurrency {concs[0]}..{concs[-1]}, "
            f"`bash benchmarks/gpu_smollm2.sh sweep`; `benchmarks/results/sweep_smollm2_h100/`, {_legacy_note(sha)}, "
            f"no checkpoint sha256): acceptance length "
            f"{min(al):.2f}-{max(al):.2f}, and DFlash/AR throughput at equal interactivity between {min(ratios):.2f}x "
            f"and {max(ratios):.2f}x.\n")


def render_sweep_v2(results: Path) -> str:
    """Sweep v2, AR vs DFlash fixed vs DFlash adaptive."""
    name = "sweep_smollm2_h100_v2.summary.json"
    d = _load(results, name)
    s = d["summary"]
    rows = _load(results, "sweep_smollm2_h100_v2.jsonl")
    concs = sorted({r["settings"]["concurrency"] for r in rows})
    nreq = sorted({r["settings"]["num_requests"] for r in rows})
    al = {m: [r["metrics"]["acceptance_length_mean"] for r in rows if r["label"] == m] for m in ("DFlash", "DFlash adaptive")}
    return (f"- **Sweep v2: AR vs DFlash fixed (block 16) vs DFlash adaptive** (SmolLM2-135M + v1 drafter, H100, "
            f"HumanEval prompts, <= {rows[0]['settings']['max_new_tokens']} new tokens, concurrency {concs[0]}..{concs[-1]}, "
            f"{'/'.join(map(str, nreq))} requests per level, `bash benchmarks/gpu_smollm2.sh sweep2`; "
            f"{provenance_note(d, name)}): throughput at equal interactivity, adaptive / AR "
            f"{s['min_adaptive_over_ar_iso_interactivity']:.2f}x-{s['max_adaptive_over_ar_iso_interactivity']:.2f}x, "
            f"fixed / AR {s['min_fixed_over_ar_iso_interactivity']:.2f}x-{s['max_fixed_over_ar_iso_interactivity']:.2f}x; "
            f"acceptance length fixed {min(al['DFlash']):.2f}-{max(al['DFlash']):.2f}, adaptive "
            f"{min(al['DFlash adaptive']):.2f}-{max(al['DFlash adaptive']):.2f}. The goal (adaptive >= AR at every level) "
            f"is **not met**: the policy's cost table and a tau of ~1.5 leave little to win on a 135M target, and its "
            f"choices lose more than they save at mid concurrency. Mean inter-token gap at concurrency 64 is "
            f"{s['itl_c64_over_steady_b64']:.1f}x a steady batch of 64 (goal 1.5x): admission still stalls running "
            f"requests.\n\n  ![Pareto v2](benchmarks/results/sweep_smollm2_h100_v2/pareto.png)\n")


def _smollm2_rows(d: dict) -> list[dict]:
    rows = d.get("smollm2") or []
    return [rows] if isinstance(rows, dict) else rows   # legacy files hold one bf16 dict


def _cuda_rows(d: dict) -> list[str]:
    out = _table_head("model", "dtype", "prompts", "DFlash == AR greedy", "AR == HF greedy", "DFlash == AR sampled")
    for r in d.get("tiny", []):
        out.append(f"| tiny random {r['arch']} | {r['dtype']} | {r['n']} | {r['dflash_eq_ar_greedy']}/{r['n']} | "
                   f"{r['ar_eq_hf_greedy']}/{r['n']} | {r['dflash_eq_ar_sampled']}/{r['n']} |")
    for s in _smollm2_rows(d):
        n = s["n_prompts"]
        divs = s.get("divergences")
        if divs is not None:   # the margin is the float32 logit gap between the two tokens that diverged
            note = "; ".join(f"prompt {x['prompt']} at token {x['position']}, float32 margin {x['f32_margin']:.2f}"
                             f"{'' if x['allowed'] else ' (NOT a float32 top-2 near-tie)'}" for x in divs)
        else:
            note = ", ".join(f"after {x} tokens" for x in s.get("diverged_at", []) if x is not None)
        tau = f", tau {s['tau']:.2f}" if "tau" in s else ""
        out.append(f"| SmolLM2-135M{' + v1 drafter' if 'tau' in s else ''} | {s.get('dtype', 'bfloat16')} | {n} | "
                   f"{s['dflash_eq_ar_greedy']}/{n}{tau}{f' (diverged: {note})' if note else ''} | - | - |")
    return out


def _cuda_policy(d: dict) -> list[str]:
    """Each SmolLM2 row's policy beside its agreement, and who re-judged the verdicts after the run."""
    lines = [f"- SmolLM2 {s['dtype']}: DFlash == AR greedy on {s['dflash_eq_ar_greedy']} of {s['n_prompts']} prompts; "
             f"policy \"{s['policy']}\": **{'met' if s['policy_met'] else 'NOT met'}**"
             + (f" (divergences that are not float32 top-2 near-ties: {sum(not x['allowed'] for x in s['divergences'])} "
                f"of {len(s['divergences'])})" if not s["policy_met"] and s.get("divergences") else "") + "."
             for s in _smollm2_rows(d) if "policy" in s]
    for r in d.get("rejudged", []):
        lines.append(f"- Verdicts re-evaluated on the CPU from the float32 logits the run recorded (`python "
                     f"trtllm_dflash/bench/cuda_check.py --rejudge`, git {r['git']['sha'][:10]}, {r['utc'][:10]}): "
                     f"{'; '.join(r['changed'])}.")
    return lines


def render_cuda_check(results: Path) -> str:
    """Correctness on CUDA."""
    name = "cuda_check_h100.json"
    d = _load(results, name)
    timed = next((s for s in _smollm2_rows(d) if "ar_b1_tok_per_s" in s), None)
    head = (f"**Correctness on CUDA** (`python -m trtllm_dflash.bench.cuda_check --smollm2`, {d.get('gpu', 'GPU')}, torch "
            f"{d.get('torch')}; {provenance_note(d, name)}): every row.")
    tail = _cuda_policy(d)
    if timed:
        tail += ["", f"SmolLM2 bf16 on this GPU: {timed['ar_b1_tok_per_s']:.0f} tok/s AR at batch 1, "
                     f"{timed['ar_b8_tok_per_s']:,.0f} tok/s at batch 8."]
    return "\n".join([head, "", *_cuda_rows(d), "", *tail]).rstrip() + "\n"


def render_gpu_tests(results: Path) -> str:
    """GPU test set."""
    name = "gpu_tests_h100.json"
    if not (results / name).is_file():
        return ("**GPU test set** (`pytest -m gpu`): no report committed yet; on the GPU host `bash "
                f"benchmarks/gpu_smollm2.sh gputests` writes `benchmarks/results/{name}` and `cudacheck` a fresh "
                "`cuda_check_h100.json`.\n")
    d = _load(results, name)
    tests = d["tests"]
    count = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "error", "skipped")}
    seconds = sum(t["seconds"] for t in tests)
    lines = [f"**GPU test set** (`{d['suite'].split(' tests/')[0]}`, {d['provenance']['device'].get('gpu')}; "
             f"{provenance_note(d, name)}): {count['passed']} passed, {count['failed'] + count['error']} failed, "
             f"{count['skipped']} skipped, in {seconds:.0f} s."]
    for t in tests:
        if t["outcome"] != "passed":
            why = (t["message"] or "").splitlines()[0][:140] if t["message"] else ""
            lines.append(f"- {t['outcome']}: `{t['id'].rsplit('.', 1)[-1]}` {why}".rstrip())
    return "\n".join(lines) + "\n"


def render_gpu_tests_kernels(results: Path) -> str:
    """The decode kernels' GPU test reports (trtllm_dflash/bench/gpu_test_report.py files), one line each."""
    files = ("mxfp4_decode_h200/gemv_one_token/gpu_tests_mxfp4_ahead_h200.json",
             "gpu_tests_gemm_gated_tile_h200.json", "gpu_tests_gemm_head_h200.json",
             "mxfp4_decode_h200/gemv_one_token/gpu_tests_mxfp4_down_k256_h200.json",
             "mxfp4_decode_h200/gemv_one_token/gpu_tests_mxfp4_both_k128_h200.json", "gpu_tests_gemm_h200.json",
             "mxfp4_decode_h200/triton_kernels/gpu_tests_triton_kernels_warps4_h200.json",
             "mxfp4_decode_h200/triton_kernels/gpu_tests_triton_kernels_review_h200.json",
             "mxfp4_decode_h200/triton_kernels/gpu_tests_triton_kernels_pack_h200.json",
             "mxfp4_decode_h200/triton_kernels/gpu_tests_triton_kernels_h200.json",
             "mxfp4_decode_h200/tc/gpu_tests_mxfp4_head_h200.json", "mxfp4_decode_h200/tc/gpu_tests_mxfp4_tc_h200.json", "mxfp4_decode_h200/tc/gpu_tests_mxfp4_b5fed6f_h200.json",
             "mxfp4_decode_h200/gemv_block/gpu_tests_mxfp4_gemv_block_h200.json",
             "mxfp4_decode_h200/one_pair/gpu_tests_mxfp4_gpt_oss_h200.json",
             "mxfp4_decode_h200/one_pair/gpu_tests_mxfp4_one_pair_h200.json",
             "tp_h200x2_host_group/gpu_tests_tp_host_group_h200x2.json", "gpu_tests_mxfp4_decode_h200.json",
             "gpu_tests_moe_invariant_h200.json",
             "gpu_tests_generate_h200.json", "gpu_tests_policy_h100.json", "gpu_tests_engine_h200.json",
             "gpu_tests_allreduce_h200x2.json",
             "gpu_tests_kernels_h200.json", "gpu_tests_smollm2_h200.json",
             "gpu_tests_kernels_a_h100.json", "gpu_tests_kernels_b_h100.json", "gpu_tests_sample_h100.json",
             "gpu_tests_smollm2_kernels_h100.json")
    lines = ["**GPU tests of the decode kernels and the engine** (`python -m trtllm_dflash.bench.gpu_test_report`, "
             "as `bash benchmarks/kernels_gpu.sh tests_a|tests_b|smollm2` runs it; newest first, each report names "
             "its GPU and pytest command):"]
    for name in files:
        d = _load(results, name)
        bad = [t["test"].split("::", 1)[1] for t in d["tests"] if t["outcome"] in ("FAILED", "ERROR")]
        gpu = d["provenance"].get("device", {}).get("gpu", "GPU")
        line = f"- {provenance_note(d, name)}, {gpu}: {d['summary']}"
        if bad:
            line += "; failed: " + ", ".join(f"`{b}`" for b in bad)
        if d.get("note"):
            line += f". Note: {d['note'].rstrip('.')}"
        lines.append(line + ".")
    return "\n".join(lines) + "\n"


def render_quant(results: Path) -> str:
    """Quantized SmolLM2 (FP8 on H100, FP8 and NVFP4 on CPU)."""
    h = _load(results, "quant_smollm2_fp8_h100.json")
    f, n = _load(results, "quant_smollm2_fp8.json"), _load(results, "quant_smollm2_nvfp4.json")
    t, a, tf = h["tau"], h["agreement_vs_base"], h["teacher_forced_top1_agreement"]
    w = h["workload"]
    return (
        f"**Quantized SmolLM2, FP8 on H100 with the trained drafter** (`bash benchmarks/gpu_smollm2.sh quant`: ModelOpt "
        f"FP8 PTQ on {h['quant_build']['calib_size']} ShareGPT prompts, then `trtllm_dflash/bench/quant_report.py --n {w['n']} "
        f"--max_new_tokens {w['max_new_tokens']}` on MT-Bench; {provenance_note(h, 'quant_smollm2_fp8_h100.json')}): "
        f"tau {t['base']:.2f} on the bf16 target, {t['weight_only']:.2f} on the FP8 target with weights dequantised, "
        f"{t['fp8_gemm']:.2f} with the FP8 GEMMs (`fp8_gemm`, FP8 activations per token) and {t['act_emulated']:.2f} "
        f"with TensorRT-LLM's static input scales emulated. Greedy first-token agreement with the bf16 target: "
        f"{a['weight_only']['first_token_match_rate']:.2f} weight-only, {a['fp8_gemm']['first_token_match_rate']:.2f} "
        f"fp8_gemm, {a['act_emulated']['first_token_match_rate']:.2f} static; teacher-forced top-1 agreement "
        f"{tf['weight_only']:.2f} weight-only, {tf['act_emulated']:.2f} static.\n"
        f"On CPU (float32, {f['workload']['n']} MT-Bench prompts x {f['workload']['max_new_tokens']} tokens; "
        f"{provenance_note(f, 'quant_smollm2_fp8.json')}, {provenance_note(n, 'quant_smollm2_nvfp4.json')}; NVFP4 runs "
        f"only on Blackwell, so CPU is where we measure it): tau {f['tau']['base']:.2f} base, "
        f"{f['tau']['weight_only']:.2f} FP8, {n['tau']['weight_only']:.2f} NVFP4 weight-only; first-token agreement "
        f"with the base {n['agreement_vs_base']['weight_only']['first_token_match_rate']:.2f} NVFP4 and "
        f"{f['agreement_vs_base']['weight_only']['first_token_match_rate']:.2f} FP8, teacher-forced top-1 "
        f"{n['teacher_forced_top1_agreement']['weight_only']:.2f} NVFP4 and "
        f"{f['teacher_forced_top1_agreement']['weight_only']:.2f} FP8.\n")


def render_fp8_gemm(results: Path) -> str:
    """FP8 GEMMs on Hopper."""
    name = "fp8_gemm_h100.json"
    d = _load(results, name)
    s = d["summary"]
    ar = [v for k, v in s.items() if k.startswith("step_speedup_ar_")]
    df = [v for k, v in s.items() if k.startswith("step_speedup_dflash_")]
    g = [v for k, v in s.items() if k.startswith("linear_graph_speedup_")]
    layers = d["step_model"]["config"]["num_hidden_layers"]
    return (f"**FP8 GEMMs on Hopper** (`python -m trtllm_dflash.bench.fp8_gemm`, {d['meta']['device']}; "
            f"{provenance_note(d, name)}): a Qwen3-8B-shaped FP8 target of {layers} layers steps "
            f"{min(ar + df):.2f}-{max(ar + df):.2f}x faster with `torch._scaled_mm` (per-token activation scales, "
            f"per-row weight scales) than with dequantised bf16 weights (AR {min(ar):.2f}x-{max(ar):.2f}x, DFlash "
            f"{min(df):.2f}x-{max(df):.2f}x). Per GEMM inside CUDA graphs at decode sizes the row-scaled FP8 kernel "
            f"reaches {min(g):.1f}-{max(g):.1f}x of cuBLAS bf16, and the activation quantisation is one more kernel "
            f"per linear.\n")


def render_acceptance(results: Path) -> str:
    """Acceptance of the shipped SmolLM2 drafter."""
    d, meta = _load(results, "acceptance_smollm2.json"), _load(results, "acceptance_smollm2.meta.json")
    summary = _load(results, DRAFTER_RUN + "/summary.json")
    sizes = list(d["humaneval"]["block_sizes"])
    head = (f"**Acceptance of the shipped SmolLM2 drafter** (mean accepted tokens per step, tau; "
            f"{meta['device']}, torch {meta['versions'].get('torch')}, "
            f"all {d['humaneval']['n_prompts']} HumanEval and {d['mtbench']['n_prompts']} MT-Bench first turns, <= "
            f"{meta['args']['max_new_tokens']} new tokens; `python -m trtllm_dflash.bench.acceptance --target smollm2-135m "
            f"--drafter DIR --block_sizes {' '.join(sizes)} --reference --ar_check`; "
            f"{provenance_note(summary, DRAFTER_RUN + '/summary.json')}, drafter sha256 "
            f"{summary['checkpoints']['drafter_shipped_sha256'][:12]}):")
    cols = [c for b in sizes for c in (f"B={b} greedy", f"B={b} T=1")]
    lines = [head, "", *_table_head("dataset", "prompts", *cols, "`dflash` reference package, greedy (ours / ref)")]
    for key, label in (("humaneval", "HumanEval"), ("mtbench", "MT-Bench")):
        r = d[key]
        cells = [f"{r['block_sizes'][b]['tau_greedy']:.2f} | {r['block_sizes'][b]['tau_t1']:.2f}" for b in sizes]
        ref = r["reference"]
        refc = (f"{ref['tau_ours']:.2f} / {ref['tau_reference']:.2f} ({ref['n_prompts']} prompts, {ref['dtype']}, "
                f"{ref['identical_outputs']}/{ref['n_prompts']} identical outputs)")
        lines.append(f"| {label} | {r['n_prompts']} | " + " | ".join(cells) + f" | {refc} |")
    return "\n".join(lines) + "\n"


def average_made(d: dict) -> str:
    """How a drafter that is a weighted mean of earlier ones was made, and what it gained over the one it replaced."""
    parents = d["checkpoints"]["parents"]
    mean = " + ".join(f"{p['weight']} x {v}" for v, p in parents.items())
    first = next(iter(parents))                          # the drafter it replaced
    pairs = d[f"paired_vs_{first}_block_16"][d["shipped"]]   # the summary also holds the means not shipped
    acc = d["acceptance"]
    checks = [sum(acc[k]["ar_check"][f] for k in acc) for f in ("identical_outputs", "n_prompts")]
    gain = "; ".join(f"{label} {pairs[k]['mean_diff']:+.3f} (95% interval {pairs[k]['ci95'][0]:+.3f}.."
                     f"{pairs[k]['ci95'][1]:+.3f})" for k, label in (("humaneval", "HumanEval"), ("mtbench", "MT-Bench")))
    return (f"the weighted mean {mean} (`python -m trtllm_dflash.training.average`; "
            f"{d['tokens_trained_on_all_versions_m']:.0f} M tokens behind it, none added); against {first} on the same "
            f"prompts, block 16: {gain}; DFlash == AR on {checks[0]} of {checks[1]} prompt runs (float32)")


def render_training(results: Path) -> str:
    """The shipped drafter's training run: for a weighted mean of drafters, the newest parent's run."""
    name = DRAFTER_RUN + "/summary.json"
    summary = _load(results, name)
    parents = summary["checkpoints"].get("parents")
    lead = ""
    if parents:
        lead = (f"The shipped drafter is {average_made(summary)} ({provenance_note(summary, name)}). Its "
                f"heavier parent, {list(parents)[-1]}: ")
        name = list(parents.values())[-1]["run"] + "/summary.json"
        summary = _load(results, name)
    run = name.split("/")[0]
    rep = _load(results, run + "/report.json")
    with open(results / run / "loss.csv") as fh:
        rows = list(csv.DictReader(fh))
    last = rows[-5:]
    acc = sum(float(r["acc"]) for r in last) / len(last)
    loss = sum(float(r["loss"]) for r in last) / len(last)
    r, train = summary["regeneration"], rep["train"]
    gpus = f" on {train['ranks']} GPUs, {train['per_rank_batch']} sequences each" if train.get("ranks", 1) > 1 else ""
    return (lead + f"{'the' if lead else 'The'} drafter (`bash benchmarks/gpu_onesitting.sh`: "
            f"{rep['settings']['num_layers']} layers, KD loss with the paper's decay; `benchmarks/results/{run}/`, "
            f"{provenance_note(summary, name).split(', ', 1)[1]}) "
            f"saw {r['prompts']:,} corpus answers regenerated by the target ({r['response_tokens'] / 1e6:.1f} M tokens, "
            f"{r['answer_s'] / 60:.1f} minutes at {r['tok_s'] / 1e3:.1f}k tok/s) for {train['steps']:,} steps at batch "
            f"{train['per_rank_batch'] * train.get('ranks', 1)} ({train['epochs']:.2f} epochs, "
            f"{train['elapsed_s'] / 60:.1f} minutes{gpus}); over its "
            f"last {len(last)} logged rows (steps {last[0]['step']}-{last[-1]['step']}) the training loss averages "
            f"{loss:.2f} and the block accuracy {acc:.3f}.\n")


def render_moe_libraries(results: Path) -> str:
    """One gpt-oss-120b MoE layer on our MXFP4 kernels and on vLLM's Triton MoE kernels (gpt_oss_step --compare)."""
    name = "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_vs_triton_kernels_layouts_h200.json"
    d = _load(results, name)
    hopper, strided = d["moe_layer_vs_triton_kernels"], d["moe_layer_vs_triton_kernels_strided"]
    lines = _table_head("routing", "sequences x tokens", "distinct experts", "ours ms (of HBM bandwidth)",
                        "triton_kernels, its Hopper layout", "triton_kernels on our bytes (strided)", "library speed-up")
    for h, s in zip(hopper, strided):
        lines.append(f"| {h['routing']} | {h['batch']} x {h['block_size']} | {h['distinct_experts']} | "
                     f"{h['ours_ms']:.3f} ({_pct(h['ours_bandwidth_fraction'])}) | "
                     f"{h['triton_kernels_ms']:.3f} ({_pct(h['triton_kernels_bandwidth_fraction'])}) | "
                     f"{s['triton_kernels_strided_ms']:.3f} ({_pct(s['triton_kernels_strided_bandwidth_fraction'])}) | "
                     f"{h['ours_ms'] / h['triton_kernels_ms']:.2f}x |")
    worst = max(max(r["rel_diff"] for r in rows) for rows in (hopper, strided))
    return ("**One gpt-oss-120b MoE layer, ours vs a library** (`python -m trtllm_dflash.bench.gpt_oss_step --target "
            "gpt-oss-120b --compare triton_kernels,triton_kernels_strided --compare_only`, the Triton MoE kernels vLLM "
            "runs gpt-oss on, as vLLM 0.26.0 vendors them; same MXFP4 bytes and routing traces, CUDA graphs, "
            f"{provenance_note(d, name)}; outputs within {worst:.1e} of each other, norm-relative). The library wins "
            "from two tokens up and loses at one; on views of our bytes in its plain layout it is 2-3x slower than in "
            "its own, so `mxfp4_moe=\"triton_kernels\"` (`dflash-build --backend torch --mxfp4_moe triton_kernels`, "
            "RuntimeConfig) pays a second copy of the experts for it. "
            "FlashInfer's fused MoE (`--compare flashinfer`) is wired but not measured yet: its sm90 MoE module "
            "JIT-compiles all of its CUTLASS grouped-GEMM instantiations with the host's nvcc on first use. "
            + _moe_flags_sentence(results) + "\n\n" + "\n".join(lines) + "\n")


def _moe_flags_sentence(results: Path) -> str:
    """The library's opt-flag sweep (gpt_oss_step --compare 'triton_kernels:FLAGS,...'): the adopted default vs vLLM's."""
    name = "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_triton_kernels_flags_h200.json"
    d = _load(results, name)
    sets = [k.removeprefix("moe_layer_vs_") for k in d if k.startswith("moe_layer_vs_")]

    def ms(flags, routing, batch, block):
        row = next(r for r in d[f"moe_layer_vs_{flags}"]
                   if (r["routing"], r["batch"], r["block_size"]) == (routing, batch, block))
        return f"{row[f'{flags}_ms']:.3f}"
    vllm, four = "triton_kernels", "triton_kernels:scale_warps=4"
    return (f"Its tiles, {len(sets)} opt-flag sets side by side (`--compare 'triton_kernels:scale_warps=4,...'`, "
            f"{provenance_note(d, name)}): the scale layout for 4 warps (128-column tiles) ran a block of 10 in "
            f"{ms(four, 'uniform', 1, 10)} ms against {ms(vllm, 'uniform', 1, 10)} with vLLM's 8 warps (uniform), "
            f"{ms(four, 'skewed', 1, 10)} against {ms(vllm, 'skewed', 1, 10)} (skewed) and 4 x 1 tokens in "
            f"{ms(four, 'uniform', 4, 1)} against {ms(vllm, 'uniform', 4, 1)}; non-persistent kernels, block_k 256, "
            "split K and 3 stages were no faster, so 4 warps is the default (`triton_kernels_moe.Flags`) and the "
            "table below, measured before that, runs vLLM's 8.")


def render_gpt_oss_mxfp4(results: Path) -> str:
    """gpt-oss step cost with MXFP4 experts: before the decode kernels (torch attention, 5-kernel experts) and after."""
    files = (("gpt-oss-20b", "H100", "before", "gpt_oss_20b_step_h100_mxfp4.json"),
             ("gpt-oss-20b", "H100", "after", "gpt_oss_20b_step_h100_v2.json"),
             ("gpt-oss-120b", "H200", "before", "gpt_oss_120b_step_h200.json"),
             ("gpt-oss-120b", "H100", "after", "gpt_oss_120b_step_h100.json"),
             ("gpt-oss-120b", "H200", "after (A/B base)", "mxfp4_decode_h200/gpt_oss_120b_step_prev_h200.json"),
             ("gpt-oss-120b", "H200", "+ PTX E2M1 decode", "mxfp4_decode_h200/gpt_oss_120b_step_h200.json"),
             ("gpt-oss-120b", "H200", "+ one-pair K loop", "mxfp4_decode_h200/one_pair/gpt_oss_120b_step_h200.json"),
             ("gpt-oss-120b", "H200", "+ verify block on gemv", "mxfp4_decode_h200/gemv_block/gpt_oss_120b_step_h200.json"),
             ("gpt-oss-120b", "H200", "gemv, A/B base", "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_h200.json"),
             ("gpt-oss-120b", "H200", "+ triton_kernels for 2+ tokens",
              "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_kernels_h200.json"),
             ("gpt-oss-120b", "H200", "+ routing inputs in one kernel",
              "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_kernels_pack_h200.json"),
             ("gpt-oss-120b", "H200", "+ 4-warp scale layout",
              "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_kernels_warps4_h200.json"),
             ("gpt-oss-120b", "H200", "+ split-K GEMM tiles, one-token K steps",
              "mxfp4_decode_h200/triton_kernels/gpt_oss_120b_step_triton_kernels_down_k256_h200.json"),
             ("gpt-oss-120b", "H200", "+ 32-column gate_up / lm_head tiles",
              "gpt_oss_120b_step_triton_kernels_h200.json"))
    lines = _table_head("target, GPU", "decode kernels", "AR step b=1 (roofline)", "DFlash step b=1 (roofline)",
                        "break-even tokens b=1", "kernels per AR step", "experts: us per distinct expert AR / DFlash")
    notes = []

    def profile(d, step):   # gpt_oss_step.profile_key of the run's experts backend
        return d.get(f"profile_{d.get('experts', 'triton')}_{step}_b1") or {}

    for model, gpu, when, name in files:
        d = _load(results, name)
        s = d["summary"]
        per_expert = (f"{s['ar_b1_us_per_distinct_expert']:.1f} / {s['dflash_b1_us_per_distinct_expert']:.1f}"
                      if s.get("ar_b1_us_per_distinct_expert") else "—")
        kernels = profile(d, "ar").get("kernels_per_step")
        lines.append(f"| {model}, {gpu} | {when} | {_ms(s['ar_b1_step_ms'])} ms ({_pct(s['ar_b1_roofline_fraction'])}) | "
                     f"{_ms(s['dflash_b1_step_ms'])} ms, block {s['block_size']} ({_pct(s['dflash_b1_roofline_fraction'])}) | "
                     f"{s['break_even_tokens_b1']:.1f} | {'—' if kernels is None else f'{kernels:.0f}'} | {per_expert} |")
        notes.append(provenance_note(d, name))
    last_file = _load(results, files[-1][3])
    last, skew = last_file["summary"], last_file["routing"]["skewed"]
    proj = ", ".join(f"{k} {v:.2f}x" for k, v in last["projection_end_to_end_speedup_b1"].items())
    first = _load(results, files[3][3])["summary"]["projection_end_to_end_speedup_b1"]
    return ("\n".join(lines) + "\n\nRandom weights at the real shapes, ctx 1024, CUDA graphs; roofline = bytes that must cross "
            "HBM in the step (the distinct experts its tokens chose, at MXFP4 size; random routing is near the worst "
            "case) over the copy bandwidth measured in the same run. The first two 120b rows ran on different GPUs "
            "(H200 4.3 TB/s before, H100 3.0 TB/s after): compare their roofline fractions, not their times; the "
            "next two are one A/B on one H200, minutes apart, the two after ran on other H200s of the same kind, the "
            "two after them are one A/B in one run on one H200 and the last three ran on others: "
            "`mxfp4_moe=\"triton_kernels\"` runs the steps of 2+ tokens on "
            "vLLM's Triton MoE kernels (the triton_kernels package, in its Hopper layout: twice the experts' memory) "
            "and keeps our gemv for one token, where it is faster "
            "(`benchmarks/results/mxfp4_decode_h200/README.md`). "
            f"Under the skewed routing of the last row's file (Zipf {skew['zipf']}, reuse {skew['reuse']}) the DFlash "
            f"step is {_ms(last['dflash_b1_step_ms_skewed'])} ms, break-even {last['break_even_tokens_b1_skewed']:.1f}. "
            "*Projection*, not "
            "a measurement: z-lab's published gpt-oss-120b acceptance (block 10) x AR step / DFlash step at batch 1 "
            f"of the last row (uniform routing) gives {proj} end to end (the H100 'after' row's steps gave "
            f"{', '.join(f'{k} {v:.2f}x' for k, v in first.items())}). Sources: {'; '.join(notes)}.\n")


def _soak_line(results: Path, name: str, label: str, command: str) -> str:
    if not (results / name).is_file():
        attempt = results / f"{name.removesuffix('.json')}_attempt" / "failed_run.txt"
        tried = (f" The last attempt failed before any load (`benchmarks/results/{attempt.parent.name}/"
                 f"{attempt.name}`): the Triton 2.51 python-backend stub read BYTES inputs with numpy 2 on the GPU host "
                 f"and died on the first request." if attempt.is_file() else "")
        return (f"**Soak, {label}**: no report committed yet; `{command}` writes `benchmarks/results/{name}` "
                f"(and the plot beside it).{tried}\n")
    d = _load(results, name)
    s, g, c, st = d["summary"], d["summary"]["goals"], d["checks"], d["settings"]
    server = "dflash-openai" if st.get("server") == "openai" else "dflash-serve"
    faults = Counter(f["fault"] for f in d["faults"])
    rss = c["rss_bounded"]
    yes = (lambda ok: "yes" if ok else "**no**")
    lines = [
        f"**Soak, {label}** (`{command}`, {d['machine']['cpus']} cores shared with other work, load average "
        f"{s['loadavg_1m_mean']:.1f} on average; {provenance_note(d, name)}; plot `{name[:-5]}.png`): "
        f"**{'all checks passed' if s['pass'] else 'checks failed: ' + ', '.join(s['failed_checks'])}**.",
        f"- {s['requests']} requests from {st['streams']} streams in {st['duration']:.0f} s over "
        f"{', '.join(sorted(d['latency']))} ({s['requests_per_s']:.2f} requests/s), with "
        f"{', '.join(f'{n} {k}' for k, n in sorted(faults.items()))} faults"
        + (f" (cases left out: {', '.join(st['skip_cases'])})" if st.get("skip_cases") else "")
        + f": {g['failed_or_wrong_requests']} failed; "
        f"greedy answers equal to the same prompt's answer alone: {c['greedy_equals_solo']['compared']} compared, "
        f"{c['greedy_equals_solo']['wrong']} differ.",
        f"- Latency p50 / p99 (s): " + ", ".join(f"{k} {v[0]:.1f} / {v[1]:.1f}"
                                                 for k, v in sorted(s["latency_s_p50_p99"].items()) if v[0] is not None)
        + ".",
        f"- Active requests back to 0 after the load: {yes(c['slots_free']['pass'])}; RSS of the server's processes "
        f"{rss['baseline_mb']:.0f} -> {rss['end_mb']:.0f} MiB ({100 * rss['growth']:+.1f}%, limit "
        f"{100 * rss['limit']:.0f}%); "
        + (f"finished requests by reason: not compared ({c['metrics_agree']['not_checked']}); "
           if c["metrics_agree"].get("not_checked") else
           f"the metrics endpoint's finished requests by reason equal the clients' count: "
           f"{yes(c['metrics_agree']['pass'])}; ")
        + f"every fault handled in time with the server healthy after: "
        f"{yes(c['faults_handled']['pass'])}.",
    ]
    if d.get("kills"):
        k = g["kill_seconds_until_free"] or {}
        lines.append(f"- {g['kills']} clients killed mid-stream on the idle server: slot free after "
                     f"{k.get('p50', float('nan')):.2f} s (p50; max {g['kill_steps_until_free_max']:.0f} engine steps"
                     + ("" if server == "dflash-openai" else ", the cancellation check runs every 100 ms")
                     + f"); the next request took {g['next_request_latency_over_idle_baseline']:.2f}x the idle latency"
                     + (f"; 6 non-streaming clients that timed out: every slot free after "
                        f"{g['nonstream_timeouts_freed_s']:.2f} s" if g.get("nonstream_timeouts_freed_s") is not None
                        else "") + ".")
    if d.get("sigterm"):
        t = d["sigterm"]
        last = g["sigterm_last_client_end_s"]
        lines.append(f"- SIGTERM with {t['streams']} streams in flight: {t['clients_with_final_in_time']} of "
                     f"{t['streams']} clients got a final response within {st['sigterm_deadline']:.0f} s"
                     + (f" (the last after {last:.1f} s)" if last is not None else "")
                     + f"; {server} exit code {t['dflash_serve_exit_code']}, {len(t['orphans'])} orphan processes, "
                     f"{len(t['shm_left'])} /dev/shm files left.")
    return "\n".join(lines) + "\n"


def render_soak(results: Path) -> str:
    """Soak, SmolLM2-135M demo on CPU."""
    name = "soak_smollm2_cpu.json"
    command = "python -m trtllm_dflash.bench.soak --deployment_dir out/smollm2 --streams 64 --duration_s 600 --sigterm"
    if (results / name).is_file():    # the settings the committed run used
        st = _load(results, name)["settings"]
        command = (f"python -m trtllm_dflash.bench.soak --deployment_dir out/smollm2 --streams {st['streams']} "
                   f"--duration_s {st['duration']:.0f} --kills {st['kills']}{' --sigterm' if st['sigterm'] else ''}")
    return _soak_line(results, name, "SmolLM2-135M demo on CPU", command)


def render_soak_openai(results: Path) -> str:
    name = "soak_smollm2_cpu_openai.json"
    command = "python -m trtllm_dflash.bench.soak --server openai --deployment_dir out/smollm2 --streams 64 --duration_s 600 --sigterm"
    if (results / name).is_file():
        st = _load(results, name)["settings"]
        command = (f"python -m trtllm_dflash.bench.soak --server openai --deployment_dir out/smollm2 --streams {st['streams']} "
                   f"--duration_s {st['duration']:.0f} --kills {st['kills']}{' --sigterm' if st['sigterm'] else ''}")
    return _soak_line(results, name, "dflash-openai, SmolLM2-135M demo on CPU", command)


def render_soak_h100(results: Path) -> str:
    """Soak, SmolLM2-135M pair on one H100."""
    return _soak_line(results, "soak_smollm2_h100.json", "SmolLM2-135M pair on one H100",
                      "bash benchmarks/gpu_smollm2.sh soak")


def render_layer_ops(results: Path) -> str:
    """Ops per decoder layer."""
    data = _load(results, "layer_op_counts.json")
    c = data["cases"]

    def k(key, when="after"):
        return c[key][when]["per_layer"]["cuda_kernels_estimate"]

    def ops(key, when="after"):
        return c[key][when]["per_layer"]["data_ops"]
    return (
        f"- Ops per decoder layer in a decode step, counted on the CPU path (`python -m trtllm_dflash.bench.layer_op_counts "
        f"--baseline {data['baseline'][:7]}`; {provenance_note(data, 'layer_op_counts.json')}; CPU op counts, "
        f"not CUDA kernels): Qwen3 target {ops('qwen3.target_verify')} data ops (before: "
        f"{ops('qwen3.target_verify', 'before')}), the drafter's block layer the same "
        f"{ops('dflash_drafter.drafter_block')} (it is the target's layer), its context write "
        f"{ops('dflash_drafter.drafter_context')}, gpt-oss {ops('gpt_oss.target_verify')}. Counting each chain "
        f"that is compiled on CUDA as one kernel: ~{k('qwen3.target_verify')} launches per Llama/Qwen3 layer "
        f"(before: ~{k('qwen3.target_verify', 'before')}), ~{k('dflash_drafter.drafter_context')} per drafter "
        f"context write, ~{k('gpt_oss.target_verify')} per gpt-oss layer (its norms and RoPE run eagerly).")


def render_http_guard(results: Path) -> str:
    """HTTP guard cost."""
    name = "guard_overhead_cpu.json"
    d = _load(results, name)
    m, r, add = d["medians"], d["ratios_guard_over_direct"], d["guard_adds_ms"]
    st = d["settings"]
    text = (f"**HTTP guard cost** (`{as_run_now(d['provenance']['command'])}`, {d['machine']}, shared with other work; "
            f"{provenance_note(d, name)}; plot `guard_overhead_cpu.png`), medians of {st['reps']} interleaved "
            f"repetitions on one server, through the guard vs straight to Triton's internal port: health round "
            f"trip {_ms(m['guard']['health_ms'])} vs {_ms(m['direct']['health_ms'])} ms (+{add['health_ms']:.2f} ms), "
            f"a 1-token /generate {_ms(m['guard']['generate_ms'])} vs {_ms(m['direct']['generate_ms'])} ms "
            f"({r['generate_ms']:.2f}x), /generate_stream of {st['stream_tokens']} tokens "
            f"{m['guard']['stream_tokens_per_s']:.1f} vs {m['direct']['stream_tokens_per_s']:.1f} tokens/s "
            f"({r['stream_tokens_per_s']:.2f}x), first event {m['guard']['stream_first_s'] * 1e3:.0f} vs "
            f"{m['direct']['stream_first_s'] * 1e3:.0f} ms; same text both ways: "
            f"{'yes' if d['same_greedy_text_both_paths'] else 'NO'}.")
    return "\n".join(textwrap.wrap(text, 115)) + "\n"


RENDERERS = {
    "headline": render_headline,
    "gpt_oss_tp": render_gpt_oss_tp,
    "http_guard": render_http_guard,
    "quickstart_tau": render_quickstart_tau,
    "cpu_parity": render_cpu_parity,
    "quickstart_repeat": render_quickstart_repeat,
    "step_bench": render_step_bench,
    "engine_load": render_engine_load,
    "e2e": render_e2e,
    "bit_exact": render_bit_exact,
    "sweep_v3": render_sweep_v3,
    "e2e_h100": render_e2e_h100,
    "triton_overhead": render_triton_overhead,
    "mxfp4_loop_cost": render_mxfp4_loop_cost,
    "sweep_v4": render_sweep_v4,
    "train_step": render_train_step,
    "step_notes": render_step_notes,
    "layer_ops": render_layer_ops,
    "tp_bench": render_tp_bench,
    "tp_allreduce": render_tp_allreduce,
    "gpt_oss": render_gpt_oss,
    "gpt_oss_mxfp4": render_gpt_oss_mxfp4,
    "moe_libraries": render_moe_libraries,
    "sweep": render_sweep,
    "sweep_v2": render_sweep_v2,
    "cuda_check": render_cuda_check,
    "gpu_tests": render_gpu_tests,
    "gpu_tests_kernels": render_gpu_tests_kernels,
    "quant": render_quant,
    "fp8_gemm": render_fp8_gemm,
    "acceptance": render_acceptance,
    "training": render_training,
    "soak": render_soak,
    "soak_openai": render_soak_openai,
    "soak_h100": render_soak_h100,
}


# ---------------------------------------------------------------------------------------------- driver

def wrap(markdown: str, width: int = 115) -> str:
    """Prose lines wrapped like the rest of the README; table rows and blank lines kept as they are."""
    out = []
    for line in markdown.splitlines():
        if len(line) <= width or line.startswith("|"):
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out.append(textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False))
    return "\n".join(out) + "\n"


def render_readme(text: str, results: Path, renderers: dict = RENDERERS) -> tuple[str, list[str]]:
    """The README with every block re-rendered, and the problems found (unknown or missing blocks)."""
    problems, seen = [], set()

    def fill(m: re.Match) -> str:
        name = m["name"]
        seen.add(name)
        if name not in renderers:
            problems.append(f"README block '{name}' has no renderer in RENDERERS (add render_{name})")
            return m.group(0)
        try:
            body = renderers[name](results)
        except NoCommit as e:   # one sentence in place of the figures; the name alone, so it does not read as a quote
            title = (renderers[name].__doc__ or name).strip().splitlines()[0].rstrip(".")
            body = f"*{title}: awaits a re-measurement with provenance* (the last one, `{e.name}`, {e.why}).\n"
        return m.group(1) + wrap(body) + m.group(4)

    out = BLOCK.sub(fill, text)
    problems += [f"renderer '{n}' has no block in the README (add <!-- results:{n} --> ... <!-- /results:{n} -->)"
                 for n in renderers if n not in seen]
    problems += quote_problems(out, results)
    return out, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Blocks: " + ", ".join(RENDERERS))
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                   help="the folder the figures are read from (default: benchmarks/results)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 and print a diff when a block is stale")
    args = p.parse_args(argv)
    text = args.readme.read_text()
    try:
        new, problems = render_readme(text, args.results)
    except HistoryUnavailable as e:
        print(f"readme_results: cannot check the commits the results files record: {e}", file=sys.stderr)
        return 1
    for msg in problems:
        print(f"readme_results: {msg}", file=sys.stderr)
    if args.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       str(args.readme), "rendered from " + str(args.results)))
            print(f"readme_results: {args.readme} differs from {args.results}; run python scripts/readme_results.py",
                  file=sys.stderr)
            return 1
        return 1 if problems else 0
    if new != text:
        args.readme.write_text(new)
        print(f"readme_results: updated {args.readme}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
