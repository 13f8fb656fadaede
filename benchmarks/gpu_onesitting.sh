#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The 10x SmolLM2 drafter in one sitting on one GPU host (issue #24): the SAME command every device call,
#   OUT=... bash benchmarks/gpu_onesitting.sh
# does whatever the files that have arrived allow, in order, inside this call's CALL_S seconds, and keeps its
# state on the host (.carry/, kept while the machine stays warm):
#   wheels    install the wheel folders that arrived (.carry/w1, w2; benchmarks/onesitting_carry.sh makes them;
#             w1's tokenizers waits for w2's transformers)
#   prep      once .carry/p0..p3 (the GGUF in 4 parts) are all here: join, sha256-check, convert (~1 min)
#   corpus    .carry/c1 + c2 (the corpus in halves) -> .carry/corpus
#   regen     answer corpus shards; the stage closes at REGEN_S seconds of answering over all calls
#             (--regen_total_s) and training uses what was answered
#   train     first PROBE_S s: s/step at batch sizes PROBE (16 32 64), the most tokens/s wins and TRAIN_S (the
#             whole schedule's seconds, warmup + cosine) becomes a fixed step count; checkpoints every 500 steps,
#             continues in the next call; export + checks once the schedule is done
#   eval      trtllm_dflash/bench/acceptance.py: all 164 HumanEval + 80 MT-Bench first turns, blocks 16/8/4, greedy and
#             T=1, the dflash reference cross-check on 10 prompts each (~4 min on an H100: EVAL_S)
#   e2e       E2E=1: benchmarks/e2e_smollm2.sh with the new pair (AR vs DFlash fixed vs adaptive, ~3 min: E2E_S)
# Each call returns: onesitting.log, onesitting_state.tgz (status.json, loss.csv, tau.csv, report.json,
# batch_probe.json, the regen manifest and the run's settings), and once evaluated acceptance_big.json, the
# drafter as 2 safetensors shards + index, and e2e_smollm2_h100.json (E2E=1): at most 7 files.
# A call that finds nothing to do prints what it waits for and exits 0. If the machine goes back early, a new
# one starts over from prep (the regenerated shards and the checkpoint live on the host; BACKUP=1 also returns
# the shards this call made, for the multi-session path of benchmarks/TRAINING_PLAN.md).
#
# Several GPUs on the host (NGPU, default: the GPUs nvidia-smi lists): regen and train run one rank per GPU under
# torchrun (train_smollm2_gpu.sh --big): each GPU answers its own corpus shards with its own engine, and trains a
# slice of every global batch; rank 0 writes the manifest, loss.csv, checkpoints and the export; eval and e2e
# stay on one GPU. What a 4-GPU host changes, from one H100's numbers (regen 45.9k tok/s: 64,682 answers, 18.0 M
# tokens in 392 s; train 0.28 s/step at batch 32, batch 64 out of memory, 1,017 steps = 0.5 epoch in 285 s):
#   regen   ~4 x 45.9k = ~180k tok/s: the whole corpus in ~100 s of answering (+ each GPU's engine load), so
#           REGEN_S (wall seconds of answering; a shard counts its time / the GPUs of its round) no longer cuts it
#           and the first call has time left to train
#   train   the probe's sizes are per GPU (32 fits, 64 does not): global batch 4 x 32 = 128 at ~0.28 s/step plus
#           a gradient all-reduce of a few ms; TRAIN_S=300 then trains ~1,050 steps = ~135k sequences = ~2 epochs
#           (one GPU: 0.5); 6 epochs take ~900 s of schedule (TRAIN_S=900, about 3 calls with --resume)
#
# SMOKE=1 runs it all on this CPU box with the real SmolLM2 and tiny settings: 2 prompt shards, 16 new tokens,
# a 2 s probe of batches 2 and 4, eval on 2 prompts (see the header of benchmarks/onesitting_carry.sh for the
# .carry folders; SMOKE uses a throwaway site dir and the venv's python).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
BACK=${OUT:?set OUT, the folder whose files come back}
HOST=$PWD/.carry
export BIG_RUN=${BIG_RUN:-$HOST/bigrun} CORPUS=${CORPUS:-$HOST/corpus}
WORK=${WORK:-$HOST/onesitting}       # sub-stage outputs and logs, kept on the host
if [[ ${SMOKE:-0} == 1 ]]; then
  export PATH=$PWD/.venv/bin:$PATH DFLASH_SITE=${DFLASH_SITE:-/tmp/onesitting_smoke_site} PYTHON=python
  CALL_S=${CALL_S:-3000} REGEN_S=${REGEN_S:-600} TRAIN_S=${TRAIN_S:-8} PROBE=${PROBE:-2 4} PROBE_S=${PROBE_S:-2}
  EVAL_S=${EVAL_S:-60} E2E_S=${E2E_S:-60} LOAD_S=5 EXPORT_S=30
