"""Week 21's checks accept the solution and reject the wrong routes — through the isolated path, the way
`pytest weeks/21` and autograde run a student's notebook (each submission is loaded in a confined child).

Wrong routes, `TextStream`:
  per_token_decode   decodes each push alone with errors="replace": half a character becomes U+FFFD
  all_at_finish      returns "" until finish(): nothing streams
  no_holdback        sends text that may start a stop string; the stop string then cannot be taken back
  fixed_holdback     always holds back len(longest stop) - 1 characters (vLLM's simple rule), later than certain
  stop_in_new_only   looks for a stop string only in the newly decoded text: misses one that spans pushes
  loses_tail         finish() forgets the held-back text
  empty_stop_ok      accepts "" as a stop string
  shortest_holdback  holds back the shortest end that may begin a stop string: sends the start of a longer one
  ignore_errors      decodes with errors="ignore": invalid bytes vanish instead of showing as U+FFFD
  redecode_replace   decodes all the bytes again at each push: an incomplete character goes out as U+FFFD
  lib_exec           lib/serve/serving.py's own TextStream, exec'd from its source under another name
Wrong routes, `ServingLoop`:
  static             admits queued requests only when the engine is idle (static batching)
  sends_eos          forwards the end-of-sequence token as a token and never says "stop"
  leaks              never drops finished requests from the engine
  ignores_cancel     cancel() does nothing
  two_steps          steps the engine twice per run_once
  refusal_raises     lets the engine's ValueError escape run_once
  cancels_first      handles the queue's cancels before its submissions (not in the order queued)
  drops_params       submits without the params: the engine gets params=None (greedy, no logprobs)
  temperature_only   hands add_request the params' temperature alone (seed 0, no other field, no logprobs)
  sampling_by_hand   hands add_request temperature and seed, not the params (no logit_bias, no logprobs)
  lib_exec           lib/serve/serving.py's own ServingLoop, exec'd from its source under another name
Wrong routes, `predict_ttft` (a model of the mean TTFT, judged against lib.serve.queueing's simulation):
  no_queue           the first step alone (step + prefill): no wait, never infinite
  exponential        M/M/c's wait (an exponential service time): twice the fixed service time's
  one_slot           ignores max_num_seqs: one queue, one request at a time
  prefill_free       the queue right, but a slot's turnover without the prefills a full step carries
  prefill_each_step  every step of a request pays a prefill: a capacity far too low
  one_fast_server    the slots as one server `max_num_seqs` times as fast (M/D/1)
  simulates_lib      calls lib.serve.queueing.simulate_ttft (not available to the student's code)
Wrong routes, `e2e_latency`: seed_formula (TTFT + n·TBT, the seed's), gaps_only, ttft_only.
Wrong routes, `cost_per_million_tokens`: per_second_price (the hourly price taken per second), per_thousand,
  inverted, per_minute.
"""
import json
import textwrap
from pathlib import Path

import pytest

from grader.checks import week21 as checks
from grader.harness import load_exercises, with_cell_source
from grader.view import ViewSpec

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "21" / "week21_serving.ipynb"

LIB_EXEC = """
import sys as _sys, types as _types
_m = _types.ModuleType("my_serving")
_sys.modules["my_serving"] = _m
exec(compile(open({path!r}).read(), "my_serving.py", "exec"), _m.__dict__)
{name} = _m.{name}
"""

