"""Week 21's notebook, sections 4-7: the load ablation, predicting TTFT, end-to-end latency and cost, multi-LoRA.

Called by tools/weeks/week21.py (the notebook's script); split out by job. Figures the prose quotes are rendered
from the committed records at build time (tools.results.recorded_md), so a rebuild follows the records.
"""
from __future__ import annotations

from lib.bench.records import committed
from tools.results import recorded_md
from grader.checks.week21 import TTFT_MAX_PYTHON_LINES

EPYC = "amd-epyc-avx512"


def _packed_vs_plain() -> str:
    """Each machine class's recorded batch-1 decode with lib.modeling.fast's packed weights and with plain F.linear."""
    out = []
    for cls, recs in sorted(committed().items()):
        figs = recs.get("decode", {}).get("figures", {})
        packed = next((k for k in figs if k.startswith("decode b1 n") and k.endswith("(lib.modeling.fast, packed)")), None)
        plain = next((k for k in figs if k.startswith("decode b1 n") and k.endswith("(lib.modeling.fast, F.linear)")), None)
        if packed and plain:
            out.append(f"packed {recorded_md('decode', packed, cls)} against plain "
                       f"{recorded_md('decode', plain, cls)}")
    return "; ".join(out) if out else "no class has both recorded yet"


def _lora_figures() -> list[str]:
    """Every figure of every committed multi-LoRA record (results/<class>/lora.json), rendered."""
    return [f"- {name}: {recorded_md('lora', name, cls)}" for cls, recs in sorted(committed().items())
            if "lora" in recs for name in recs["lora"]["figures"]]


