#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole SmolLM2-135M-Instruct drafter pipeline in one command: regenerate ShareGPT answers with the target
# (our runtime) -> train a 3-layer DFlash drafter with ModelOpt -> export + checks -> acceptance on HumanEval and
# MT-Bench (+ the dflash reference package cross-check). Budgeted for ~15 minutes on one H100: stages 1 and 2 stop
# on their time budgets (REGEN_S, TRAIN_S), the schedule still completes its warmup and cosine.
#
#   benchmarks/train_smollm2_gpu.sh OUT_DIR            # GPU run -> OUT_DIR/train/drafter, OUT_DIR/acceptance_smollm2.*
#   benchmarks/train_smollm2_gpu.sh OUT_DIR --smoke    # CPU minutes: same commands with tiny settings (CI)
#   benchmarks/train_smollm2_gpu.sh RUN_DIR --big STAGE # the 10x drafter, one stage per time-limited run:
#       stash | regen_shards | train_big | ckpt_pull | eval_big  (benchmarks/TRAINING_PLAN.md; files -> $OUT)
#       CORPUS (a python -m trtllm_dflash.training.corpus folder), PRESET (paper | modelopt), REGEN_S, TRAIN_S,
#       MAX_STEPS, PART, TRAIN_EXTRA (more dflash-train flags, the same on every run of a training run), PACK_REGEN
#       (1: regen_shards packs the shards it made into OUT for another host); SMOKE=1 runs the same commands with
#       tiny settings on the CPU
#       NGPU (default: the GPUs nvidia-smi lists): with 2 or more, regen_shards and train_big start one rank per
#       GPU (python -m torch.distributed.run --standalone --nproc_per_node $NGPU, i.e. torchrun): shard k of a
#       round to GPU k, each GPU a slice of every global batch (--batch_size is the global batch), rank 0 writes
#
# STAGES (default regenerate,train,export,eval) runs a part, e.g. STAGES=regenerate then STAGES=train,export then
# STAGES=eval on a host whose jobs are time-limited. Re-running with the same OUT_DIR resumes (finished stages
# are kept). PYTHON picks the interpreter (a venv with the modelopt extra and transformers 5.14); offline once
# $TRTLLM_DFLASH_CACHE holds the SmolLM2 folder and the ShareGPT, HumanEval and MT-Bench wheels.
set -euo pipefail
BACK=${OUT:-}   # --big: the env OUT names the folder for this stage's results
OUT=${1:?usage: $0 OUT_DIR [--smoke | --big STAGE]}
MODE=${2:-full}
PY=${PYTHON:-python}
cd "$(dirname "$0")/.."

if [[ $MODE == --smoke ]]; then
  TRAIN=(--num_prompts 12 --max_prompt_len 256 --max_new_tokens 24 --regen_batch_size 12 --max_steps 4 --batch_size 2
         --num_anchors 8 --max_seq_len 384 --save_every 2 --verify_prompts 2 --verify_max_new_tokens 16)
  EVAL=(--n 1 --max_new_tokens 16 --max_batch_size 8 --reference_n 1)
else
  # lr 1e-3 rather than the paper's 6e-4: a few thousand steps instead of 6 epochs of 800k samples.
  TRAIN=(--num_prompts 8000 --max_new_tokens 384 --regen_batch_size 256 --regen_time_budget_s "${REGEN_S:-300}"
         --max_steps 20000 --train_time_budget_s "${TRAIN_S:-400}" --batch_size 16 --num_anchors 128
         --max_seq_len 1024 --lr 1e-3 --save_every 250)
  EVAL=(--max_new_tokens 512 --max_batch_size 128 --reference_n 10)
fi