TEXT_ROUTES = {
    "per_token_decode": ("""
        class TextStream_per_token_decode(TextStream):
            def push(self, data):
                return "" if self.stopped else data.decode("utf-8", "replace")
        """, "expected"),
    "all_at_finish": ("""
        class TextStream_all_at_finish:
            def __init__(self, stops=()):
                if any(s == "" for s in stops):
                    raise ValueError("empty stop")
                self.stops, self.buf, self.stopped = list(stops), b"", False
            def push(self, data):
                self.buf += data
                return ""
            def finish(self):
                text = self.buf.decode("utf-8", "replace")
                hits = [text.find(s) for s in self.stops if s in text]
                return text[:min(hits)] if hits else text
        """, "push\\(\\) returned"),
    "no_holdback": ("""
        class TextStream_no_holdback(TextStream):
            def _take(self, final):
                return super()._take(final=True)
        """, "expected"),
    "fixed_holdback": ("""
        class TextStream_fixed_holdback(TextStream):
            def _take(self, final):
                hits = [h for h in (self.text.find(s, self.done) for s in self.stops) if h != -1]
                if hits:
                    out, self.done, self.stopped = self.text[self.done:min(hits)], min(hits), True
                    return out
                end = len(self.text) if final else max(self.done, len(self.text) - max(0, self.longest - 1))
                out, self.done = self.text[self.done:end], end
                return out
        """, "expected"),
    "stop_in_new_only": ("""
        class TextStream_stop_in_new_only(TextStream):
            def push(self, data):
                if self.stopped:
                    return ""
                new = self.decoder.decode(data)
                self.text += new
                hits = [h for h in (new.find(s) for s in self.stops) if h != -1]
                if hits:
                    cut = len(self.text) - len(new) + min(hits)
                    out, self.done, self.stopped = self.text[self.done:cut], cut, True
                    return out
                out, self.done = self.text[self.done:], len(self.text)
                return out
        """, "expected"),
    "loses_tail": ("""
        class TextStream_loses_tail(TextStream):
            def finish(self):
                return ""
        """, "finish\\(\\) returned"),
    "empty_stop_ok": ("""
        class TextStream_empty_stop_ok(TextStream):
            def __init__(self, stops=()):
                super().__init__([s for s in stops if s])
        """, "empty stop string"),
    "shortest_holdback": ("""
        class TextStream_shortest_holdback(TextStream):
            def _take(self, final):
                hits = [h for h in (self.text.find(s, self.done) for s in self.stops) if h != -1]
                if hits or final:
                    return super()._take(final)
                tail, keep = self.text[self.done:], 0
                for n in range(1, min(len(tail), self.longest - 1) + 1):
                    if any(s[:n] == tail[-n:] for s in self.stops):
                        keep = n
                        break
                end = len(self.text) - keep
                out, self.done = self.text[self.done:end], end
                return out
        """, "expected"),
    "ignore_errors": ("""
        class TextStream_ignore_errors(TextStream):
            def __init__(self, stops=()):
                super().__init__(stops)
                self.decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        """, "expected"),
    "redecode_replace": ("""
        class TextStream_redecode_replace(TextStream):
            def __init__(self, stops=()):
                super().__init__(stops)
                self.raw = b""
            def push(self, data):
                if self.stopped:
                    return ""
                self.raw += data
                self.text = self.raw.decode("utf-8", "replace")
                self.done = min(self.done, len(self.text))
                return self._take(final=False)
        """, "expected"),
}