def section_load(nb) -> None:
    nb.md("""
## 4. What each technique buys under load

Now the measurement a user would make before choosing a configuration. `run_load_test` (lib/serve/loadtest.py,
also `python benchmarks/load.py`) sends chat requests through the `openai` client with **Poisson
arrivals** — independent users, exponential gaps — all sharing one system prompt (a help desk's
instructions) and each asking a short question, streamed; per request it records TTFT (submission to the
first streamed token), TPOT (the time per token after the first) and when the last token came, and it samples
the server's KV-cache use from `/metrics`.

The same load runs on four configurations of *your* server, one technique switched on at a time:

| configuration | what changes |
|---|---|
| one at a time | `max_num_seqs=1`: requests queue and run alone (a server without batching) |
| continuous batching | up to 8 requests per step, admitted at the next step (week 19) |
| + prefix caching | the shared system prompt's KV blocks are computed once and reused (week 19) |
| + packed weights | `lib.modeling.fast`'s oneDNN-packed fp32 matmuls, same numbers (week 18's engine work) |

**What a bigger batch costs.** Continuous batching bets that a step of several rows costs much less than
that many steps of one. The cell below times it on this machine: one decode step of the engine at batch 1,
4 and 8, and one step that prefills a chat prompt of this load (section 5 needs all of them), interleaved so
that whatever else the machine does falls on all of them alike.
""")
    nb.code("""
import copy

from lib.batching.engine import LLMEngine
from lib.bench.timing import Conditions, interleaved, report


def chat_prompt(i):
    \"\"\"Token ids of the load test's i-th request: the shared system prompt, then a question.\"\"\"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
    return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids


CHATS = [chat_prompt(i) for i in range(8)]


def decoding(batch):
    \"\"\"A function that runs one decode step of `batch` running requests (their prefills done here).\"\"\"
    engine = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=8)
    for p in CHATS[:batch]:
        engine.add_request(p, 64)
    engine.step()
    return engine.step


prefilling = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=8)


def prefill_step():
    \"\"\"One step that prefills one chat prompt and runs nothing else.\"\"\"
    rid = prefilling.add_request(CHATS[0], 1)
    prefilling.step()
    prefilling.abort(rid)


conditions = Conditions.now()
steps = interleaved({"decode, batch 1": decoding(1), "decode, batch 4": decoding(4), "decode, batch 8": decoding(8),
                     "prefill one prompt": prefill_step}, repeats=5)
print(report(steps, conditions.done()))
STEP = {b: steps[f"decode, batch {b}"].best for b in (1, 4, 8)}  # seconds per decode step, by batch
PREFILL = max(0.0, steps["prefill one prompt"].best - STEP[1])  # what one prompt's prefill adds to a step
# the same, as a load test meets them: through whatever else the machine does (on a quiet one, the same figures)
STEP_TYPICAL = {b: steps[f"decode, batch {b}"].median for b in (1, 4, 8)}
PREFILL_TYPICAL = max(0.0, steps["prefill one prompt"].median - STEP_TYPICAL[1])
print(f"batch 8 makes {8 * STEP[1] / STEP[8]:.1f}× batch 1's tokens per second, with a step {STEP[8] / STEP[1]:.2f}× "
      f"as long; a {len(CHATS[0])}-token chat prompt's prefill adds {1e3 * PREFILL:.0f} ms to a step")
""")
    nb.md(f"""
On the lab's H200 the same engine's batch 8 made {recorded_md('serving', 'decode b8 / b1', 'nvidia-h200')}
batch 1's tokens per second. **Predict before you run**, from your printed ratio: what should batching do to
throughput when requests arrive faster than one server finishes them, and to TPOT? The system prompt is most of
each prompt: what should the prefix cache change — TTFT, TPOT, or both? And packed weights: whether oneDNN's
packed layout beats plain `F.linear` depends on the machine class (recorded: {_packed_vs_plain()}), so your
fourth row measures which holds here.
""")
    nb.code("""
RATE, N_REQUESTS, MAX_TOKENS = 2.0, 8, 16  # arrivals per second, requests per run, tokens per answer
configs = {
    "one at a time": dict(max_num_seqs=1),
    "continuous batching": dict(max_num_seqs=8),
    "+ prefix caching": dict(max_num_seqs=8, prefix_caching=True),
    "+ packed weights": dict(max_num_seqs=8, prefix_caching=True, weights="packed"),
}
rows = {}
conditions = Conditions.now()
for name, kw in tqdm(configs.items(), desc="configurations"):
    served = copy.deepcopy(model) if kw.get("weights") == "packed" else model  # packing is in place: keep ours plain
    srv = make_server(served, tok, num_blocks=256, loop_cls=ServingLoop, text_stream_cls=TextStream, **kw)
    with ServerThread(srv) as base_url:
        rows[name] = run_load_test(base_url, MODEL, RATE, N_REQUESTS, MAX_TOKENS, seed=0, max_seconds=120)
        rows[name]["hit"] = srv.engine.prefix_hit_tokens / max(1, srv.loop.stats["prompt_tokens_total"])
    del served, srv
conditions.done()
print(f"{N_REQUESTS} requests at {RATE}/s, {MAX_TOKENS} tokens each; {conditions.line()}")
print(f"{'configuration':>20} {'ok':>3} {'tok/s':>6} {'TTFT p50':>9} {'p95':>6} {'TPOT p50':>9} {'p95':>7} "
      f"{'KV use':>7} {'prefix hits':>11}")
for name, r in rows.items():
    print(f"{name:>20} {r['ok']:>3} {r['throughput']:>6.1f} {r['ttft50']:>8.2f}s {r['ttft95']:>5.2f}s "
          f"{1e3 * r['tpot50']:>7.0f}ms {1e3 * r['tpot95']:>5.0f}ms {100 * (r['kv'] or 0):>6.1f}% {100 * r['hit']:>10.0f}%")
if conditions.busy:
    print("measurement disturbed: other work kept the machine busy during the runs — compare rows, not runs, and "
          "rerun when the machine is quieter before reading a small difference")
if model.device.type != "cpu":  # lib.modeling.fast.pack_linears is a no-op there
    print(f"(packed weights are a CPU layout: on {model.device} the last row runs the same fp32 model as the row above it)")
""")
    nb.code("""
names = list(rows)
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
a.barh(names, [rows[n]["throughput"] for n in names], color="tab:blue")
a.set(xlabel="completion tokens per second", title="throughput (higher is better)")
a.invert_yaxis()
y = range(len(names))
b.barh([i - 0.2 for i in y], [rows[n]["ttft50"] for n in names], height=0.4, label="TTFT p50")
b.barh([i + 0.2 for i in y], [rows[n]["ttft95"] for n in names], height=0.4, label="TTFT p95")
b.set(yticks=list(y), yticklabels=names, xlabel="seconds", xscale="log", title="time to first token (lower is better)")
b.invert_yaxis()
b.legend()
fig.tight_layout()
plt.show()
""")
    one, cb, pc = "one at a time (--max-num-seqs 1)", "continuous batching (8 slots)", "+ prefix caching"
    nb.md(f"""
Read your table against your prediction; the numbers are this run's, on this machine, with whatever else it
was doing (the load average is printed), so compare rows, not runs. What to look for:

* **one at a time**: if requests arrive faster than one server finishes them, the queue only grows and TTFT
  with it (p95 far above p50) — the server is *unstable* at that rate, whatever its hardware (section 5 says
  at which rate that begins).
* **continuous batching**: one step serves every running request, so throughput rises and the queue drains;
  TTFT falls. TPOT *rises*, for two reasons: a step of several rows costs more than a step of one (your ratio
  above), and a step may also carry other requests' prefills (they share its token budget), the TTFT/TPOT trade
  that chunked-prefill schedulers (Sarathi-Serve) tune.
* **prefix caching**: the shared system prompt is most of each prompt, so most of each prefill disappears
  (the hit rate) — that shows in TTFT. It tells the two causes of the higher TPOT apart: if TPOT stays well
  above the one-at-a-time row once most prefill is gone, the batch itself is what costs. (The lab's EPYC, in
  `benchmarks/load.py --ablation` at 1 request/s with 32 tokens each: TPOT p50
  {recorded_md('load', one + ': TPOT p50', EPYC)} one at a time,
  {recorded_md('load', cb + ': TPOT p50', EPYC)} with batching,
  {recorded_md('load', pc + ': TPOT p50', EPYC)} with the cache.)
* **packed weights**: compare the row with the one above it. The layout is faster than plain `F.linear` on some
  machine classes and slower on others (the records above), and with only a few requests on a busy machine the
  difference can sit inside the noise — say which.

On a 2-core CPU one step of SmolLM2 costs tens of milliseconds, so absolute numbers are far from a GPU's; the
*shape* — which technique moves which metric — is what carries over, and `python benchmarks/load.py
--base-url ...` runs this same load against vLLM or any other OpenAI-compatible server when you have one.
""")


