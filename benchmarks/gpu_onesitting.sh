#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The 10x SmolLM2 drafter in one sitting on one GPU host (issue #24): one command, run again until it says done,
#   OUT=... bash benchmarks/gpu_onesitting.sh
# does, in order, whatever is not done yet inside this run's JOB_S seconds (a scheduler's time limit: a run that
# stops early leaves its state in WORK and BIG_RUN, and the next run continues from there):
#   prep      convert the SmolLM2 target (benchmarks/gpu_smollm2.sh prep; from OFFLINE_DIR/models when set)
#   regen     answer the corpus' shards ($CORPUS, python -m trtllm_dflash.training.corpus); the stage closes at
#             REGEN_S seconds of answering over all runs (--regen_total_s) and training uses what was answered
#   train     first PROBE_S s: s/step at batch sizes PROBE (16 32 64), the most tokens/s wins and TRAIN_S (the
#             whole schedule's seconds, warmup + cosine) becomes a fixed step count; checkpoints every 500 steps,
#             continues in the next run; export + checks once the schedule is done
#   eval      dflash-bench acceptance: all 164 HumanEval + 80 MT-Bench first turns, blocks 16/8/4, greedy and
#             T=1, the dflash reference cross-check on 10 prompts each (~4 min on an H100: EVAL_S)
#   e2e       E2E=1: benchmarks/e2e_smollm2.sh with the new pair (AR vs DFlash fixed vs adaptive, ~3 min: E2E_S)
# Each run writes to OUT: onesitting.log, onesitting_state.tgz (status.json, loss.csv, tau.csv, report.json,
# batch_probe.json, the regen manifest and the run's settings), the drafter once exported, and once evaluated
# acceptance_big.json (+ .meta.json) and e2e_smollm2_h100.json (E2E=1). status.json's "next" says what the next
# run does. BACKUP=1 also copies the shards this run regenerated to OUT (the multi-host path of
# benchmarks/TRAINING_PLAN.md).
# A host without network: OFFLINE_DIR (scripts/offline_host.sh) with the wheel set `train`
# (benchmarks/offline/train.txt) and the SmolLM2 GGUF in models/.
#
# Several GPUs on the host (NGPU, default: the GPUs nvidia-smi lists): regen and train run one rank per GPU under
# torchrun (train_smollm2_gpu.sh --big): each GPU answers its own corpus shards with its own engine, and trains a
# slice of every global batch; rank 0 writes the manifest, loss.csv, checkpoints and the export; eval and e2e
# stay on one GPU. What a 4-GPU host changes, from one H100's numbers (regen 45.9k tok/s: 64,682 answers, 18.0 M
# tokens in 392 s; train 0.28 s/step at batch 32, batch 64 out of memory, 1,017 steps = 0.5 epoch in 285 s):
#   regen   ~4 x 45.9k = ~180k tok/s: the whole corpus in ~100 s of answering (+ each GPU's engine load), so
#           REGEN_S (wall seconds of answering; a shard counts its time / the GPUs of its round) no longer cuts it
#           and the first run has time left to train
#   train   the probe's sizes are per GPU (32 fits, 64 does not): global batch 4 x 32 = 128 at ~0.28 s/step plus
#           a gradient all-reduce of a few ms; TRAIN_S=300 then trains ~1,050 steps = ~135k sequences = ~2 epochs
#           (one GPU: 0.5); 6 epochs take ~900 s of schedule (TRAIN_S=900, about 3 runs with --resume)
#
# SMOKE=1 runs it all on this CPU box with the real SmolLM2 and tiny settings: 2 prompt shards, 16 new tokens,
# a 2 s probe of batches 2 and 4, eval on 2 prompts (the venv's python).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
BACK=${OUT:?set OUT, the results folder of this run}
WORK=${WORK:-$PWD/work/onesitting}    # sub-stage outputs and logs, kept between runs
export BIG_RUN=${BIG_RUN:-$PWD/work/bigrun} CORPUS=${CORPUS:-$PWD/work/corpus}
if [[ ${SMOKE:-0} == 1 ]]; then
  export PATH=$PWD/.venv/bin:$PATH PYTHON=python
  JOB_S=${JOB_S:-3000} REGEN_S=${REGEN_S:-600} TRAIN_S=${TRAIN_S:-8} PROBE=${PROBE:-2 4} PROBE_S=${PROBE_S:-2}
  EVAL_S=${EVAL_S:-60} E2E_S=${E2E_S:-60} LOAD_S=5 EXPORT_S=30
