"""lib.serve.guided, JSON mode: the character machine against Python's json module, the token masks against the machine
token by token (the shortcuts the masks take are checked against feeding every token), and SmolLM2 decoding under
the mask: every answer that ends by itself parses as a JSON object."""
import json
import random

import pytest
import torch

from lib.serve.guided import MAX_WS, JsonGuide, JsonMachine, JsonVocabulary
from lib.modeling.sampling import SamplingParams

SEED = 20261126
ALPHABET = list('{}[]",:0123456789-+.eEtrufalsn \n\\/abcxyzé\t') + ["\u00e9", "\x01"]


def _document(rng: random.Random, depth: int = 0):
    kind = rng.choice(["obj", "arr", "str", "num", "lit"] if depth < 3 else ["str", "num", "lit"])
    if kind == "obj":
        return {"".join(rng.choice("abcé\"\\/\n") for _ in range(rng.randint(0, 4))): _document(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    if kind == "arr":
        return [_document(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "str":
        return "".join(rng.choice("xyz é\"\\\t\u2603") for _ in range(rng.randint(0, 6)))
    if kind == "num":
        return rng.choice([0, -1, 12, 3.5, -0.25, 1e-7, 6.02e23, rng.randint(-10**6, 10**6), rng.random()])
    return rng.choice([True, False, None])


def _documents(n: int, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        value = {"k": _document(rng)} if rng.random() < 0.5 else _document(rng)
        if not isinstance(value, dict):
            value = {"v": value}
        sep = rng.choice([(",", ":"), (", ", ": "), (",", ": ")])
        docs.append(json.dumps(value, separators=sep, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1, 2])))
    return docs


def _json_object(text: str) -> bool:
    """The oracle: Python's json module (NaN and Infinity refused), a dict at the top."""
    def refuse(name):
        raise ValueError(name)
    try:
        return isinstance(json.loads(text, parse_constant=refuse), dict)
    except ValueError:
        return False


def _within_limits(text: str) -> bool:
    """Outside what the machine refuses on purpose: whitespace runs longer than MAX_WS, whitespace after the object."""
    run = 0
    for c in text:
        run = run + 1 if c in " \t\n\r" else 0
        if run > MAX_WS:
            return False
    return text == text.rstrip(" \t\n\r")  # json.loads takes trailing whitespace; the machine ends at the "}"


def test_every_prefix_of_a_json_document_is_accepted_and_only_the_whole_is_complete():
    m = JsonMachine()
    print(f"seed {SEED}")
    for doc in _documents(300):
        state = m.start
        data = doc.encode()
        for i, ch in enumerate(data.decode("latin-1")):  # the machine reads bytes
            assert not m.complete(state), (doc, i)
            state = m.step(state, ch)
            assert state is not None, f"{doc!r} refused at byte {i}: {data[:i + 1]!r}"
        assert m.complete(state), doc


def test_the_machine_agrees_with_the_json_module_on_mutated_documents():
    """Random edits of valid documents: complete by the machine exactly when json.loads gives a dict."""
    m = JsonMachine()
    rng = random.Random(SEED + 1)
    agreed = {True: 0, False: 0}
    for doc in _documents(400, SEED + 2):
        for _ in range(8):
            chars = list(doc)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(chars) + 1)
                op = rng.random()
                if op < 0.4 and chars:
                    chars.pop(min(at, len(chars) - 1))
                elif op < 0.7:
                    chars.insert(at, rng.choice(ALPHABET))
                elif chars:
                    chars[min(at, len(chars) - 1)] = rng.choice(ALPHABET)
            text = "".join(chars)
            if not _within_limits(text):
                continue
            want = _json_object(text)
            got = m.complete(m.feed_bytes(m.start, text.encode()))
            assert got == want, f"{text!r}: machine says {got}, json.loads says {want} (seed {SEED})"
            agreed[want] += 1
    assert agreed[True] > 100 and agreed[False] > 1000, agreed  # both sides were exercised


@pytest.mark.parametrize("text", ['{"a":}', '{"a" 1}', "[1]", '"x"', '{"a":01}', '{"a":1.}', '{"a":-}', '{"a":1e}',
                                  '{"a":tru}', '{"a":1,}', '{,}', '{"a":"\x01"}', '{"a":"\\x"}', '{"a":"\\u12g4"}',
                                  '{"a":1}}', '{"a":1} ', '             {}', '{"a":[1,]}', "{'a':1}", '{"a":NaN}'])
def test_not_json_objects_are_refused(text):
    m = JsonMachine()
    assert not m.complete(m.feed_bytes(m.start, text.encode())), text


@pytest.mark.parametrize("data, ok", [(b'{"a":"\xc3\xa9"}', True), (b'{"a":"\xc3"}', False), (b'{"a":"\xa9"}', False),
                                      (b'{"a":"\xe2\x98\x83"}', True), (b'{"a":"\xe2\x98"}', False),
                                      (b'{"\xf0\x9f\x98\x80":1}', True), (b'{"a":"\xff"}', False), (b'{\xc3\xa9:1}', False)])
def test_strings_hold_whole_utf8_characters(data, ok):
    m = JsonMachine()
    assert m.complete(m.feed_bytes(m.start, data)) == ok, data


# --- masks --------------------------------------------------------------------------------------------------

def _small_vocabulary():
    pieces = sorted({c for c in ALPHABET} | {'{"', '":', '",', '"}', "},", "}}", "]}", " {", "  ", "   ", "\n ", " \"",
                                             "true", "false", "null", "12", "3.", ".5", "e+", "-1", "0,", "1}", "abc",
                                             " the", 'x"', 'y",', '\\"', "\\u00", "e9", ': "', ", ", " :", "é", "hello"})
    return [p.encode() for p in pieces] + [b"\xc3", b""]  # a piece of a character and an empty (special) token


def _brute(vocab: JsonVocabulary, state) -> torch.Tensor:
    want = torch.zeros(vocab.size, dtype=torch.bool)
    for i, t in enumerate(vocab.texts):
        if t is not None and vocab.machine.feed(state, t) is not None:
            want[i] = True
    if JsonMachine.complete(state):
        want[:] = False
        want[vocab.eos] = True
    return want


def _states(machine, docs):
    seen = {}
    for doc in docs:
        state = machine.start
        for ch in doc.encode().decode("latin-1"):
            seen[state] = None
            state = machine.step(state, ch)
        seen[state] = None
    return list(seen)


def test_masks_equal_feeding_every_token():
    table = _small_vocabulary()
    vocab = JsonVocabulary(table, eos_token_id=len(table) - 1, vocab_size=len(table) + 3)
    states = _states(vocab.machine, _documents(60, SEED + 3) + ['{"a": "' + "x" * 505 + '"}'])
    assert len(states) > 500
    for state in states:
        got = vocab.mask(state)
        assert torch.equal(got, _brute(vocab, state)), (state, [vocab.texts[i] for i in (got ^ _brute(vocab, state)).nonzero()])
    assert not vocab.mask(vocab.machine.start)[len(table) - 2]  # the piece of a character


@pytest.fixture(scope="module")
def vocabulary(smollm2):
    from lib.serve.serving import token_bytes

    model, tok = smollm2
    return JsonVocabulary(token_bytes(tok), tok.eos_token_id, model.config.vocab_size)


@pytest.mark.model
def test_smollm2_masks_equal_feeding_every_token_and_allow_tokenized_documents(smollm2, vocabulary):
    _, tok = smollm2
    rng = random.Random(SEED + 4)
    docs = _documents(40, SEED + 5)
    for doc in docs:  # the tokenizer's own tokens of a document: each allowed in turn, the end only at the end
        ids = tok(doc).input_ids
        guide = JsonGuide(vocabulary)
        for i in range(len(ids)):
            mask = guide.allowed(ids[:i])
            assert mask[ids[i]], (doc, tok.decode(ids[:i + 1]))
            assert not mask[tok.eos_token_id]
        assert guide.allowed(ids).nonzero().flatten().tolist() == [tok.eos_token_id]
    for state in rng.sample(_states(vocabulary.machine, docs), 12):
        assert torch.equal(vocabulary.mask(state), _brute(vocabulary, state)), state


@pytest.mark.model
def test_json_mode_decoding_on_smollm2_stays_json_and_parses_when_it_ends(smollm2, vocabulary):
    """Every output under the mask is a prefix of a JSON object; every one that ends by itself parses. (Whether a
    small model closes its object within the budget depends on the prompt: at least one of these must.)"""
    from lib.modeling.generate import generate

    model, tok = smollm2
    ended = []
    for question, temperature, seed in [("What is the capital of France?", 0.0, 0), ("Describe a cat in JSON.", 0.0, 0),
                                        ("What is the capital of France?", 0.8, 1), ("Give a JSON greeting.", 0.8, 2)]:
        ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        params = SamplingParams(temperature=temperature, eos_token_id=tok.eos_token_id, guide=JsonGuide(vocabulary))
        out = generate(model, ids, 60, sampling=params, eos_token_id=tok.eos_token_id,
                       generator=torch.Generator().manual_seed(seed))[0, ids.shape[1]:].tolist()
        body = out[:out.index(tok.eos_token_id)] if tok.eos_token_id in out else out
        data = b"".join(vocabulary.texts[t].encode("latin-1") for t in body)
        state = vocabulary.machine.feed_bytes(vocabulary.machine.start, data)
        assert state is not None, (question, data)
        if tok.eos_token_id in out:
            assert vocabulary.machine.complete(state) and _json_object(data.decode("utf-8").strip()), (question, data)
            ended.append(question)
    assert ended, "no answer closed its object within 60 tokens"