def section_ttft(nb) -> None:
    nb.md("""
## 5. Predicting TTFT under load

Before you buy a machine you want to know the arrival rate it can take with the TTFT your users accept — and
the load test above is too short and too noisy to find it by trial. A **model** does: the server's few rules,
turned into a formula. Here are the rules of a continuous-batching server, close to your engine's:

* requests arrive as a Poisson process at `rate` per second, each asking for `max_tokens` tokens (none stops
  early), with prompts alike;
* the engine runs steps back to back while it has work; at the start of a step it admits waiting requests,
  oldest first, while fewer than `max_num_seqs` run;
* a step costs `step_s` (one decode of every running request: the weights are read once, whatever the batch)
  plus `prefill_s` for each request admitted in it (a prompt's prefill is work the batch does not share);
* a request admitted in a step has its first token at that step's end, then one token per step, and leaves
  after the step of its last token (`max_tokens` steps in all); its slot is free for the next step;
* a request that arrives while a step runs waits for that step to end; one that arrives when the engine is
  idle starts a step at once.

Write `predict_ttft(rate, prefill_s, step_s, max_num_seqs, max_tokens)`: the **mean** TTFT in seconds, or
`math.inf` where the queue grows without bound. It is graded on configurations it has not seen (one slot and
sixteen, lightly and heavily loaded, past what the server can take), against a simulation of exactly these rules
over 50,000 requests: within a factor 1.2 with one slot, 1.35 with several. `lib.serve.queueing.simulate_ttft` is that
simulation — use it in this notebook to test your formula on configurations of your own; your graded function
cannot call it (in the grading process no part of lib runs for your code), and it is a formula's job, not a
simulation's, to say *why*: the check counts the lines of Python your function runs (a formula runs a few dozen
per call; the check allows {TTFT_MAX_PYTHON_LINES:,} for its seven calls), so a simulation of your own fails it.

Questions to work through first:

* What is the most requests per second this server can finish? (Which part of a request's work does the batch
  share, and which does it not?) Past that rate, what happens to the queue?
* With one slot, what kind of queue is this, and what does a fixed service time change about its wait compared
  with the textbook's exponential one?
* With several slots, a request may find one free: what does it still wait for? And when all are taken, how
  long does a slot take to turn over — at that moment, how full is every step?
""".replace("{TTFT_MAX_PYTHON_LINES:,}", f"{TTFT_MAX_PYTHON_LINES:,}"))
    nb.exercise("predict_ttft", '''
def predict_ttft(rate, prefill_s, step_s, max_num_seqs, max_tokens):
    """Mean time to first token (seconds) of the server above under Poisson arrivals at `rate` per second;
    math.inf where the queue grows without bound."""
    ### BEGIN SOLUTION
    c, n = max_num_seqs, max_tokens
    turnover = n * step_s + c * prefill_s  # a slot's time while every slot is taken: n full steps
    if rate * turnover >= c:
        return math.inf
    a = rate * turnover  # slots busy on average in that regime (a < c)
    terms = sum(a ** k / math.factorial(k) for k in range(c))
    full = a ** c / math.factorial(c) * c / (c - a)
    waits, idle = full / (terms + full), 1 / (terms + full)  # Erlang's C; the chance the engine is idle
    queue = waits * turnover / (c - a) / 2  # M/D/c: half the wait an exponential service time gives
    step = step_s / (1 - rate * prefill_s)  # the mean step: each second of steps admits `rate` prefills
    in_progress = max(0.0, 1 - idle - waits) * step / 2  # a free slot, but a step to wait out
    own = step_s + prefill_s * (1 + rate * step)  # its own step, with the prefills of those that came with it
    return queue + in_progress + own
    ### END SOLUTION
''')
    nb.test("test_predict_ttft", "check_predict_ttft(predict_ttft)", points=3)
    nb.md("""
### Why it works, now that your check passes

A first token waits for three things: a free slot, the end of the step in progress, and its own step.

* **Capacity.** When every slot is always taken, each slot turns over once per `max_tokens` steps, so a step
  admits `c / n` requests (c slots, n tokens) and costs `step_s + prefill_s · c / n`: the server finishes
  `c / (n · step_s + c · prefill_s)` requests per second. Decode is shared by the batch, prefill is not — as
  `c` grows the capacity tends to `1 / prefill_s`, prefill alone. At or past that rate arrivals outrun the
  server on average, the queue performs a random walk with drift, and the mean TTFT has no limit: `math.inf`.
* **The slot queue.** A request waits for a slot only when all are taken — and then every step is full, so a
  slot turns over every `n · step_s + c · prefill_s` seconds. With that fixed service time this is an M/D/c
  queue: the chance to wait is Erlang's C formula (exact for M/M/c, a good approximation here), and a fixed
  service time halves M/M/c's mean wait (the Pollaczek–Khinchine formula for one slot: exact; the Allen–Cunneen
  approximation for several). With one slot the whole model is exact M/D/1: mean wait `ρ·S / (2(1 − ρ))`.
* **The step in progress.** A request that finds a free slot while the engine is stepping waits, on average,
  half a step; a step lasts `step_s / (1 − rate · prefill_s)` on average, since every second of stepping admits
  `rate` requests, each adding `prefill_s`.
* **Its own step** costs `step_s + prefill_s` plus the prefills of everyone who arrived during the same step.

What the model leaves out — long steps admit more arrivals, which make the next step longer still — is why it
reads a little low when prefills take a large share of the engine's time (the check's configurations keep that
share at a quarter or less). A model without the slot queue, or without a request's own step, misses by more than
the check allows on some configuration of every run; one without the step in progress reads about 0.74-0.97 of the
simulation, and fails some runs.

**Now measure it on your server.** The rules simplify your engine (its decode step grows with the batch; the
token budget and the prompt cap split prefills; HTTP and tokenizing add a little), so the cell below takes its
constants from section 4's timings — the decode step at the batch the server runs, the prefill a prompt adds —
and sets the arrival rates from your model's own capacity (the rate at which `predict_ttft` turns infinite). The
constants are the median repeats, not the best: a load test runs through whatever else the machine is doing (on a
quiet machine the two agree). It shows three figures per run: your formula, the rules simulated, and the mean TTFT
of your server, measured with the load test — requests that answer in full (`ignore_eos`), as the rules say.
""")
    nb.code("""
import math
import statistics

from lib.serve.queueing import simulate_ttft


def capacity_of(predict, **w):
    \"\"\"The rate at which `predict` (a TTFT model) turns infinite: its model's capacity, by bisection.\"\"\"
    lo, hi = 0.0, 1.0
    while math.isfinite(predict(hi, **w)) and hi < 1e6:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.isfinite(predict(mid, **w)) else (lo, mid)
    return lo


def seconds(x):
    return f"{x:.3f} s" if math.isfinite(x) else "inf"


SLOTS, TOKENS, REQUESTS = 4, 16, 12
server_rules = dict(prefill_s=PREFILL_TYPICAL, step_s=STEP_TYPICAL[SLOTS], max_num_seqs=SLOTS, max_tokens=TOKENS)
capacity = capacity_of(predict_ttft, **server_rules)
print(f"{SLOTS} slots, {TOKENS} tokens each: step {1e3 * STEP_TYPICAL[SLOTS]:.0f} ms at batch {SLOTS}, prefill "
      f"{1e3 * PREFILL_TYPICAL:.0f} ms per prompt -> your model's capacity {capacity:.2f} requests/s")
runs = {}
for share in (0.5, 0.8):
    rate = share * capacity
    srv = make_server(model, tok, num_blocks=256, max_num_seqs=SLOTS, loop_cls=ServingLoop, text_stream_cls=TextStream)
    conditions = Conditions.now()
    with ServerThread(srv) as base_url:
        runs[share] = run_load_test(base_url, MODEL, rate, REQUESTS, TOKENS, seed=1, max_seconds=120, ignore_eos=True)
    runs[share]["conditions"] = conditions.done()

print(f"\\n{'rate':>7} {'of capacity':>11} {'your model':>11} {'the rules':>10} {'your server':>12}  (mean TTFT; "
      f"{REQUESTS} requests a run)")
for share, r in runs.items():
    rate = r["rate"]
    mine = predict_ttft(rate, **server_rules)
    rules = simulate_ttft(rate, **server_rules)
    measured = statistics.fmean(q["ttft"] for q in r["requests"])
    print(f"{rate:>5.2f}/s {share:>11.0%} {seconds(mine):>11} {seconds(rules):>10} {seconds(measured):>12}  "
          f"{r['conditions'].line()}")
for name, c in (("one at a time", 1), ("continuous batching", 8)):  # section 4's runs, at its rate
    w = dict(prefill_s=PREFILL_TYPICAL, step_s=STEP_TYPICAL[c], max_num_seqs=c, max_tokens=MAX_TOKENS)
    measured = statistics.fmean(q["ttft"] for q in rows[name]["requests"])
    stable = RATE * (MAX_TOKENS * w["step_s"] + c * w["prefill_s"]) < c  # below the rules' capacity: a finite mean
    rules = seconds(simulate_ttft(RATE, **w)) if stable else "grows"
    print(f"{RATE:>5.2f}/s {RATE / capacity_of(predict_ttft, **w):>11.0%} {seconds(predict_ttft(RATE, **w)):>11} "
          f"{rules:>10} {seconds(measured):>12}  section 4's {name!r} ({len(rows[name]['requests'])} requests)")
""")
    nb.md("""
Read the three columns in pairs. *Your model against the rules* is the model's own error, the part the check
graded. *The rules against your server* is what the rules leave out of the real engine: a decode step that grows
with the batch (the rules take the step at the full batch, so they read high at light load), the cap on prompt
tokens per step, the HTTP front end — and the measurement's own limits: a few requests, starting from an empty
server (the first ones never queue, so a short run reads low near capacity), on a machine whose load is printed
beside them. Past capacity (`inf`) the measured mean is finite only because the run ends: it grows with every
request the run sends. A running server shows its queue in `/metrics`: `vllm:request_queue_time_seconds` (in
`lib.serve.server`, from a request's arrival to the end of the first step that ran it).
""")


