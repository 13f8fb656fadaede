# SPDX-License-Identifier: Apache-2.0
"""Serving a deployment directory with NVIDIA Triton, as TensorRT-LLM's LLM-API Triton model does.

repo.py          fill triton_model_repo/ for one deployment (dflash-build calls fill_triton)
record.py        ServedRequest: one record per request, frontend -> runtime -> frontend; its Results
protocol.py      the tensorrt_llm model's inputs and outputs: validation into a record, response tensors
detokenize.py    token chunks -> text pieces, incrementally (incomplete characters and stop strings held back)
handoff.py       one step's updates -> the frontends, one wake-up per step (not per request)
metrics.py       dflash-openai's Prometheus /metrics (vLLM's names under dflash:)
runtimes.py      the runtime for a deployment's backend: TorchRuntime (scheduler thread, continuous
                 batching) or TrtllmRuntime (tensorrt_llm.LLM), one interface (load_runtime picks it)
engine_core.py   the engine process: the torch runtime's loop alone in its interpreter (rank 0 under TP)
engine_client.py the frontends' side of it: the same interface over ZeroMQ (what load_runtime gives for torch)
engine_protocol.py  its messages (msgpack) and check(): the one validation of a request for the torch runtime
launch.py        tensor parallelism of the torch runtime: mpiexec command for ranks 1..N-1
triton_model.py  what 1/model.py does: requests in, streamed responses out, cancellation, dflash_* metrics
triton_env.py    which tritonserver (NGC on PATH, or the nvidia-pytriton wheel's) and its environment
server.py        dflash-serve: start tritonserver, wait for readiness, stop on SIGTERM/Ctrl-C
client.py        dflash-client: HTTP generate / gRPC stream, prints text as it comes and the DFlash stats
openai_server.py dflash-openai: OpenAI-compatible endpoints (FastAPI + uvicorn) over the same runtimes

The torch runtime runs in an engine process of its own (engine_core.py): dflash-openai and the Triton model
hold an ``EngineClient``, which checks and tokenizes requests, sends them over ZeroMQ, and turns each step's one
message of results into the records' updates below (its receiver thread plays the scheduler thread's part);
the engine process runs the loop below with nothing else in its interpreter. ``load_runtime(...,
engine_process=False)`` keeps the scheduler thread in the frontend's process, as drawn.

One request, one record; one hand-over per engine step for all requests (torch runtime)::

  frontend thread             record (ServedRequest)            scheduler thread (owns Engine.step)
  ---------------             ----------------------            -----------------------------------
  record = ServedRequest(.., handoff=H)
  runtime.submit(record) ---- validates, tokenizes, engine.add_request -> queued (or DFlashError, nothing queued)
                                                                  step(): on_tokens appends (record, Result)
  H's thread: record.push(r)  <---- H.deliver([...all rows...]) -- once per step (handoff.hand_over)
  for r in record.results()/aresults()
     (text decoded here;
      a stop string ends it
      and cancels the slot)
  runtime.cancel(record) ---------------------------------------> engine.cancel: freed at the next step,
                                                                  then the final Result (cancelled)

- ``submit`` runs on the frontend's thread (Triton's execute(), an ASGI handler); it never waits for
  the engine. Per row and step the scheduler thread only appends to a list; after the step it wakes each
  frontend once (dflash-openai: one ``call_soon_threadsafe`` onto its event loop; Triton's model: one put
  on its sender thread's queue): the wake-ups per step do not grow with the batch. Reading and
  detokenizing (incremental: detokenize.py) run on the frontend's side; a slow reader never delays a step.
- The runtime keeps the one map of live requests (``records()``); the frontends keep none.
- Every accepted record gets exactly one final Result (finished=True): ``finish_reason`` stop / length /
  cancelled, or ``error`` when its step failed. A failed step fails only the requests it was stepping;
  steps that keep failing mark the engine broken: ``health()`` says so and ``submit`` refuses
  (``Unavailable``).
- The TensorRT-LLM runtime keeps the same contract with its own asyncio thread in place of the scheduler
  and emits text as well as token ids.
"""
