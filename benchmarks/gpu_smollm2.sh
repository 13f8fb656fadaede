#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The SmolLM2 work on one GPU host, one stage per run (logs go to $OUT/<stage>.log, results to $OUT):
#   prep    the packaged SmolLM2 GGUF -> converted into $TRTLLM_DFLASH_CACHE (from OFFLINE_DIR/models when set)
#   regen   the target answers ShareGPT prompts ($SHAREGPT, a JSONL of prompts) -> $OUT/regenerated.tgz
#   train   ModelOpt training + export -> the drafter in $OUT/drafter, train_reports.tgz
#   eval    dflash-bench acceptance (HumanEval, MT-Bench; dflash reference cross-check) -> acceptance_smollm2.*
#   sweep   AR vs DFlash dflash-sweep, concurrency 1..64 -> sweep_smollm2_h100.jsonl
#   sweep2  AR vs DFlash (fixed block) vs DFlash adaptive with the shipped drafter, concurrency 1..64, 64 requests
#           per level (320 at 32 and 64), HumanEval prompts, 128 new tokens -> sweep_smollm2_h100_v2.jsonl, plots,
#           .summary.json (~5 min on an H100). SMOKE=1: a tiny random pair on this machine's CPU, 2 levels
#   sweep3  issue #22: AR vs DFlash fixed vs adaptive in-process at concurrency 1,4,16,64,256 (max_batch_size 256),
#           then concurrency 64 through dflash-openai and Triton (dflash-serve; Triton needs nvidia-pytriton with
#           numpy 1, see `soak`, else it is skipped and the summary says so), 5 waves per level, HumanEval
#           prompts, 128 new tokens -> sweep_smollm2_<gpu>_v3.jsonl, plots, .summary.json (REGEN_TOK_S= fills
#           regen_tok_s_b256 from a separate regeneration run). SMOKE=1: a tiny pair on the CPU, levels 1,4
#   sweep4  issue #31: sweep3 at concurrency 1,16,64,256, with AR and DFlash through dflash-openai and Triton at every
#           level too (AR: the same deployment at block_size 1, deploy3ar) -> sweep_smollm2_<gpu>_v4.jsonl +
#           .summary.json (openai_ar_tok_s_c256, openai_ttft_p50_over_inprocess_c64 besides sweep3's keys); the
#           servers run the engine in its own process. SMOKE=1: CPU toy. RESUME=1 (sweep3, sweep4): keep $OUT's rows and
#           run only the sweeps they lack, so a run its time limit ended goes on in the next
#   quant   ModelOpt FP8 build on the GPU + dflash-bench quant_report (weight-only vs fp8_gemm) -> quant_*.json
#   gputests  pytest -m gpu (every gpu-marked module; the real SmolLM2 from prep's cache) -> gpu_tests_h100.json
#   cudacheck dflash-bench cuda_check --smollm2 (every row, float32 + bf16) -> cuda_check_h100.json
#           (each ~4-5 min on an H100; SMOKE=1 runs either on CPU: gpu tests skip, cuda_check --cpu_smoke)
#   soak    dflash-bench soak: dflash-serve (real Triton 2.51 from nvidia-pytriton) with the SmolLM2 pair on the GPU,
#           64 streams x 3 min, faults, 20 kills, SIGTERM with 16 streams -> soak_smollm2_h100.json + .png (~6 min);
#           SMOKE=1 runs it on CPU (8 streams x 30 s). Triton's python backend misreads BYTES with numpy 2: with
#           OFFLINE_DIR, the wheel set `triton` (benchmarks/offline/triton.txt, numpy 1) runs dflash-serve in a
#           python environment of its own (scripts/offline_host.sh venv), so numpy 1 never reaches the other stages
# The 10x drafter (issue #15; benchmarks/TRAINING_PLAN.md): a corpus built with python -m trtllm_dflash.training.corpus
# in $CORPUS, the run kept in $BIG_RUN:
#   stash        $IN (files packed by python -m trtllm_dflash.training.bundle) -> $BIG_RUN, sha256-checked
#   regen_shards answer corpus shards for REGEN_S s (default 480) -> $OUT/regen-part*.tar + manifest.json
#   train_big    train for TRAIN_S s (default 420) from the last checkpoint (export once finished) -> loss.csv,
#                report.json, checkpoint part 0 (state.json + 4 shard files); loss.png when matplotlib is there
#   ckpt_pull    PART=k: the checkpoint's part k (state.json + 4 shard files)
#   eval_big     acceptance on the exported drafter -> acceptance_big.json, the drafter in 2 shards + index,
#                eval_extra.tgz (tau.csv, drafter config.json, loss.png)
#   SMOKE=1      the same commands on CPU with a tiny corpus/run: seconds to minutes, no GPU (the CPU check)
# A host without network: OFFLINE_DIR, a folder made by scripts/offline_host.sh with the wheel sets `train`
# (benchmarks/offline/train.txt) and `triton` (PART_MB=32 for a copy that limits file sizes: nvidia-pytriton's wheel is
# 53 MB), and in models/ the SmolLM2 GGUF (SmolLM2-135M-Instruct.Q4_1.gguf)
# and sharegpt_prompts.jsonl. Work folders: WORK (default ./work): run/, bigrun/, cache/, corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?usage: $0 wheels|prep|regen|train|eval|sweep|sweep2|sweep3|sweep4|quant|gputests|cudacheck|soak|stash|regen_shards|train_big|ckpt_pull|eval_big}
WORK=${WORK:-$PWD/work}
export TRTLLM_DFLASH_CACHE=${TRTLLM_DFLASH_CACHE:-$WORK/cache} PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SHAREGPT=${SHAREGPT:-sharegpt}           # dflash-train's --data: the ShareGPT package, or a JSONL of prompts
if [ -n "${OFFLINE_DIR:-}" ]; then
  bash scripts/offline_host.sh install "$OFFLINE_DIR"
  [ ! -d "$OFFLINE_DIR/site/train" ] || eval "$(bash scripts/offline_host.sh env "$OFFLINE_DIR" train)"
  [ ! -f "$OFFLINE_DIR/models/sharegpt_prompts.jsonl" ] || SHAREGPT=$OFFLINE_DIR/models/sharegpt_prompts.jsonl