else
  export PYTHON=python3
  JOB_S=${JOB_S:-3600}     # this run's time limit
  REGEN_S=${REGEN_S:-420}  # seconds of answering, all runs together (35k tok/s: ~14.7 M tokens, ~51k answers)
  TRAIN_S=${TRAIN_S:-300}  # the training schedule's seconds, all runs together (the probe comes on top)
  PROBE=${PROBE:-16 32 64} PROBE_S=${PROBE_S:-60}
  EVAL_S=${EVAL_S:-240} E2E_S=${E2E_S:-200} LOAD_S=60 EXPORT_S=120
fi
export NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}   # >1: regen + train under torchrun
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TRTLLM_DFLASH_CACHE=${TRTLLM_DFLASH_CACHE:-$PWD/work/cache} \
  PYTHONUNBUFFERED=1
if [[ -n ${OFFLINE_DIR:-} ]]; then
  bash scripts/offline_host.sh install "$OFFLINE_DIR"
  eval "$(bash scripts/offline_host.sh env "$OFFLINE_DIR" train)"
fi
# the same dflash-train flags on every run (the run's train_config.json refuses a change on --resume)
# INIT_DRAFTER: continue from an exported drafter of the same shape (--init_drafter, e.g. smollm2-135m-dflash, the
# shipped one) instead of random weights; TRAIN_FLAGS: more dflash-train flags (e.g. --lr 6e-4), the same every run
export TRAIN_EXTRA="--quiet --regen_total_s $REGEN_S --probe_batch_sizes $PROBE --probe_s $PROBE_S --train_time_budget_s $TRAIN_S${INIT_DRAFTER:+ --init_drafter $INIT_DRAFTER}${TRAIN_FLAGS:+ $TRAIN_FLAGS}"
mkdir -p "$BACK" "$WORK" "$BIG_RUN"
exec > >(tee "$BACK/onesitting.log") 2>&1
left() { echo $(( JOB_S - (SECONDS - T0) )); }
say() { echo "[onesitting +$((SECONDS - T0))s] $*"; }
sub() {   # a stage of the other recipes, its files and log kept under $WORK/<name>
  local name=$1; shift
  mkdir -p "$WORK/$name"
  OUT=$WORK/$name "$@" 2>&1 | tee -a "$WORK/$name.log"
}

# 1. the packages: ModelOpt's DFlash conversion needs transformers 5.14 (checked once)
if [[ ${SMOKE:-0} != 1 && ! -f $WORK/.imports_ok ]]; then
  "$PYTHON" -c "
import transformers, modelopt.torch.speculative, gguf, dflash.model, tokenizers
assert transformers.__version__.startswith('5.14.'), transformers.__version__
from trtllm_dflash.data import data_file
print('imports ok: transformers', transformers.__version__, 'tokenizers', tokenizers.__version__,
      'prompts', data_file('humaneval', progress=False).name, data_file('mtbench', progress=False).name)
" && touch "$WORK/.imports_ok"
fi

# 2. the target
TARGET_OK=$TRTLLM_DFLASH_CACHE/smollm2-135m-instruct/.complete
if [[ ! -f $TARGET_OK ]]; then
  say "prep: convert the target"
  sub prep bash benchmarks/gpu_smollm2.sh prep
fi