LOOP_ROUTES = {
    "admits_on_submit": ("""
        class ServingLoop_admits_on_submit(ServingLoop):
            def submit(self, request_id, prompt, max_tokens, params):
                try:  # straight into the engine, from the front end's thread: a data race in the server
                    self.engine.add_request(list(prompt), max_tokens, request_id=request_id, params=params)
                    self.running.add(request_id)
                except ValueError as e:
                    self.queue.append((request_id, "error", str(e), None))
        """, "touched the engine"),
    "aborts_on_cancel": ("""
        class ServingLoop_aborts_on_cancel(ServingLoop):
            def cancel(self, request_id):
                try:
                    self.engine.abort(request_id)  # at once, from the front end's thread
                except Exception:
                    pass
                super().cancel(request_id)
        """, "touched the engine"),
    "static": ("""
        class ServingLoop_static(ServingLoop):
            def run_once(self):
                if not self.engine.has_unfinished():
                    return super().run_once()
                waiting = deque(item for item in self.queue if item[1] is not None)  # new requests wait
                self.queue = deque(item for item in self.queue if item[1] is None)
                out = super().run_once()
                self.queue.extend(waiting)
                return out
        """, "at the next run_once"),  # req-1 arrives while req-0 runs: held back, it shows no token at its run
    "sends_eos": ("""
        class ServingLoop_sends_eos(ServingLoop):
            def __init__(self, engine, eos_token_id=None):
                super().__init__(engine, None)
        """, "its tokens were"),
    "leaks": ("""
        class ServingLoop_leaks(ServingLoop):
            def run_once(self):
                real = self.engine
                class NoAbort:
                    def __getattr__(self, name):
                        return getattr(real, name)
                    def abort(self, rid):
                        pass
                self.engine = NoAbort()
                try:
                    return super().run_once()
                finally:
                    self.engine = real
        """, "still holds records|still in use|abort|nothing may follow"),  # left running, it goes on after its end
    "ignores_cancel": ("""
        class ServingLoop_ignores_cancel(ServingLoop):
            def cancel(self, request_id):
                pass
        """, "cancelled"),
    "two_steps": ("""
        class ServingLoop_two_steps(ServingLoop):
            def run_once(self):
                out = super().run_once()
                if self.engine.has_unfinished():
                    out += super().run_once()
                return out
        """, "times"),
    "refusal_raises": ("""
        class ServingLoop_refusal_raises(ServingLoop):
            def run_once(self):
                for rid, prompt, *_ in list(self.queue):
                    if prompt is not None and len(prompt) > 150:
                        raise ValueError(f"request {rid} can never fit")
                return super().run_once()
        """, "ValueError|never fit"),
    "cancels_first": ("""
        class ServingLoop_cancels_first(ServingLoop):
            def run_once(self):
                self.queue = deque(sorted(self.queue, key=lambda item: item[1] is not None))
                return super().run_once()
        """, "cancelled"),
    "drops_params": ("""
        class ServingLoop_drops_params(ServingLoop):
            def submit(self, request_id, prompt, max_tokens, params):
                super().submit(request_id, prompt, max_tokens, None)
        """, r"add_request got params=None: hand the params object"),
    "temperature_only": ("""
        class ServingLoop_temperature_only(ServingLoop):
            def run_once(self):
                real = self.engine
                class TemperatureOnly:
                    def __getattr__(self, name):
                        return getattr(real, name)
                    def add_request(self, prompt, max_tokens, request_id=None, params=None):
                        return real.add_request(prompt, max_tokens, request_id=request_id,
                                                temperature=params.temperature)
                self.engine = TemperatureOnly()
                try:
                    return super().run_once()
                finally:
                    self.engine = real
        """, r"add_request got params=None, temperature=0\.0: hand the params object"),
    "sampling_by_hand": ("""
        class ServingLoop_sampling_by_hand(ServingLoop):
            def run_once(self):
                real = self.engine
                class ByHand:
                    def __getattr__(self, name):
                        return getattr(real, name)
                    def add_request(self, prompt, max_tokens, request_id=None, params=None):
                        return real.add_request(prompt, max_tokens, request_id=request_id,
                                                temperature=params.temperature, seed=params.seed)
                self.engine = ByHand()
                try:
                    return super().run_once()
                finally:
                    self.engine = real
        """, r"add_request got params=None, temperature=0\.0, seed=0: hand the params object"),
}


