# SPDX-License-Identifier: Apache-2.0
"""dflash-train on a tiny random Llama with a chat tokenizer (CPU): the whole pipeline (regenerate with our runtime,
ModelOpt training, export, checks), dflash-build and our runtime on the result, loss going down, exact resume."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trtllm_dflash import cli, train
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training import batches, mask_token, prompts, regenerate

ROOT = Path(__file__).resolve().parent.parent


def _modelopt_ok() -> bool:
    if importlib.util.find_spec("modelopt") is None:
        return False
    import transformers
    return tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 15)


needs_modelopt = pytest.mark.skipif(not _modelopt_ok(), reason="needs the modelopt extra (nvidia-modelopt 0.47, "
                                                                "transformers < 5.15)")
MT_BENCH_81 = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
               "experiences and must-see attractions.")
# Short, repetitive user turns; the one MT-Bench question must be dropped as an evaluation overlap.
PROMPTS = [f"Count from {i} to {i + 5}." for i in range(10)] + [f"Repeat the word {w} {n} times." for w, n in
                                                               zip(["cat", "dog", "sun", "sea", "red"] * 2, range(10))]
COMMON = ["--no_exclude_eval", "--block_size", "8", "--num_layers", "2", "--target_layer_ids", "0", "2",
          "--batch_size", "4", "--num_anchors", "16", "--max_seq_len", "160", "--lr", "3e-3", "--quiet"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> Path:
    from tests.bench_acceptance.tiny_chat import write_tiny_chat_target
    return write_tiny_chat_target(tmp_path_factory.mktemp("chat") / "target")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    rows = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    rows.append({"id": "mt81", "messages": [{"role": "user", "content": MT_BENCH_81}, {"role": "assistant",
                                                                                      "content": "(dropped)"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def run_dir(chat_target, prompts_file, tmp_path_factory) -> Path:
    """One full run: 21 prompts (one an MT-Bench overlap), 30 optimizer steps, bf16 export, all checks."""
    out = tmp_path_factory.mktemp("run") / "run"
    argv = ["--target", chat_target, "--data", prompts_file, "--out", out, "--max_new_tokens", "48",
            "--max_steps", "30", "--log_every", "5", "--save_every", "10", *COMMON]
    argv.remove("--no_exclude_eval")  # this run checks the eval-overlap filter
    assert train.main([str(a) for a in argv]) == 0
    return out


@needs_modelopt
def test_pipeline_output_is_canonical_and_checked(run_dir, chat_target):
    report = json.loads((run_dir / "report.json").read_text())
    assert report["data"]["excluded_eval_overlap"] == 1 and report["data"]["rows"] == 20
    assert report["mask_token"] == {"id": 259, "token": "<empty_output>",
                                    "why": "special token '<empty_output>', which the chat template never writes"}
    assert report["data"]["mask_token_in_data"] == 0
    checks = report["export"]
    assert checks["rope"]["ok"] and checks["parity"]["max_rel_diff"] < 1e-4 and checks["greedy"]["identical"] == 4
    cfg = json.loads((run_dir / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 8 and cfg["dflash_config"] == {"mask_token_id": 259, "target_layer_ids": [0, 2]}
    from trtllm_dflash.model_config import rope_parameters
    assert cfg["rope_theta"] == rope_parameters(json.loads((chat_target / "config.json").read_text()))["rope_theta"]
    assert cfg["dflash_trained"] is True and cfg["torch_dtype"] == "bfloat16"
    from safetensors import safe_open
    with safe_open(str(run_dir / "drafter" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_tensor(n).dtype for n in names} == {torch.bfloat16}
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.mlp.down_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert (run_dir / "loss.png").stat().st_size > 1000
    from trtllm_dflash.provenance import checkpoint_digest   # ties the report to the exported drafter's files
    prov = report["provenance"]
    assert prov["git"]["sha"] and prov["versions"]["torch"]
    assert prov["checkpoints"]["drafter"]["sha256"] == checkpoint_digest(run_dir / "drafter")["sha256"]
    assert prov["checkpoints"]["target"]["sha256"] == checkpoint_digest(chat_target)["sha256"]


@needs_modelopt
def test_loss_goes_down(run_dir):
    from trtllm_dflash.training.loop import read_csv

    rows = read_csv(run_dir / "loss.csv")
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30]
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"], rows
    assert rows[-1]["lr"] < rows[0]["lr"]  # cosine decayed


@needs_modelopt
def test_dflash_build_and_the_runtime_take_the_drafter(run_dir, chat_target, tmp_path, capsys):
    from trtllm_dflash.config import RuntimeConfig, SamplingParams
    from trtllm_dflash.runtime.engine import Engine

    out = tmp_path / "deploy"
    rc = cli.build_main(["--target", str(chat_target), "--drafter", str(run_dir / "drafter"), "--gpu", "cpu",
                         "--max_seq_len", "512", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "drafter" / "config.json").read_text())["dflash_config"]["mask_token_id"] == 259
    rows = regenerate.read_rows(run_dir / "data" / regenerate.DATA_FILE)[-3:]
    ps = [r["input_ids"][: r["prompt_len"]] for r in rows]
    sp = SamplingParams(max_new_tokens=40)
    dflash = Engine.from_deployment(out, dtype="float32").generate(ps, sp)
    ar = Engine.from_dirs(chat_target, None, RuntimeConfig(block_size=1, max_seq_len=512)).generate(ps, sp)
    assert [r.output_ids for r in dflash] == [r.output_ids for r in ar]
    assert all(r.stats.acceptance_lengths for r in dflash)


@needs_modelopt
def test_resume_continues_exactly(chat_target, prompts_file, tmp_path, monkeypatch):
    from trtllm_dflash.training import checkpoint, loop

    argv = ["--target", chat_target, "--data", prompts_file, "--num_prompts", "8", "--max_new_tokens", "16",
            "--max_steps", "6", "--save_every", "3", "--log_every", "1", "--stages", "regenerate,train", *COMMON]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train.main([str(a) for a in argv + ["--out", whole]]) == 0
    real_save = checkpoint.save

    def save_then_die(*args, **kw):
        real_save(*args, **kw)
        raise KeyboardInterrupt  # killed right after the step-3 checkpoint

    monkeypatch.setattr(checkpoint, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train.main([str(a) for a in argv + ["--out", cut]])
    monkeypatch.setattr(checkpoint, "save", real_save)
    assert json.loads((cut / "checkpoint" / "state.json").read_text())["step"] == 3
    with pytest.raises(DFlashError, match="holds a previous dflash-train run"):
        train.main([str(a) for a in argv + ["--out", cut]])
    with pytest.raises(DFlashError, match="--lr: is 0.001 but the run"):
        train.main([str(a) for a in argv + ["--out", cut, "--resume", "--lr", "1e-3"]])
    assert train.main([str(a) for a in argv + ["--out", cut, "--resume"]]) == 0
    a, b = _checkpoint_tensors(whole), _checkpoint_tensors(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if not k.startswith("rng."))
    cols = [c for c in loop.COLUMNS if c != "elapsed_s"]
    strip = [[{c: r[c] for c in cols} for r in loop.read_csv(d / "loss.csv")] for d in (whole, cut)]
    assert strip[0] == strip[1] and len(strip[0]) == 6

    from trtllm_dflash.training import export  # a failing stage still leaves its report, and how far it got

    def broken(*args, **kw):
        raise DFlashError("exported drafter", "planted failure")

    monkeypatch.setattr(export, "check_greedy", broken)
    export_argv = [a if a != "regenerate,train" else "export" for a in argv]
    with pytest.raises(DFlashError, match="planted failure"):
        train.main([str(a) for a in export_argv + ["--out", whole, "--resume"]])
    report = json.loads((whole / "report.json").read_text())
    assert report["status"] == "failed: DFlashError: exported drafter: planted failure"
    assert report["export"]["parity"]["ok"] and report["train"]["steps"] == 6  # kept from the earlier run


def _checkpoint_tensors(run: Path) -> dict:
    from trtllm_dflash.training import checkpoint
    folder = run / checkpoint.DIR
    return checkpoint._read_shards(folder, json.loads((folder / "state.json").read_text()))


@needs_modelopt
def test_training_over_several_calls_equals_one_call(chat_target, prompts_file, tmp_path, monkeypatch):
    """--stop_after_s pauses a call with a checkpoint in small shards; calls with --resume continue the step count
    and the LR schedule, and end exactly where one uninterrupted call ends (weights, AdamW state, loss.csv)."""
    from trtllm_dflash.training import checkpoint, loop

    argv = ["--target", chat_target, "--data", prompts_file, "--num_prompts", "8", "--max_new_tokens", "16",
            "--max_steps", "4", "--save_every", "100", "--log_every", "2", "--stages", "regenerate,train",
            "--preset", "modelopt", "--warmup_steps", "1", "--max_seq_len", "160", *COMMON]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train.main([str(a) for a in argv + ["--out", whole]]) == 0
    monkeypatch.setattr(checkpoint, "SHARD_BYTES", 8_000)  # several files, and tensors cut into pieces
    calls = 0
    while True:
        calls += 1
        train.main([str(a) for a in argv + ["--out", cut, "--stop_after_s", "1e-6"] + (["--resume"] * (calls > 1))])
        report = json.loads((cut / "report.json").read_text())
        if not report["train"]["paused"]:
            break
        assert report["train"]["steps"] == 2 * calls and calls < 4  # one log window per call
    assert calls == 2
    meta = json.loads((cut / "checkpoint" / "state.json").read_text())
    assert len(meta["files"]) > 3 and meta["split"] and meta["step"] == 4
    assert all((cut / "checkpoint" / f).stat().st_size < 8_000 + 4_000 for f in meta["files"])
    from trtllm_dflash.training import bundle  # the checkpoint travels in parts of a few files, sha256-checked
    moved = tmp_path / "moved"
    parts = bundle.pack_ckpt(cut, 0, tmp_path / "p0", max_files=4)[1]
    assert parts == -(-len(meta["files"]) // 4)
    for k in range(parts):
        bundle.pack_ckpt(cut, k, tmp_path / f"p{k}", max_files=4)
        assert bundle.unpack(tmp_path / f"p{k}", moved)["checkpoint_missing"] == sorted(meta["files"])[4 * (k + 1):]
    a, b = _checkpoint_tensors(whole), _checkpoint_tensors(moved)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if not k.startswith("rng."))
    cols = [c for c in loop.COLUMNS if c != "elapsed_s"]
    rows = [[{c: r[c] for c in cols} for r in loop.read_csv(d / "loss.csv")] for d in (whole, cut)]
    assert rows[0] == rows[1] and [r["step"] for r in rows[0]] == [2, 4]
    assert rows[0][1]["tokens"] > rows[0][0]["tokens"] > 0
    # The preset's linear schedule, 1 warmup step of 4: step index 1 at the peak, index 3 at 1/3 of it.
    assert [r["lr"] for r in rows[0]] == pytest.approx([3e-3, 1e-3])
    settings = json.loads((whole / "train_config.json").read_text())
    assert (settings["block_size"], settings["num_anchors"], settings["loss_decay_gamma"], settings["lr_schedule"]) \
        == (8, 16, 4.0, "linear")  # flags given on the command line win over the preset


def test_regeneration_time_budget_ends_the_stage(chat_target, prompts_file, tmp_path):
    """A budget that stops admissions must end the stage once the running prompts finish (it once spun forever
    on the prompts it had stopped admitting). A subprocess, so a regression fails on its timeout, not hangs."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "trtllm_dflash.train", "--target", chat_target, "--data", prompts_file,
            "--out", out, "--stages", "regenerate", "--num_prompts", "12", "--max_new_tokens", "8",
            "--regen_batch_size", "2", "--regen_time_budget_s", "0.001", "--device", "cpu", *COMMON]
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    counts = json.loads((out / "data" / regenerate.DONE_FILE).read_text())["counts"]
    rows = regenerate.read_rows(out / "data" / regenerate.DATA_FILE)
    assert counts["time_budget_hit"] and 0 < len(rows) == counts["rows"] < 12
    assert counts["skipped_by_time_budget"] == 12 - len(rows)