# 3. a run trained on an earlier host, picked up for eval / e2e: its onesitting_state.tgz (RESTORE) and its drafter
#    as shipped in the package (RESTORE_DRAFTER)
RESTORE_DRAFTER=${RESTORE_DRAFTER:-trtllm_dflash/drafters/smollm2-135m-dflash-b16}
if [[ -n ${RESTORE:-} && ! -f $BIG_RUN/report.json ]]; then
  say "restore: the run's state from $RESTORE, the drafter from $RESTORE_DRAFTER"
  tar xzf "$RESTORE" -C "$BIG_RUN"
  mkdir -p "$BIG_RUN/drafter" && cp "$RESTORE_DRAFTER"/config.json "$RESTORE_DRAFTER"/model.safetensors "$BIG_RUN/drafter/"
fi

state() {   # where the run is: regen done?, trained?, evaluated?
  REGEN_DONE=$([[ -f $BIG_RUN/data/regenerate.json ]] && echo 1 || echo 0)
  EXPORTED=$([[ -f $BIG_RUN/drafter/model.safetensors && -f $BIG_RUN/report.json ]] \
    && grep -q '"greedy"' "$BIG_RUN/report.json" && echo 1 || echo 0)
  EVALUATED=$([[ -f $WORK/eval/acceptance_big.json ]] && echo 1 || echo 0)
  E2E_DONE=$([[ -f $WORK/e2e/e2e_smollm2_h100.json ]] && echo 1 || echo 0)
}
state
if [[ $REGEN_DONE == 0 && ! -f $CORPUS/manifest.json ]]; then
  echo "error: $CORPUS/manifest.json is missing. Fix: build the corpus" \
    "(python -m trtllm_dflash.training.corpus --out $CORPUS) or set CORPUS" >&2
  exit 2
fi
READY=$([[ -f $TARGET_OK && ( -f $WORK/.imports_ok || ${SMOKE:-0} == 1 ) ]] && echo 1 || echo 0)

# 4. regenerate: this run's share of REGEN_S (no shard starts that would end past the run's time limit)
if [[ $READY == 1 && $REGEN_DONE == 0 && $(left) -gt $((LOAD_S + 30)) ]]; then
  say "regen: up to $(( $(left) - 20 )) s in this run, $REGEN_S s in all, on ${NGPU:-1} GPU(s)"
  # the shards are packed for another host only when BACKUP asks for them (four GPUs make more than one pack holds)
  PACK_REGEN=${BACKUP:-0} REGEN_S=$(( $(left) - 20 )) sub regen bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big regen_shards
  if [[ ${BACKUP:-0} == 1 ]]; then cp "$WORK"/regen/regen-part*.tar "$WORK"/regen/manifest.json "$BACK"/ 2>/dev/null || true; fi
  rm -f "$WORK"/regen/regen-part*.tar
  state
fi