else
  export PYTHON=python3
  CALL_S=${CALL_S:-560}    # this call's own budget (device calls stop at 600 s)
  REGEN_S=${REGEN_S:-420}  # seconds of answering, all calls together (35k tok/s: ~14.7 M tokens, ~51k answers)
  TRAIN_S=${TRAIN_S:-300}  # the training schedule's seconds, all calls together (the probe comes on top)
  PROBE=${PROBE:-16 32 64} PROBE_S=${PROBE_S:-60}
  EVAL_S=${EVAL_S:-240} E2E_S=${E2E_S:-200} LOAD_S=60 EXPORT_S=120
fi
export NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}   # >1: regen + train under torchrun
export DFLASH_SITE=${DFLASH_SITE:-/tmp/dflash_site}
export PYTHONPATH=$DFLASH_SITE:$PWD TRTLLM_DFLASH_CACHE=${TRTLLM_DFLASH_CACHE:-$HOST/cache} PYTHONUNBUFFERED=1
# the same dflash-train flags on every call (the run's train_config.json refuses a change on --resume)
export TRAIN_EXTRA="--quiet --regen_total_s $REGEN_S --probe_batch_sizes $PROBE --probe_s $PROBE_S --train_time_budget_s $TRAIN_S"
mkdir -p "$BACK" "$WORK" "$BIG_RUN"
exec > >(tee "$BACK/onesitting.log") 2>&1
left() { echo $(( CALL_S - (SECONDS - T0) )); }
say() { echo "[onesitting +$((SECONDS - T0))s] $*"; }
sub() {   # a stage of the older scripts, its files and log kept under $WORK/<name>
  local name=$1; shift
  mkdir -p "$WORK/$name"
  OUT=$WORK/$name "$@" 2>&1 | tee -a "$WORK/$name.log"
}

