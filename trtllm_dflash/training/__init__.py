# SPDX-License-Identifier: Apache-2.0
"""dflash-train's stages, one module each (``trtllm_dflash.train`` runs them in order):

  settings        TrainConfig: every flag, with the paper's defaults; the run's config file name
  target          the target folder (--target) and its tokenizer, for every stage and the evaluation
  prompts         prompt sources (ShareGPT first turns, a JSONL file) minus anything in the evaluation sets
  corpus          the prompt set at scale (every ShareGPT turn + code tasks from real code) as sharded files
  decontaminate   n-gram near-copy detection against HumanEval / MT-Bench
  mask_token      which token id fills the block's unknown slots, and why
  regenerate      stage 1: the target answers every prompt with our runtime -> ``data/regenerated.jsonl``, or
                  shard by shard with a manifest (a corpus folder), resumable across time-limited calls
  batches         that JSONL -> padded, deterministic, resumable training batches
  modelopt_model  the HF target converted by ModelOpt into a DFlash training model (``mtsp.convert``)
  kd_loss         ModelOpt's KD loss in row chunks, never the batch's [rows, vocab] logits (--kd_impl fused)
  batch_probe     before stage 2: s/step at a few batch sizes, train at the most tokens/s (--probe_batch_sizes)
  loop            stage 2: AdamW + warmup/cosine + grad clip, bf16 autocast on CUDA, loss CSV
  checkpoint      pickle-free training checkpoints (weights, AdamW moments, RNG) in < 16 MB files, swapped in atomically
  bundle          a run's shards and checkpoint packed into few bounded files and back (GPU host <-> keeper)
  export          stage 3: ModelOpt export -> canonical z-lab drafter, then checks that our runtime agrees
  report          report.json and the scaling curve PNG (loss, accuracy, tau against training tokens)
"""