# 5. train (+ export once the schedule is done): stop in time to export before the time limit
if [[ $READY == 1 && $REGEN_DONE == 1 && $EXPORTED == 0 && $(left) -gt $((LOAD_S + ${PROBE_S%.*} + EXPORT_S + 30)) ]]; then
  probe=$([[ -f $BIG_RUN/batch_probe.json ]] && echo 0 || echo "${PROBE_S%.*}")
  stop=$(( $(left) - LOAD_S - probe - EXPORT_S ))
  say "train: this run trains for up to $stop s (schedule: $TRAIN_S s after the probe)"
  TRAIN_S=$stop sub train bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big train_big
  rm -f "$WORK"/train/*.safetensors "$WORK"/train/state.json
  state
fi

# 6. evaluate the exported drafter
if [[ $READY == 1 && $EXPORTED == 1 && $EVALUATED == 0 && $(left) -gt $EVAL_S ]]; then
  say "eval: dflash-bench acceptance (HumanEval + MT-Bench, blocks 16/8/4, greedy and T=1, dflash reference)"
  sub eval bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big eval_big
  state
fi

# 7. end to end with the new pair (E2E=1)
if [[ ${E2E:-0} == 1 && $EVALUATED == 1 && $E2E_DONE == 0 && $(left) -gt $E2E_S ]]; then
  say "e2e: AR vs DFlash fixed vs adaptive, concurrency 1/4/16, HumanEval + MT-Bench"
  DRAFTER=$BIG_RUN/drafter sub e2e bash benchmarks/e2e_smollm2.sh
  state
fi

# 8. the results: the log, the state, and the results once they exist
next_step() {
  if [[ $READY == 0 ]]; then echo "prep (the target or the packages are missing: see the log)"
  elif [[ $REGEN_DONE == 0 ]]; then echo regen
  elif [[ $EXPORTED == 0 ]]; then echo train
  elif [[ $EVALUATED == 0 ]]; then echo eval
  elif [[ ${E2E:-0} == 1 && $E2E_DONE == 0 ]]; then echo e2e
  else echo done; fi
}
NEXT=$(next_step)
"$PYTHON" - "$BIG_RUN" "$WORK/status.json" "$NEXT" $((SECONDS - T0)) <<'PY'
import json, sys
from pathlib import Path
run, out, nxt, took = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def read(p):
    return json.loads(p.read_text()) if p.is_file() else None
manifest = read(run / "data" / "manifest.json") or {"shards": {}}
shards = manifest["shards"].values()
report = read(run / "report.json") or {}
status = {"next": nxt, "run_s": took, "regen": {"shards": len(shards), "rows": sum(e["rows"] for e in shards),
          "response_tokens": sum(e["response_tokens"] for e in shards),
          "answer_s": round(sum(e["elapsed_s"] / e.get("ranks", 1) for e in shards), 1),
          "done": (run / "data" / "regenerate.json").is_file()},
          "batch_probe": read(run / "batch_probe.json"), "train": report.get("train"),
          "export": {k: v for k, v in (report.get("export") or {}).items() if k != "drafter_dir"}}
out.write_text(json.dumps(status, indent=2) + "\n")
print(json.dumps(status))
PY
logs=($(cd "$WORK" && ls status.json regen.log train.log eval.log e2e.log prep.log 2>/dev/null || true))
runf=($(cd "$BIG_RUN" && ls loss.csv tau.csv report.json batch_probe.json train_config.json data/manifest.json \
          data/regenerate.json loss.png 2>/dev/null || true))
tar czf "$BACK/onesitting_state.tgz" -C "$WORK" "${logs[@]}" ${runf[0]:+-C "$BIG_RUN" "${runf[@]}"}
if [[ $EVALUATED == 1 ]]; then
  cp "$WORK"/eval/acceptance_big.json "$WORK"/eval/acceptance_big.meta.json "$WORK"/eval/model-*-of-*.safetensors \
    "$WORK"/eval/model.safetensors.index.json "$BACK"/
  # eval_extra.tgz (tau.csv, drafter config.json, the acceptance table) joins the state tarball
  mkdir -p "$WORK/x" && tar xzf "$WORK/eval/eval_extra.tgz" -C "$WORK/x"
  gunzip -f "$BACK/onesitting_state.tgz" && tar rf "$BACK/onesitting_state.tar" -C "$WORK/x" . \
    && gzip -f "$BACK/onesitting_state.tar" && mv "$BACK/onesitting_state.tar.gz" "$BACK/onesitting_state.tgz"
fi
if [[ $EXPORTED == 1 && $EVALUATED == 0 ]]; then
  # the drafter is in OUT as soon as it is exported: a host lost before eval loses nothing (two shards + index
  # and its config: each file small enough for copies that bound a file's size; our loader reads the shards)
  "$PYTHON" -m trtllm_dflash.training.bundle drafter --run "$BIG_RUN" --out "$BACK/drafter"
  cp "$BIG_RUN/drafter/config.json" "$BACK/drafter/"
fi
if [[ $E2E_DONE == 1 ]]; then cp "$WORK"/e2e/e2e_smollm2_h100.json "$WORK"/e2e/e2e_smollm2_h100*.png "$BACK"/ 2>/dev/null || true; fi
say "next: $NEXT (this run took $((SECONDS - T0)) s)"