def test_regenerated_jsonl_survives_a_torn_write(tmp_path):
    path = tmp_path / regenerate.DATA_FILE
    good = [{"id": "a", "prompt_len": 1, "input_ids": [1, 2], "loss_mask": [0, 1], "finish_reason": "stop"},
            {"id": "b", "prompt_len": 1, "input_ids": [1, 3], "loss_mask": [0, 1], "finish_reason": "length"}]
    text = "".join(json.dumps(r) + "\n" for r in good)
    path.write_text(text + '{"id": "c", "prompt_len": 1, "input_')
    assert regenerate._done_ids(path) == {"a", "b"}
    assert path.read_text() == text  # the torn tail is cut, appends start on a fresh line
    assert regenerate.read_rows(path) == good


def test_batches_are_padded_for_late_anchors_and_reproducible():
    rows = [{"input_ids": list(range(n)), "loss_mask": [0] * 3 + [1] * (n - 3)} for n in (5, 9, 20, 4)]
    data, counts = batches.examples(rows, max_seq_len=16)
    assert counts == {"examples": 3, "dropped_short": 1, "truncated": 1, "supervised_tokens": 2 + 6 + 13}
    stream = batches.BatchStream(data, batch_size=3, block_size=8, seed=1)
    b = stream.batch(1)
    longest = int(b["attention_mask"].sum(1).max())
    assert b["input_ids"].shape[1] % 8 == 0 and b["input_ids"].shape[1] >= longest + 7  # anchor at the last token
    assert torch.equal((b["labels"] != -100), b["attention_mask"].bool() & (b["labels"] == b["input_ids"]))
    again = batches.BatchStream(data, batch_size=3, block_size=8, seed=1).batch(1)
    assert all(torch.equal(b[k], again[k]) for k in b)
    # a coarser pad multiple (rounded up to whole blocks) changes only the padding
    coarse = batches.BatchStream(data, batch_size=3, block_size=8, seed=1, pad_multiple=30).batch(1)
    n = b["input_ids"].shape[1]
    assert n == 24 and coarse["input_ids"].shape[1] == 32 and torch.equal(coarse["input_ids"][:, :n], b["input_ids"])
    assert not coarse["attention_mask"][:, n:].any() and (coarse["labels"][:, n:] == -100).all()