# 1. wheels that arrived (gpu_smollm2.sh installs each folder once into $DFLASH_SITE)
sub wheels bash benchmarks/gpu_smollm2.sh wheels
if [[ ! -f $WORK/.imports_ok ]] && ls "$HOST"/w2/*.whl >/dev/null 2>&1 && ls "$HOST"/w1/*.whl >/dev/null 2>&1; then
  "$PYTHON" -c "
import transformers, modelopt.torch.speculative, gguf, dflash.model, tokenizers
assert transformers.__version__ == '5.14.1', transformers.__version__
from trtllm_dflash.data import data_file
print('imports ok: transformers', transformers.__version__, 'tokenizers', tokenizers.__version__,
      'prompts', data_file('humaneval', progress=False).name, data_file('mtbench', progress=False).name)
" && touch "$WORK/.imports_ok"
fi

# 2. the target
TARGET_OK=$TRTLLM_DFLASH_CACHE/smollm2-135m-instruct/.complete
if [[ ! -f $TARGET_OK ]]; then
  n=$(ls "$HOST"/p[0-9]/*.part[0-9][0-9] 2>/dev/null | wc -l)
  if [[ $n -lt ${GGUF_PARTS:-4} ]]; then
    say "waiting: $n of ${GGUF_PARTS:-4} GGUF parts are here (.carry/p0..p3); carry the next one"
  else
    say "prep: join + convert the target"
    sub prep bash benchmarks/gpu_smollm2.sh prep
  fi
fi

# 3. the corpus: the halves that arrived, hard-linked into one folder
for c in "$HOST"/c[0-9]; do
  [[ -f $c/manifest.json ]] || continue
  mkdir -p "$CORPUS"
  for f in "$c"/*; do [[ -e $CORPUS/$(basename "$f") ]] || ln "$f" "$CORPUS/" 2>/dev/null || cp "$f" "$CORPUS/"; done
done

# 3b. a run trained on an earlier host, picked up for eval / e2e: its returned state (onesitting_state.tgz in
#     .carry/restore) and its drafter as shipped in the package (RESTORE_DRAFTER); no corpus needed
RESTORE_DRAFTER=${RESTORE_DRAFTER:-trtllm_dflash/drafters/smollm2-135m-dflash-b16}
if [[ -f $HOST/restore/onesitting_state.tgz && ! -f $BIG_RUN/report.json ]]; then
  say "restore: the run's state from .carry/restore, the drafter from $RESTORE_DRAFTER"
  tar xzf "$HOST/restore/onesitting_state.tgz" -C "$BIG_RUN"
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
READY=$([[ -f $TARGET_OK && -f $CORPUS/manifest.json && -f $WORK/.imports_ok ]] && echo 1 || echo 0)
[[ ${SMOKE:-0} == 1 && -f $TARGET_OK && -f $CORPUS/manifest.json ]] && READY=1   # the venv has every package
# eval and e2e need the target and the packages, not the corpus
EVAL_READY=$([[ -f $TARGET_OK && ( -f $WORK/.imports_ok || ${SMOKE:-0} == 1 ) ]] && echo 1 || echo 0)

# 4. regenerate: this call's share of REGEN_S (no shard starts that would end past the call's budget)
if [[ $READY == 1 && $REGEN_DONE == 0 && $(left) -gt $((LOAD_S + 30)) ]]; then
  say "regen: up to $(( $(left) - 20 )) s in this call, $REGEN_S s in all, on ${NGPU:-1} GPU(s)"
  REGEN_S=$(( $(left) - 20 )) sub regen bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big regen_shards
  if [[ ${BACKUP:-0} == 1 ]]; then cp "$WORK"/regen/regen-part*.tar "$WORK"/regen/manifest.json "$BACK"/ 2>/dev/null || true; fi
  rm -f "$WORK"/regen/regen-part*.tar
  state
fi

# 5. train (+ export once the schedule is done): stop in time to export and hand back
if [[ $READY == 1 && $REGEN_DONE == 1 && $EXPORTED == 0 && $(left) -gt $((LOAD_S + ${PROBE_S%.*} + EXPORT_S + 30)) ]]; then
  probe=$([[ -f $BIG_RUN/batch_probe.json ]] && echo 0 || echo "${PROBE_S%.*}")
  stop=$(( $(left) - LOAD_S - probe - EXPORT_S ))
  say "train: this call trains for up to $stop s (schedule: $TRAIN_S s after the probe)"
  TRAIN_S=$stop sub train bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big train_big
  rm -f "$WORK"/train/*.safetensors "$WORK"/train/state.json
  state
fi

# 6. evaluate the exported drafter
if [[ $EVAL_READY == 1 && $EXPORTED == 1 && $EVALUATED == 0 && $(left) -gt $EVAL_S ]]; then
  say "eval: acceptance.py (HumanEval + MT-Bench, blocks 16/8/4, greedy and T=1, dflash reference)"
  sub eval bash benchmarks/train_smollm2_gpu.sh "$BIG_RUN" --big eval_big
  state
fi

# 7. end to end with the new pair (E2E=1)
if [[ ${E2E:-0} == 1 && $EVALUATED == 1 && $E2E_DONE == 0 && $(left) -gt $E2E_S ]]; then
  say "e2e: AR vs DFlash fixed vs adaptive, concurrency 1/4/16, HumanEval + MT-Bench"
  DRAFTER=$BIG_RUN/drafter sub e2e bash benchmarks/e2e_smollm2.sh
  state
fi

# 8. what comes back: the log, the state, and the results once they exist (at most 7 files)
next_step() {
  if [[ $EXPORTED == 1 && $EVAL_READY == 0 ]]; then echo "carry the next folders (eval)"
  elif [[ $EXPORTED == 0 && $READY == 0 ]]; then echo "carry the next folders"
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
status = {"next": nxt, "call_s": took, "regen": {"shards": len(shards), "rows": sum(e["rows"] for e in shards),
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
  cp "$WORK"/eval/acceptance_big.json "$WORK"/eval/model-*-of-*.safetensors \
    "$WORK"/eval/model.safetensors.index.json "$BACK"/
  # eval_extra.tgz (tau.csv, drafter config.json, the acceptance table) joins the state tarball
  mkdir -p "$WORK/x" && tar xzf "$WORK/eval/eval_extra.tgz" -C "$WORK/x"
  gunzip -f "$BACK/onesitting_state.tgz" && tar rf "$BACK/onesitting_state.tar" -C "$WORK/x" . \
    && gzip -f "$BACK/onesitting_state.tar" && mv "$BACK/onesitting_state.tar.gz" "$BACK/onesitting_state.tgz"
fi
if [[ $EXPORTED == 1 && $EVALUATED == 0 ]]; then
  # the drafter comes back as soon as it is exported: a host given back before eval loses nothing
  "$PYTHON" -m trtllm_dflash.training.carry drafter --run "$BIG_RUN" --out "$BACK"
fi
if [[ $E2E_DONE == 1 ]]; then cp "$WORK"/e2e/e2e_smollm2_h100.json "$WORK"/e2e/e2e_smollm2_h100*.png "$BACK"/ 2>/dev/null || true; fi
say "next: $NEXT (call took $((SECONDS - T0)) s)"
