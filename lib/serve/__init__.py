"""The OpenAI-compatible server on the engine (week 21).

- `lib.serve.openai_api`      the request side of OpenAI's API, checked field by field
- `lib.serve.serving`         the serving loop's core without the network: `ServingLoop`, `TextStream`
- `lib.serve.engine_thread`   the engine thread: `EngineLoop` runs a `ServingLoop` over the engine; `Submission`
- `lib.serve.server_metrics`  /metrics: the lab's names and vLLM's, histograms
- `lib.serve.guided`          JSON mode: a byte-level JSON automaton lifted to a mask over the vocabulary
- `lib.serve.guided_schema`   guided decoding to a JSON Schema
- `lib.serve.server`          the HTTP server (Starlette + uvicorn; `python -m lib.serve.server`, `make serve`)
- `lib.serve.loadtest`        a load test through the official `openai` client: Poisson arrivals, TTFT/TPOT
- `lib.serve.queueing`        a step-level model of a continuous-batching server, simulated (predicting TTFT)
"""