class FakeTokenizer:
    """What mask_token.choose reads from a transformers tokenizer."""

    bos_token_id, eos_token_id, pad_token_id, unk_token_id = 0, 1, 1, None
    mask_token = "<mask>"

    def __init__(self, mask=None, n=10, specials=(), template="<|im_start|>"):
        self.mask_token_id, self.n, self.chat_template = mask, n, template
        self.added_tokens_decoder = {i: SimpleNamespace(content=c, special=True) for i, c in specials}

    def __len__(self):
        return self.n

    def convert_ids_to_tokens(self, i):
        return self.added_tokens_decoder[i].content


def test_mask_token_choice_rules():
    assert mask_token.choose(FakeTokenizer(mask=7), 10)[0] == 7
    assert mask_token.choose(FakeTokenizer(n=8), 10) == (8, "the first embedding row past the tokenizer's 8 tokens "
                                                              "(unused)")
    smol = FakeTokenizer(specials=[(0, "<|endoftext|>"), (1, "<|im_end|>"), (2, "<|im_start|>"), (5, "<file_sep>"),
                                   (6, "<empty_output>")])
    assert mask_token.choose(smol, 10)[0] == 6
    assert mask_token.choose(smol, 10, requested=3) == (3, "given with --mask_token_id")
    with pytest.raises(DFlashError, match="outside the target vocabulary"):
        mask_token.choose(smol, 10, requested=10)
    with pytest.raises(DFlashError, match="no tokenizer"):
        mask_token.choose(None, 10)
    with pytest.raises(DFlashError, match="no unused or special token"):
        mask_token.choose(FakeTokenizer(specials=[(2, "<|im_start|>")]), 10)