fi
RUN=$WORK/run
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
LOG=$OUT/$STAGE.log
TRAIN=(env DATA="$SHAREGPT" bash benchmarks/train_smollm2_gpu.sh "$RUN")
BIG=(env CORPUS="${CORPUS:-$WORK/corpus}" bash benchmarks/train_smollm2_gpu.sh "${BIG_RUN:-$WORK/bigrun}")
exec > >(tee "$LOG") 2>&1
# Triton 2.51 from nvidia-pytriton with numpy 1: from OFFLINE_DIR's wheel set `triton`, a python environment first
# on PATH for dflash-serve and its stub (the stub runs its interpreter isolated: PYTHONPATH never reaches it; measured
# in tests/serving/test_triton_env.py). The host's scipy/sklearn, built for numpy 2, are hidden in it. Without
# OFFLINE_DIR the host's own python must bring nvidia-pytriton with numpy 1. Returns 1 (says why) when neither holds.
triton_overlay() {
  if [ -n "${OFFLINE_DIR:-}" ] && [ -d "$OFFLINE_DIR/site/triton" ]; then
    HIDE="scipy sklearn" bash scripts/offline_host.sh venv "$OFFLINE_DIR" triton "$WORK/triton_venv" >/dev/null
    export PATH=$WORK/triton_venv/bin:$PATH PYTHONPATH=$OFFLINE_DIR/site/triton:$PYTHONPATH
  elif ! python3 -c "import pytriton, numpy; assert numpy.__version__ < '2'" 2>/dev/null; then
    echo "$STAGE: no Triton with numpy 1: set OFFLINE_DIR to a folder with the wheel set triton" \
      "(benchmarks/offline/triton.txt), or install nvidia-pytriton and numpy<2 on this host"
    return 1
  fi
}
case $STAGE in
  wheels) ;;   # only OFFLINE_DIR's install (above)
  prep)
    GGUF=${OFFLINE_DIR:+$OFFLINE_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    TRTLLM_DFLASH_SMOLLM2_GGUF=${GGUF:-${TRTLLM_DFLASH_SMOLLM2_GGUF:-}} python3 -m trtllm_dflash.checkpoints.packaged
    ;;
  regen)
    STAGES=regenerate "${TRAIN[@]}"
    tar czf "$OUT/regenerated.tgz" -C "$RUN" train/data
    ;;
  train)
    STAGES=train,export "${TRAIN[@]}"
    cp -r "$RUN/train/drafter" "$OUT/"
    tar czf "$OUT/train_reports.tgz" --exclude model.safetensors -C "$RUN" train/report.json train/train_config.json train/loss.csv train/drafter \
      $(cd "$RUN" && ls train/*.png 2>/dev/null)
    ;;
  eval)
    STAGES=eval "${TRAIN[@]}"
    cp "$RUN"/acceptance_smollm2.* "$OUT"/
    ;;
  sweep)
    python3 -m trtllm_dflash.build --target smollm2-135m --drafter "$RUN/train/drafter" --gpu h100 --backend torch \
      --max_batch_size 64 --max_seq_len 2048 --out "$RUN/deploy" --force
    for mode in ar dflash; do
      python3 -m trtllm_dflash.bench.sweep --deployment_dir "$RUN/deploy" --mode $mode --concurrency 1,2,4,8,16,32,64 \
        --dataset humaneval --max_new_tokens 256 --label "SmolLM2-135M $mode" --out "$OUT/sweep_smollm2_h100.jsonl"
    done
    ;;
  sweep2)
    PY=${PYBIN:-python3}
    if [ "${SMOKE:-0}" = 1 ]; then   # the same pipeline at toy size on the CPU
      $PY -c "import sys; from pathlib import Path; from trtllm_dflash.testing import write_tiny_pair; write_tiny_pair(Path(sys.argv[1]))" "$RUN/tiny"
      PAIR=(--target "$RUN/tiny/target" --drafter "$RUN/tiny/drafter" --gpu h100 --max_batch_size 2 --max_seq_len 256)
      LOAD=(--dataset random --input_len 16 --max_new_tokens 16 --ignore_eos --device cpu)
      LEVELS=("1 4" "2 4"); NAME=sweep_smoke; BATCH=2; INPUT=16
    else
      PAIR=(--target smollm2-135m --drafter smollm2-135m-dflash --gpu h100 --max_batch_size 64 --max_seq_len 2048)
      LOAD=(--dataset humaneval --max_new_tokens 128)
      # "levels requests": >= 64 requests per level, 5 waves at 32 and 64 so the ITL there is steady state
      LEVELS=("1,2,4,8,16 64" "32,64 320"); NAME=sweep_smollm2_h100_v2; BATCH=64; INPUT=128
    fi
    $PY -m trtllm_dflash.build "${PAIR[@]}" --backend torch --out "$RUN/deploy2" --force
    rm -f "$OUT/$NAME.jsonl"
    for mode in ar dflash adaptive; do
      for lv in "${LEVELS[@]}"; do
        set -- $lv
        $PY -m trtllm_dflash.bench.sweep --deployment_dir "$RUN/deploy2" --mode $mode --concurrency "$1" --num_requests "$2" \
          "${LOAD[@]}" --out "$OUT/$NAME.jsonl"
      done
    done
    $PY -m trtllm_dflash.bench.plot "$OUT/$NAME.jsonl" --out_dir "$OUT" --title "SmolLM2-135M: AR vs DFlash fixed vs adaptive"
    $PY -m trtllm_dflash.bench.sweep2_summary --sweep "$OUT/$NAME.jsonl" --deployment_dir "$RUN/deploy2" --batch $BATCH \
      --input_len $INPUT --out "$OUT/$NAME.summary.json"
    ;;
  sweep3|sweep4)
    # Issue #22: AR vs DFlash fixed vs DFlash adaptive in-process at concurrency 1..256, then at concurrency 64 the
    # same prompts through dflash-openai and Triton (dflash-serve); each level 5 waves (num_requests = 5 x
    # concurrency, after concurrency warm-up requests). Budget ~8 min on an H100.
    PY=${PYBIN:-python3}
    if [ "${SMOKE:-0}" = 1 ]; then   # the same pipeline at toy size on the CPU
      # the servers take text: a tiny random pair with SmolLM2's tokenizer (tests/serving's tiny deployment)
      $PY -c "import sys; from pathlib import Path; from trtllm_dflash.testing import write_tiny_pair_with_tokenizer as w; \
from trtllm_dflash.checkpoints.packaged import smollm2_target_dir as s; w(Path(sys.argv[1]), s())" "$RUN/tiny3"
      PAIR=(--target "$RUN/tiny3/target" --drafter "$RUN/tiny3/drafter" --gpu cpu --max_batch_size 4 --max_seq_len 256)
      LOAD=(--dataset random --input_len 16 --max_new_tokens 16 --ignore_eos --device cpu)
      LEVELS=1,4; MID=4; TOP=4; NAME=sweep3_smoke; INPUT=16
    else
      # named by the GPU that ran them (h100, h200, ...; GPU_TAG= overrides), which also picks dflash-build's preset
      TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|b300' | tr A-Z a-z)}
      TAG=${TAG:-h100}
      PAIR=(--target smollm2-135m --drafter smollm2-135m-dflash --gpu "$TAG" --max_batch_size 256 --max_seq_len 2048)
      LOAD=(--dataset humaneval --max_new_tokens 128)
      LEVELS=1,4,16,64,256; MID=64; TOP=256; NAME=sweep_smollm2_${TAG}_v3; INPUT=128
    fi
    # sweep4 (issue #31: the engine in its own process): AR and DFlash through both servers at every level
    SERVED=$MID; SERVED_MODES=(dflash)
    if [ "$STAGE" = sweep4 ]; then
      SERVED_MODES=(dflash ar)
      if [ "${SMOKE:-0}" = 1 ]; then NAME=sweep4_smoke; SERVED=1,4
      else LEVELS=1,16,64,256; SERVED=$LEVELS; NAME=sweep_smollm2_${TAG}_v4; fi
    fi
    # fixed: what dflash-serve runs on a GPU by default, and the in-process DFlash run the servers are compared with
    $PY -m trtllm_dflash.build "${PAIR[@]}" --backend torch --draft_policy fixed --out "$RUN/deploy3" --force
    # the servers' AR runs: the same deployment at block_size 1 (links to its checkpoints; its own Triton repo)
    if [ "$STAGE" = sweep4 ]; then
      $PY -c "import os, sys, shutil; from pathlib import Path; from trtllm_dflash.deployment import Deployment
from trtllm_dflash.serving.repo import fill_triton
src, dst = Path(sys.argv[1]), Path(sys.argv[2]); shutil.rmtree(dst, ignore_errors=True); dst.mkdir(parents=True)
for p in src.iterdir():
    if p.name not in ('manifest.json', 'triton'): os.symlink(p.resolve(), dst / p.name)
m = Deployment.open(src).manifest; m['runtime']['block_size'] = 1
Deployment.write(dst, m); fill_triton(dst, m)" "$RUN/deploy3" "$RUN/deploy3ar"
    fi
    # RESUME=1: keep $OUT's rows and run only the sweeps they lack (one a time limit cut short runs again whole)
    [ "${RESUME:-0}" = 1 ] || rm -f "$OUT/$NAME.jsonl"
    have() { [ "${RESUME:-0}" = 1 ] && $PY -m trtllm_dflash.bench.resume "$OUT/$NAME.jsonl" "$1" "$2"; }
    SWEEP=($PY -m trtllm_dflash.bench.sweep --deployment_dir "$RUN/deploy3" "${LOAD[@]}" --out "$OUT/$NAME.jsonl")
    for mode in ar dflash adaptive; do
      have "$(case $mode in ar) echo AR ;; dflash) echo DFlash ;; *) echo "DFlash adaptive" ;; esac)" $LEVELS && continue
      "${SWEEP[@]}" --mode $mode --concurrency $LEVELS
    done
    NOTES=(); PORT=${PORT:-$((20000 + RANDOM % 20000))}   # the servers listen on PORT, PORT+10..12
    # A server in the background for one sweep at concurrency $MID: started, waited for, stopped by its pid.
    serve_and_sweep() {   # label ready-line sweep-flags... -- server command...
      local label=$1 ready=$2 log=$OUT/$NAME.$1.${MLABEL// /_}.log; shift 2   # one log per server and mode
      have "$MLABEL via $label" $SERVED && return 0
      local flags=(); while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
      setsid "$@" > "$log" 2>&1 &
      local pid=$! t=0 rc=0
      until grep -q "$ready" "$log"; do
        sleep 1; t=$((t + 1))
        if ! kill -0 $pid 2>/dev/null || [ $t -gt 300 ]; then
          echo "$label: not ready (see $log)"; tail -20 "$log"; kill -TERM -- -$pid 2>/dev/null; return 1
        fi
      done
      "${SWEEP[@]}" --mode $MODE --concurrency $SERVED "${flags[@]}" --label "$MLABEL via $label" || rc=$?
      kill -TERM -- -$pid; wait $pid || true
      return $rc
    }
    for MODE in "${SERVED_MODES[@]}"; do
      if [ $MODE = ar ]; then D=deploy3ar MLABEL=AR; else D=deploy3 MLABEL=DFlash; fi
      serve_and_sweep dflash-openai "dflash-openai: ready" --server openai --url 127.0.0.1:$((PORT + 0)) -- \
        $PY -m trtllm_dflash.serving.openai_server "$RUN/$D" --port $((PORT + 0)) --served_model_name deploy3 \
        || NOTES+=(--note "dflash-openai $MODE: the run failed (see $NAME.dflash-openai.$MLABEL.log)")
    done
    if [ "${SMOKE:-0}" = 1 ] || (triton_overlay >/dev/null); then
      for MODE in "${SERVED_MODES[@]}"; do
        if [ $MODE = ar ]; then D=deploy3ar MLABEL=AR; else D=deploy3 MLABEL=DFlash; fi
        (if [ "${SMOKE:-0}" != 1 ]; then triton_overlay || exit 3; fi
         serve_and_sweep Triton "dflash-serve: ready" --server triton --url 127.0.0.1:$((PORT + 11)) -- \
           $PY -m trtllm_dflash.serving.server "$RUN/$D" --http_port $((PORT + 10)) --grpc_port $((PORT + 11)) --metrics_port $((PORT + 12))) \
          || NOTES+=(--note "Triton $MODE: not measured (the run failed; see the log)")
      done
    else
      NOTES+=(--note "Triton: not measured (no nvidia-pytriton with numpy 1 on this host)")
    fi
    $PY -m trtllm_dflash.bench.plot "$OUT/$NAME.jsonl" --out_dir "$OUT" \
      --title "SmolLM2-135M: AR vs DFlash fixed vs adaptive, in-process and served"
    $PY -m trtllm_dflash.bench.sweep2_summary --sweep "$OUT/$NAME.jsonl" --deployment_dir "$RUN/deploy3" --batch $MID --top $TOP \
      --input_len $INPUT ${REGEN_TOK_S:+--regen_tok_s $REGEN_TOK_S} "${NOTES[@]}" --out "$OUT/$NAME.summary.json"
    ;;
  quant)   # the shipped drafter unless a trained one is in $RUN
    DRAFTER=$([ -d "$RUN/train/drafter" ] && echo "$RUN/train/drafter" || echo smollm2-135m-dflash)
    BUILD=(python3 -m trtllm_dflash.build --target smollm2-135m --drafter "$DRAFTER" --gpu h100 --backend torch --force)
    "${BUILD[@]}" --out "$RUN/q_none"
    "${BUILD[@]}" --out "$RUN/q_fp8" --quant fp8 --calib_data "$SHAREGPT"
    python3 -m trtllm_dflash.bench.quant_report --base "$RUN/q_none" --quant "$RUN/q_fp8" --n 80 --max_new_tokens 128 \
      --out "$OUT/quant_smollm2_fp8_h100.json"
    ;;
  gputests)
    python3 -m trtllm_dflash.bench.gpu_tests --skip_cuda_check --out "${OUT:-/tmp}/gpu_tests_h100.json" ${SMOKE:+--cpu_smoke}
    ;;
  cudacheck)
    python3 -m trtllm_dflash.bench.cuda_check --smollm2 --out "${OUT:-/tmp}/cuda_check_h100.json" ${SMOKE:+--cpu_smoke}
    ;;
  soak)
    DRAFTER=$([ -d "$RUN/train/drafter" ] && echo "$RUN/train/drafter" || echo smollm2-135m-dflash)
    if [ -z "${SMOKE:-}" ]; then
      triton_overlay || exit 1
      python3 -I -c "import sys, numpy, torch; print('soak python', sys.executable, sys.version.split()[0], 'numpy', numpy.__version__, numpy.__file__, 'torch', torch.__version__)"
      GPU=h100 BATCH=64 NAME=soak_smollm2_h100${BI:+_bi} SOAK=(--streams 64 --duration_s ${SOAK_DURATION_S:-180} --kills 20)
    else
      GPU=cpu BATCH=8 NAME=soak_smollm2_smoke SOAK=(--streams 8 --duration_s 30 --kills 2 --fault_every_s 5 --prompts 4 --max_tokens 16)
    fi
    # BI=1: the batch-invariant mode on (dflash-build --batch_invariant): the soak's greedy-under-load check is then
    # the bit-exactness of answers under a 64-stream load against the same prompt alone
    python3 -m trtllm_dflash.build --target smollm2-135m --drafter "$DRAFTER" --gpu $GPU --backend torch --force \
      --max_batch_size $BATCH --max_seq_len 2048 ${BI:+--batch_invariant} --out "$RUN/soak_deploy"
    python3 -m trtllm_dflash.bench.soak --deployment_dir "$RUN/soak_deploy" --out "${OUT:-/tmp}/$NAME.json" --sigterm "${SOAK[@]}"
    ;;
  stash|regen_shards|train_big|ckpt_pull|eval_big)
    OUT="$OUT" "${BIG[@]}" --big "$STAGE"
    ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