TTFT_ROUTES = {  # name -> (source, what the failure says)
    "no_queue": ("""
        def predict_ttft_no_queue(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            return step_s + prefill_s
        """, "simulated server|cannot keep up"),
    "exponential": ("""
        def predict_ttft_exponential(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            c, n = max_num_seqs, max_tokens
            turnover = n * step_s + c * prefill_s
            if rate * turnover >= c:
                return math.inf
            a = rate * turnover
            terms = sum(a ** k / math.factorial(k) for k in range(c))
            full = a ** c / math.factorial(c) * c / (c - a)
            return full / (terms + full) * turnover / (c - a) + step_s + prefill_s
        """, "simulated server"),
    "one_slot": ("""
        def predict_ttft_one_slot(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            service = max_tokens * step_s + prefill_s
            if rate * service >= 1:
                return math.inf
            return rate * service ** 2 / (2 * (1 - rate * service)) + step_s + prefill_s
        """, "simulated server|below what the server can finish"),
    "prefill_free": ("""
        def predict_ttft_prefill_free(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            c, n = max_num_seqs, max_tokens
            turnover = n * step_s + prefill_s
            if rate * turnover >= c:
                return math.inf
            a = rate * turnover
            terms = sum(a ** k / math.factorial(k) for k in range(c))
            full = a ** c / math.factorial(c) * c / (c - a)
            waits, idle = full / (terms + full), 1 / (terms + full)
            return waits * turnover / (c - a) / 2 + max(0.0, 1 - idle - waits) * step_s / 2 + step_s + prefill_s
        """, "simulated server|cannot keep up"),
    "prefill_each_step": ("""
        def predict_ttft_prefill_each_step(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            return predict_ttft(rate, 0.0, step_s + prefill_s, max_num_seqs, max_tokens)
        """, "simulated server|below what the server can finish"),
    "one_fast_server": ("""
        def predict_ttft_one_fast_server(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            service = (max_tokens * step_s + prefill_s) / max_num_seqs
            if rate * service >= 1:
                return math.inf
            return rate * service ** 2 / (2 * (1 - rate * service)) + step_s + prefill_s
        """, "simulated server|cannot keep up"),
    "simulates_lib": ("""
        def predict_ttft_simulates_lib(rate, prefill_s, step_s, max_num_seqs, max_tokens):
            from lib.serve.queueing import simulate_ttft
            return simulate_ttft(rate, prefill_s, step_s, max_num_seqs, max_tokens, n_requests=20_000)
        """, "ReferenceUnavailable|not available"),
}

E2E_ROUTES = {
    "seed_formula": """
        def e2e_latency_seed_formula(ttft, tbt, n_tokens):
            return ttft + n_tokens * tbt
        """,
    "gaps_only": """
        def e2e_latency_gaps_only(ttft, tbt, n_tokens):
            return (n_tokens - 1) * tbt
        """,
    "ttft_only": """
        def e2e_latency_ttft_only(ttft, tbt, n_tokens):
            return ttft
        """,
}

COST_ROUTES = {
    "per_second_price": """
        def cost_per_million_tokens_per_second_price(tokens_per_s, price_per_hour):
            return price_per_hour / tokens_per_s * 1e6
        """,
    "per_thousand": """
        def cost_per_million_tokens_per_thousand(tokens_per_s, price_per_hour):
            return price_per_hour / 3600 / tokens_per_s * 1e3
        """,
    "inverted": """
        def cost_per_million_tokens_inverted(tokens_per_s, price_per_hour):
            return tokens_per_s * 3600 / price_per_hour / 1e6
        """,
    "per_minute": """
        def cost_per_million_tokens_per_minute(tokens_per_s, price_per_hour):
            return price_per_hour / 60 / tokens_per_s * 1e6
        """,
}


@pytest.fixture(scope="module")
def solution_nb():
    return json.loads(SOLUTION.read_text())


@pytest.fixture(scope="module")
def wrong(solution_nb, tmp_path_factory):
    """One submission holding every wrong route as its own class, after the honest solution in each cell."""
    nb = solution_nb
    for grade_id, routes in (("TextStream", TEXT_ROUTES), ("ServingLoop", LOOP_ROUTES), ("predict_ttft", TTFT_ROUTES),
                             ("e2e_latency", E2E_ROUTES), ("cost_per_million_tokens", COST_ROUTES)):
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
        extra = "\n".join(textwrap.dedent(src if isinstance(src, str) else src[0]) for src in routes.values())
        nb = with_cell_source(nb, grade_id, "".join(cell["source"]) + "\n" + extra)
    path = tmp_path_factory.mktemp("w21") / SOLUTION.name
    path.write_text(json.dumps(nb))
    return load_exercises(path)