def test_prompt_sources_and_eval_overlap(tmp_path):
    evals = prompts.eval_texts(progress=False)
    assert prompts.overlaps("  " + MT_BENCH_81.upper() + "\n", evals)
    assert prompts.overlaps(f"Please answer this: {MT_BENCH_81} Thanks!", evals)
    assert not prompts.overlaps("Count from 1 to 5.", evals)
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n\n{"id": "x", "prompt_ids": [5, 6]}\n'
                    '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, '
                    '{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}\n')
    got = prompts.load_sources(str(path))
    assert [s.id for s in got] == ["1", "x", "4"] and got[1].prompt_ids == (5, 6)
    assert [m["content"] for m in got[2].messages] == ["a", "b", "c"]
    path.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(DFlashError, match="p.jsonl:1: has no prompt_ids, prompt or messages"):
        prompts.load_sources(str(path))


def test_bad_settings_fail_with_one_line(chat_target, tmp_path):
    with pytest.raises(DFlashError, match="ModelOpt 0.47 taps exactly one target layer per draft layer"):
        train.config_from_args(["--target", "t", "--data", "d", "--out", "o", "--num_layers", "3",
                                "--target_layer_ids", "0", "1"])
    from trtllm_dflash.training.modelopt_model import draft_shape
    cfg = train.config_from_args(["--target", "t", "--data", "d", "--out", "o", "--num_layers", "2"])
    with pytest.raises(DFlashError, match=r"repeats a layer"):
        draft_shape(cfg, json.loads((chat_target / "config.json").read_text()))  # 4 layers: the rule gives [1, 1]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(DFlashError, match="is not empty and holds no dflash-train run"):
        train.main(["--target", str(chat_target), "--data", "sharegpt", "--out", str(tmp_path / "junk")])


