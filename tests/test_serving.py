"""lib.serve.serving: the serving loop's core (ServingLoop), the streaming detokenizer (TextStream), token bytes."""
import random

import pytest
import torch

from lib.batching.engine import LLMEngine
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model
from lib.modeling.sampling import SamplingParams
from lib.serve.serving import ServingLoop, TextStream, byte_level_alphabet, token_bytes


def stream_all(chunks, stops):
    s = TextStream(stops)
    pieces = [s.push(c) for c in chunks]
    return pieces, s.finish(), s.stopped


def cut_at_stop(text, stops):
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


def random_chunks(rng, data: bytes):
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, len(data) // 2))))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def test_byte_level_alphabet_is_a_bijection():
    a = byte_level_alphabet()
    assert sorted(a.values()) == list(range(256)) and a["Ġ"] == 32 and a["A"] == 65


@pytest.mark.parametrize("trial", range(40))
def test_text_stream_pieces_add_up_to_the_text_cut_at_the_first_stop(trial):
    rng = random.Random(trial)
    alphabet = "ab cé€😀\n"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
    data = text.encode()
    if trial % 5 == 0:  # invalid bytes too: decoded as U+FFFD, like bytes.decode("utf-8", "replace")
        data = data[:len(data) // 2] + b"\xff\xc3" + data[len(data) // 2:]
    full = data.decode("utf-8", "replace")
    stops = [full[i:i + rng.randint(1, 3)] for i in rng.sample(range(len(full)), k=min(2, len(full)))] \
        if trial % 3 else ["zz", "\n\n"]
    pieces, tail, stopped = stream_all(random_chunks(rng, data), stops)
    want, want_stop = cut_at_stop(full, stops)
    assert "".join(pieces) + tail == want and stopped == want_stop
    assert all("\ufffd" not in p or "\ufffd" in full for p in pieces)


def test_text_stream_waits_for_a_split_character_and_a_possible_stop():
    s = TextStream(["END"])
    assert s.push("é".encode()[:1]) == ""  # half a character: nothing yet
    assert s.push("é".encode()[1:] + b" E") == "é "  # "E" may start "END": held back
    assert s.push(b"N") == ""
    assert s.push(b"o") == "ENo"  # not a stop after all
    assert s.push(b" END more") == " " and s.stopped and s.push(b"x") == "" and s.finish() == ""


def test_text_stream_refuses_empty_stops():
    with pytest.raises(ValueError, match="non-empty"):
        TextStream([""])


@pytest.mark.model
def test_token_bytes_match_the_tokenizer():
    from lib.bench import paths
    from lib.modeling.llama import load_tokenizer_from_gguf

    tok = load_tokenizer_from_gguf(paths.smollm2_path())
    table = token_bytes(tok)
    assert len(table) == len(tok) and table[tok.eos_token_id] == b""
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 30))]
        want = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert b"".join(table[i] for i in ids).decode("utf-8", "replace") == want
    ids = tok("naïve café — 😀 ok", add_special_tokens=False).input_ids
    assert b"".join(table[i] for i in ids).decode() == "naïve café — 😀 ok"


def _engine(model, **kw):
    return LLMEngine(model, num_blocks=kw.pop("num_blocks", 32), block_size=4, max_num_seqs=kw.pop("max_num_seqs", 3),
                     max_num_batched_tokens=64, **kw)


def test_serving_loop_routes_each_requests_tokens_and_equals_generate():
    model = tiny_model(seed=1)
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(model.config.vocab_size) for _ in range(rng.randint(2, 9))] for i in range(5)}
    want = {rid: generate(model, torch.tensor([p]), 7)[0, len(p):].tolist() for rid, p in prompts.items()}
    eos = want["r1"][3]  # r1 stops at its 4th token; any other request producing it stops there too
    loop = ServingLoop(_engine(model), eos_token_id=eos)
    got = {rid: [] for rid in prompts}
    ends = {}
    order = list(prompts)
    loop.submit(order[0], prompts[order[0]], 7, SamplingParams())
    steps = 0
    while loop.has_work() or order[1:]:
        if steps in (1, 2, 4, 6) and order[1:]:  # arrivals while others run
            rid = order.pop(1)
            loop.submit(rid, prompts[rid], 7, SamplingParams())
        for kind, rid, value in loop.run_once():
            assert rid not in ends, f"{rid}: a message after its end"
            if kind == "token":
                got[rid].append(value)
            else:
                ends[rid] = value
        steps += 1
        assert steps < 100
    for rid, w in want.items():
        stop = w.index(eos) if eos in w else None
        assert got[rid] == (w[:stop] if stop is not None else w), rid
        assert ends[rid] == ("stop" if stop is not None else "length"), rid
    assert not loop.engine.requests and loop.engine.blocks.num_in_use == 0


def test_serving_loop_hands_the_params_on():
    """The params object the front end submits reaches the engine as it is: its temperature and seed sample the
    request, and its logprob entries come back in it."""
    model = tiny_model(seed=1)
    prompt = [4, 8, 15, 16]
    want = generate(model, torch.tensor([prompt]), 6, temperature=1.3,
                    generator=torch.Generator().manual_seed(21))[0, len(prompt):].tolist()
    loop = ServingLoop(_engine(model))
    params = SamplingParams(temperature=1.3, seed=21, logprobs=1)
    loop.submit("s", prompt, 6, params)
    got = []
    while loop.has_work():
        got += [value for kind, _, value in loop.run_once() if kind == "token"]
    assert got == want and [t for t, _, _ in params.logprob_entries] == want


def test_serving_loop_cancel_and_refusal():
    model = tiny_model(seed=2)
    loop = ServingLoop(_engine(model, num_blocks=4))  # 4 blocks of 4: 16 slots
    loop.submit("big", list(range(3, 30)), 4, SamplingParams())  # 27 + 4 tokens can never fit
    loop.submit("a", [5, 6, 7], 10, SamplingParams())
    msgs = loop.run_once()
    assert msgs[0][:2] == ("error", "big") and "never fit" in msgs[0][2]
    assert [m[:2] for m in msgs[1:]] == [("token", "a")]
    assert loop.engine.blocks.num_in_use > 0
    loop.cancel("a")
    loop.cancel("never-submitted")
    assert loop.run_once() == [("done", "a", "abort")]
    assert loop.engine.blocks.num_in_use == 0 and not loop.has_work()