def test_the_solution_passes_isolated(solution_nb, tmp_path):
    # the solution alone: in `wrong`, the routes' classes share its cells, and grader.ran rightly counts their
    # code, which the honest class's check never runs, against the cell
    path = tmp_path / SOLUTION.name
    path.write_text(json.dumps(solution_nb))
    ex = load_exercises(path)
    try:
        checks.check_TextStream(ex.TextStream)
        checks.check_ServingLoop(ex.ServingLoop)
        checks.check_predict_ttft(ex.predict_ttft)
        checks.check_e2e_latency(ex.e2e_latency)
        checks.check_cost_per_million_tokens(ex.cost_per_million_tokens)
    finally:
        ex.close()


@pytest.mark.parametrize("route", list(TEXT_ROUTES))
def test_text_stream_wrong_routes_fail(wrong, route):
    with pytest.raises(AssertionError, match=TEXT_ROUTES[route][1]):
        checks.check_TextStream(getattr(wrong, f"TextStream_{route}"))


@pytest.mark.parametrize("route", list(LOOP_ROUTES))
def test_serving_loop_wrong_routes_fail(wrong, route):
    from grader.checks import run_seed

    print(f"INFERENCE_LAB_SEED={run_seed()}")  # a route that passes for one seed is reproduced with it
    with pytest.raises(AssertionError, match=LOOP_ROUTES[route][1]):
        checks.check_ServingLoop(getattr(wrong, f"ServingLoop_{route}"))


@pytest.mark.parametrize("route", list(TTFT_ROUTES))
def test_predict_ttft_wrong_routes_fail(wrong, route):
    from grader.checks import run_seed

    print(f"INFERENCE_LAB_SEED={run_seed()}")
    with pytest.raises(AssertionError, match=TTFT_ROUTES[route][1]):
        checks.check_predict_ttft(getattr(wrong, f"predict_ttft_{route}"))


@pytest.mark.parametrize("route", list(E2E_ROUTES))
def test_e2e_latency_wrong_routes_fail(wrong, route):
    with pytest.raises(AssertionError, match="its last token came at"):
        checks.check_e2e_latency(getattr(wrong, f"e2e_latency_{route}"))


@pytest.mark.parametrize("route", list(COST_ROUTES))
def test_cost_per_million_tokens_wrong_routes_fail(wrong, route):
    with pytest.raises(AssertionError, match="a million tokens take"):
        checks.check_cost_per_million_tokens(getattr(wrong, f"cost_per_million_tokens_{route}"))


@pytest.mark.parametrize("name", ["TextStream", "ServingLoop"])
def test_lib_code_under_another_name_is_reference_use(solution_nb, tmp_path, name):
    src = LIB_EXEC.format(path=str(ROOT / "lib" / "serve" / "serving.py"), name=name)
    nb = with_cell_source(solution_nb, name, src)
    path = tmp_path / SOLUTION.name
    path.write_text(json.dumps(nb))
    with pytest.raises(AssertionError, match="PermissionError|not available to your code"):  # the week's view
        getattr(checks, f"check_{name}")(getattr(load_exercises(path), name))
    ex = load_exercises(path, view=ViewSpec.everything(21))  # behind the view, as without Landlock: the child
    # refuses to compile lib's source (its functions are copies of the answer key), and the cell's error says so
    with pytest.raises(AssertionError, match=r"is a copy of lib's lib.serve.serving.*does not compile a copy"):
        getattr(checks, f"check_{name}")(getattr(ex, name))