def test_module_entry_point_and_help():
    res = subprocess.run([sys.executable, "-m", "trtllm_dflash.train", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "--train_time_budget_s" in res.stdout and "examples:" in res.stdout
    res = subprocess.run([sys.executable, "-m", "trtllm_dflash.train", "--target", "t", "--data", "d", "--out",
                          "o", "--block_size", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: --block_size: must be >= 2, got 1. Fix: use 16 (the paper's) or 8"]


def test_stages_do_not_import_the_command():
    """train.py is the command on top of training/: a stage that imported it back made a circle (issue #24)."""
    stages = sorted((ROOT / "trtllm_dflash" / "training").glob("*.py"))
    assert len(stages) > 10
    for path in stages:
        src = path.read_text()
        assert "from ..train import" not in src and "from .. import train" not in src, path.name
        assert "trtllm_dflash.train import" not in src, path.name


@needs_modelopt
@pytest.mark.slow
@pytest.mark.exhaustive   # ~100 s; tests/test_layout.py parses every recipe (bash -n) in the default run
def test_gpu_script_smoke_on_cpu(tmp_path, prompts_file):
    """The GPU pipeline script end to end on the real SmolLM2 (regenerate, ModelOpt training, export + checks,
    acceptance with the reference package) at its --smoke sizes: ~70 s of CPU on a 2-core box. One OpenMP
    thread, as one_torch_thread does in-process: with two, the script's processes spin against any other load
    (5x the CPU time here). The prompts come from a JSONL file, as gpu_smollm2.sh passes them (DATA)."""
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", DATA=str(prompts_file))
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "train_smollm2_gpu.sh"), str(tmp_path), "--smoke"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "train" / "train_config.json").read_text())["data"] == str(prompts_file)
    report = json.loads((tmp_path / "train" / "report.json").read_text())
    assert report["status"] == "ok" and report["mask_token"]["token"] == "<empty_output>"
    assert report["export"]["size_bytes"] < 50e6 and report["export"]["greedy"]["ok"]
    res = json.loads((tmp_path / "acceptance_smollm2.json").read_text())
    assert set(res) == {"humaneval", "mtbench"} and all(r["reference"]["within_tolerance"] for r in res.values())


@needs_modelopt
def test_init_drafter_warm_starts_from_an_exported_drafter(run_dir, chat_target, tmp_path):
    """--init_drafter loads the exported weights into ModelOpt's draft module (the first loss is the trained one's,
    not a random draft's) and refuses a drafter of another shape, naming the field."""
    from safetensors.torch import load_file

    from trtllm_dflash.training import modelopt_model
    from trtllm_dflash.training.settings import TrainConfig

    base = dict(target=str(chat_target), data="x", out=str(tmp_path / "w"), block_size=8, num_layers=2,
                target_layer_ids=(0, 2), num_anchors=16, max_seq_len=160)
    drafter = run_dir / "drafter"
    model, mo_cfg = modelopt_model.build(TrainConfig(**base, init_drafter=str(drafter)), chat_target, 259,
                                         torch.device("cpu"))
    assert mo_cfg["dflash_init_checkpoint"] == str(drafter / "model.safetensors")
    got = model.dflash_module.state_dict()
    want = load_file(str(drafter / "model.safetensors"))
    assert set(want) <= set(got)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor.float()), name
    cold, _ = modelopt_model.build(TrainConfig(**base), chat_target, 259, torch.device("cpu"))
    assert not torch.equal(cold.dflash_module.state_dict()["fc.weight"], want["fc.weight"].float())
    with pytest.raises(DFlashError, match=r"--init_drafter: .* has block_size 8, this run trains 16\. Fix: pass --block_size 8"):
        modelopt_model.build(TrainConfig(**{**base, "block_size": 16}, init_drafter=str(drafter)), chat_target, 259,
                             torch.device("cpu"))
    with pytest.raises(DFlashError, match=r"target_layer_ids \[0, 2\], this run trains \[1, 2\]"):
        modelopt_model.build(TrainConfig(**{**base, "target_layer_ids": (1, 2)}, init_drafter=str(drafter)),
                             chat_target, 259, torch.device("cpu"))
    with pytest.raises(DFlashError, match="--init_drafter: .* holds no config.json"):
        modelopt_model.build(TrainConfig(**base, init_drafter=str(tmp_path)), chat_target, 259, torch.device("cpu"))


def test_regen_samples_on_a_prompt_file_answers_each_prompt_that_often(chat_target, prompts_file, tmp_path):
    base = ["--target", chat_target, "--data", prompts_file, "--stages", "regenerate", "--num_prompts", "3",
            "--max_new_tokens", "8", "--regen_batch_size", "4", "--device", "cpu", *COMMON]
    rows = {}
    for k in (1, 2):
        assert train.main([str(a) for a in base + ["--out", tmp_path / f"k{k}", "--regen_samples", k]]) == 0
        rows[k] = regenerate.read_rows(tmp_path / f"k{k}" / "data" / regenerate.DATA_FILE)
    firsts = sorted((r for r in rows[2] if "#" not in r["id"]), key=lambda r: r["id"])
    assert firsts == sorted(rows[1], key=lambda r: r["id"]) and len(rows[1]) == 3
    assert sorted(r["id"] for r in rows[2] if "#" in r["id"]) == sorted(f"{r['id']}#1" for r in rows[1])