if [[ $MODE == --big ]]; then
  BIG_STAGE=${3:?usage: $0 RUN_DIR --big stash|regen_shards|train_big|ckpt_pull|eval_big}
  : "${BACK:?set OUT, the results folder of this stage}"
  mkdir -p "$BACK"
  if [[ ${SMOKE:-0} == 1 ]]; then
    RUN_ARGS=(--max_new_tokens 16 --regen_batch_size 8 --batch_size 2 --num_anchors 8 --max_seq_len 384
              --max_steps "${MAX_STEPS:-4}" --save_every 2 --log_every 2 --verify_prompts 2 --verify_max_new_tokens 8)
    EVAL=(--n 2 --max_new_tokens 16 --max_batch_size 8 --block_sizes 16 --ar_check)
  else
    # 6 epochs of ~60k answers at batch 16 = ~22k steps; MAX_STEPS fixes the schedule for every stage of the run.
    RUN_ARGS=(--max_new_tokens 384 --regen_batch_size 256 --batch_size 16 --max_seq_len 1024
              --max_steps "${MAX_STEPS:-22500}" --save_every 500 --log_every 50)
    EVAL=(--max_new_tokens 512 --max_batch_size 128 --block_sizes 16 8 4 --reference --reference_n 10 --ar_check)
  fi
  case ${PRESET:-paper} in  # the recipe is fixed for a run: its train_config.json refuses another on --resume
    paper) RECIPE=(--block_size 16 --num_layers 3 --num_anchors 128 --lr 1e-3) ;;    # today's shipped drafter's
    modelopt) RECIPE=(--preset modelopt) ;;   # ModelOpt's dflash.yaml: B8, 512 anchors, gamma 4, 5 layers, linear
    *) echo "PRESET must be paper or modelopt" >&2; exit 2 ;;
  esac
  NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
  [[ ${NGPU:-0} -ge 1 ]] || NGPU=1
  LAUNCH=("$PY")
  if [[ $NGPU -gt 1 ]]; then LAUNCH=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$NGPU"); fi
  DFT=("${LAUNCH[@]}" -m trtllm_dflash.train --target smollm2-135m --data "${CORPUS:?set CORPUS, a corpus folder}" --out "$OUT"
       --resume --num_prompts 100000000 --loss kd --mask_token_id 16 "${RECIPE[@]}" "${RUN_ARGS[@]}" ${TRAIN_EXTRA:-})
  BUNDLE=("$PY" -m trtllm_dflash.training.bundle)
  case $BIG_STAGE in
    stash)         # a run packed by trtllm_dflash.training.bundle (the folder IN) -> the run on this host
      "${BUNDLE[@]}" unpack "${IN:?set IN, the folder of bundle files}" --run "$OUT" ;;
    regen_shards)  # whole shards until REGEN_S; what this stage made -> tar files + the manifest in OUT
      # (PACK_REGEN=0: the shards stay in the run only, for a host that also trains on them)
      mkdir -p "$OUT/data"
      cp "$OUT/data/manifest.json" "$BACK/.before.json" 2>/dev/null || echo '{"shards": {}}' > "$BACK/.before.json"
      "${DFT[@]}" --stages regenerate --regen_time_budget_s "${REGEN_S:-480}"
      if [[ ${PACK_REGEN:-1} == 1 ]]; then "${BUNDLE[@]}" regen --run "$OUT" --before "$BACK/.before.json" --out "$BACK"; fi
      rm -f "$BACK/.before.json" ;;
    train_big)     # TRAIN_S of training from the last checkpoint; export once the schedule is done
      "${DFT[@]}" --stages train,export --stop_after_s "${TRAIN_S:-420}"
      tar czf "$BACK/train_log.tgz" -C "$OUT" report.json loss.csv $(cd "$OUT" && ls loss.png tau.csv 2>/dev/null)
      "${BUNDLE[@]}" ckpt --run "$OUT" --part 0 --max_files 4 --out "$BACK" ;;
    ckpt_pull)     # the rest of the checkpoint: PART=1, 2, ... (4 shard files each)
      "${BUNDLE[@]}" ckpt --run "$OUT" --part "${PART:?set PART}" --max_files 4 --out "$BACK" ;;
    eval_big)      # acceptance of the exported drafter; its tau joins tau.csv (the scaling curve)
      "$PY" -m trtllm_dflash.bench.acceptance --target smollm2-135m --drafter "$OUT/drafter" --out "$BACK/acceptance_big.json" \
        "${EVAL[@]}"
      "$PY" -m trtllm_dflash.training.report "$OUT" --add_tau "$BACK/acceptance_big.json"
      # 7 files: the JSON, its meta, the log, the drafter's 2 shards + index, and the small rest in one tgz
      tar czf "$BACK/eval_extra.tgz" -C "$OUT" tau.csv drafter/config.json $(cd "$OUT" && ls loss.png 2>/dev/null) \
        -C "$BACK" acceptance_big.md && rm -f "$BACK/acceptance_big.md"
      "${BUNDLE[@]}" drafter --run "$OUT" --out "$BACK" ;;
    *) echo "unknown --big stage $BIG_STAGE" >&2; exit 2 ;;
  esac
  exit 0
fi

STAGES=${STAGES:-regenerate,train,export,eval}
TRAIN_STAGES=$(tr , '\n' <<<"$STAGES" | { grep -v '^eval$' || true; } | paste -sd, -)
if [[ -n $TRAIN_STAGES ]]; then
  "$PY" -m trtllm_dflash.train --target smollm2-135m --data "${DATA:-sharegpt}" --out "$OUT/train" --resume \
    --stages "$TRAIN_STAGES" --block_size 16 --num_layers 3 --loss kd --mask_token_id 16 "${TRAIN[@]}"  # 16 = <empty_output>
fi
[[ ,$STAGES, == *,eval,* ]] || exit 0
"$PY" -m trtllm_dflash.bench.acceptance --target smollm2-135m --drafter "$OUT/train/drafter" \
  --out "$OUT/acceptance_smollm2.json" --block_sizes 16 8 4 --reference "${EVAL[@]}"