def section_costs(nb) -> None:
    nb.md("""
## 6. End to end, and what a token costs

Seed 002 lists the metrics a deployment is judged by. Two of them follow from what you measured.

**End-to-end latency.** The seed writes "E2E Latency = TTFT + (n_tokens × TBT)", with TTFT the time from a
request's submission to its first token and TBT the time between tokens. Write `e2e_latency(ttft, tbt,
n_tokens)`: when the request's last token arrives, for a request that streamed `n_tokens` tokens, with `tbt` the
mean gap between two consecutive tokens of that request. Check the seed's formula against the definitions first.
""")
    nb.exercise("e2e_latency", '''
def e2e_latency(ttft, tbt, n_tokens):
    """Seconds from a request's submission to its last token: `n_tokens` tokens, the first at `ttft`, then gaps of
    `tbt` on average."""
    ### BEGIN SOLUTION
    return ttft + (n_tokens - 1) * tbt
    ### END SOLUTION
''')
    nb.test("test_e2e_latency", "check_e2e_latency(e2e_latency)", points=1)
    nb.md("""
`n` tokens have `n − 1` gaps between them: **E2E = TTFT + (n − 1) · TBT**. The seed's formula counts one gap too
many — a request of one token ends at its TTFT. The cell below checks both against every request of section 4's
load test (submission to last streamed piece, as the client saw it; a piece is usually one token, `TextStream`
may hold one back and send two together, so `n` counts pieces). Then it composes the *percentiles* the same way:
a p50 TTFT plus (n − 1) p50 TBTs is not the p50 of E2E, because the slow first tokens and the slow gaps do not
belong to the same requests.
""")
    nb.code("""
streamed = [q for r in rows.values() for q in r["requests"] if q["chunks"] > 1]
yours = max(abs(e2e_latency(q["ttft"], q["tpot"], q["chunks"]) - q["e2e"]) / q["e2e"] for q in streamed)
seeds = max(abs(q["ttft"] + q["chunks"] * q["tpot"] - q["e2e"]) / q["e2e"] for q in streamed)
print(f"{len(streamed)} requests of section 4: your formula is off by at most {yours:.1e} of a request's E2E latency, "
      f"the seed's by up to {seeds:.1%}")
for name, r in rows.items():
    n = statistics.median(q["chunks"] for q in r["requests"])
    p50 = statistics.median(q["e2e"] for q in r["requests"])
    print(f"{name:>20}: E2E p50 measured {p50:.2f} s; e2e_latency(TTFT p50, TPOT p50, {n:g}) = "
          f"{e2e_latency(r['ttft50'], r['tpot50'], n):.2f} s")
""")
    nb.md("""
**What a token costs.** A machine rented at `price_per_hour` dollars serves `tokens_per_s` completion tokens per
second. Write `cost_per_million_tokens(tokens_per_s, price_per_hour)`: the dollars a million tokens cost.
""")
    nb.exercise("cost_per_million_tokens", '''
def cost_per_million_tokens(tokens_per_s, price_per_hour):
    """Dollars per million completion tokens served at `tokens_per_s` on a machine rented at `price_per_hour`."""
    ### BEGIN SOLUTION
    return price_per_hour / 3600 / tokens_per_s * 1e6
    ### END SOLUTION
''')
    nb.test("test_cost_per_million_tokens", "check_cost_per_million_tokens(cost_per_million_tokens)", points=1)
    nb.md("""
A million tokens take `10⁶ / tokens_per_s` seconds of the machine, at `price_per_hour / 3600` dollars a second.
The prices below are **assumptions** — set your own; the throughputs are measured: yours in section 4 (at an
arrival rate that caps them: the machine is paid for while it waits), yours at capacity (section 5's model:
every slot busy), and the lab's H200 from its committed record.
""")
    nb.code("""
from lib.bench.records import load as load_record

CPU_PRICE, GPU_PRICE = 0.10, 3.50  # dollars an hour: ASSUMED prices (a small cloud VM, one rented H200), not measured
for name, r in rows.items():
    print(f"{name:>20}: {r['throughput']:6.1f} tok/s at {RATE}/s -> ${cost_per_million_tokens(r['throughput'], CPU_PRICE):6.2f} "
          f"per million tokens at ${CPU_PRICE:.2f}/h")
full = capacity * TOKENS  # tokens per second with every slot busy, section 5's server
print(f"{'at capacity':>20}: {full:6.1f} tok/s ({SLOTS} slots, your model) -> "
      f"${cost_per_million_tokens(full, CPU_PRICE):6.2f} per million tokens")
h200 = load_record("serving", "nvidia-h200")
if h200:
    fig = h200["figures"]["decode b8"]
    print(f"{'H200, batch 8':>20}: {fig['max']:6.0f} tok/s (recorded {h200['date'][:10]}, SmolLM2-135M) -> "
          f"${cost_per_million_tokens(fig['max'], GPU_PRICE):6.3f} per million tokens at ${GPU_PRICE:.2f}/h")
print("seed 002's figure for FP16 7B on an A100 ($0.15 per million) needs "
      f"{cost_per_million_tokens(1.0, 2.0) / 0.15:,.0f} tok/s at an assumed $2.00/h")
""")


def section_lora(nb) -> None:
    figures = _lora_figures()
    rendered = "\n".join(figures) if figures else (
        "*No multi-LoRA measurement is committed yet.* The LoRA benchmark writes `results/<class>/lora.json` "
        "(`lib.bench.records`) when run with `--record`; rebuilding this notebook (`python tools/weeks/week21.py`) then "
        "renders every figure of that record here, and scenario D's model answer cites them.")
    nb.md(f"""
## 7. Many adapters on one base: multi-LoRA serving

*This section reports the multi-LoRA engine (`lib/modeling/lora.py` and the server's adapters: `model` names an adapter,
as vLLM's `--lora-modules` does), built and measured on its own branch of the lab; its figures are rendered
from that benchmark's committed record, never typed.*

A LoRA adapter adds a low-rank product `x · A · B` (rank r, a few MB) to some of the base model's matmuls. Fifty
customers' adapters need not be fifty deployments: S-LoRA and Punica keep one copy of the base weights, batch
requests for different adapters in the same continuous batch, and apply each request's low-rank product to its
own rows — one product per adapter group in the batch. The output equals merging the adapter into the weights;
the throughput is compared with serving each adapter as its own model. Recorded:

{rendered}
""")
