"""lib.serve.guided_schema: guided decoding to a JSON Schema. The reference is the `jsonschema` package's validator, not
lib's code: every document the machine accepts whole must validate, every document written in the schema's order
must be accepted, and the masks must be exactly the tokens the machine accepts."""
import json
import random

import jsonschema
import pytest
import torch

from grader.checks import run_seed
from lib.serve.guided import JsonGuide, JsonVocabulary
from lib.serve.guided_schema import SchemaError, SchemaMachine, schema_guide, schema_vocabulary
from lib.modeling.sampling import SamplingParams

SEED = run_seed()
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "an annotation"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["a", "ab", 1, 12, None, True]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": "boolean"},
        "nothing": {"type": "null"},
        "kind": {"const": "cat"},
        "any": {},
        "loose": {"type": "object"},
        "pts": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"},
                                                                         "y": {"type": "integer"}},
                                           "required": ["x"]}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "kind"],
}


def _any(rng, depth=0):
    r = rng.random()
    if depth > 1 or r < 0.4:
        return rng.choice([None, True, False, rng.randint(-50, 50), rng.uniform(-9, 9), "s" * rng.randint(0, 3), "é"])
    if r < 0.7:
        return [_any(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _any(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _document(rng) -> dict:
    """A random valid document, written independently of lib: its properties in the schema's order."""
    doc = {"name": "".join(rng.choice("ab é\"\\") for _ in range(rng.randint(0, 5))), "age": rng.randint(-99, 999)}
    if rng.random() < 0.5:
        doc["score"] = rng.choice([rng.randint(-5, 5), rng.uniform(-1e3, 1e3), 1e-7])
    if rng.random() < 0.5:
        doc["tags"] = [rng.choice(["a", "ab", 1, 12, None, True]) for _ in range(rng.randint(1, 3))]
    doc["ok"] = rng.random() < 0.5
    if rng.random() < 0.3:
        doc["nothing"] = None
    doc["kind"] = "cat"
    if rng.random() < 0.5:
        doc["any"] = _any(rng)
    if rng.random() < 0.5:
        doc["loose"] = {f"q{i}": _any(rng, 1) for i in range(rng.randint(0, 2))}
    if rng.random() < 0.5:
        doc["pts"] = [{"x": rng.uniform(-3, 3), **({"y": rng.randint(0, 9)} if rng.random() < 0.5 else {})}
                      for _ in range(rng.randint(0, 2))]
    return doc


def _text(doc, rng) -> str:
    return json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1]),
                      separators=rng.choice([(",", ":"), (", ", ": ")]))


def _accepts(machine, text: str):
    state = machine.feed_bytes(machine.start, text.encode())
    return state is not None and machine.complete(state)


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_documents_in_the_schemas_order_are_accepted_and_whatever_is_accepted_validates():
    machine = SchemaMachine(SCHEMA)
    rng = random.Random(SEED)
    texts = [_text(_document(rng), rng) for _ in range(150)]
    for t in texts:
        assert _valid(t) and _accepts(machine, t), (t, f"seed {SEED}")
    accepted = 0
    alphabet = '{}[],:"0123456789.-eE tfnaulrs\\é'
    for _ in range(3000):  # mutations: whatever the machine takes whole must validate
        t = list(rng.choice(texts))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(t) + 1)
            op = rng.random()
            if op < 0.4 and i < len(t):
                del t[i]
            elif op < 0.8:
                t.insert(i, rng.choice(alphabet))
            elif i < len(t):
                t[i] = rng.choice(alphabet)
        t = "".join(t)
        if _accepts(machine, t):
            accepted += 1
            assert _valid(t), (t, f"seed {SEED}")
    assert accepted > 50  # the mutations reached the interesting cases (whitespace, digits, free values)


@pytest.mark.parametrize("text", [
    '{"name":"a","age":1.5,"ok":true,"kind":"cat"}',  # integer with a fraction
    '{"name":"a","age":1e3,"ok":true,"kind":"cat"}',
    '{"name":"a","ok":true,"kind":"cat"}',  # a required property missing
    '{"name":"a","age":1,"ok":true,"kind":"dog"}',  # const
    '{"name":"a","age":1,"ok":true,"kind":"cat","zzz":1}',  # a property the schema does not name
    '{"name":"a","age":1,"tags":[],"ok":true,"kind":"cat"}',  # minItems
    '{"name":"a","age":1,"tags":["a","a","a","a"],"ok":true,"kind":"cat"}',  # maxItems
    '{"name":"a","age":1,"tags":["b"],"ok":true,"kind":"cat"}',  # enum
    '{"name":"a","age":1,"tags":[123],"ok":true,"kind":"cat"}',
    '{"name":"a","age":1,"ok":1,"kind":"cat"}',  # boolean
    '{"name":"a","age":1,"ok":true,"nothing":0,"kind":"cat"}',
    '{"name":"a","age":1,"ok":true,"kind":"cat","loose":[]}',
    '{"name":"a","age":1,"ok":true,"kind":"cat","pts":[{"y":1}]}',
    '{"name":1,"age":1,"ok":true,"kind":"cat"}',
    '[{"name":"a"}]',
])
def test_documents_outside_the_schema_are_refused(text):
    assert not _accepts(SchemaMachine(SCHEMA), text)


@pytest.mark.parametrize("schema, says", [
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}}, "anyOf"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}, r"\$ref"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}, "pattern"),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}, "minimum"),
    ({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}, "one type"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "required"),
    ({"type": "string"}, "root"),
    ({}, "root"),
])
def test_what_the_machine_cannot_follow_is_refused_by_name(schema, says):
    with pytest.raises(SchemaError, match=says):
        SchemaMachine(schema)


def _small_vocabulary():
    pieces = set('{}[],:" 0123456789.-eE\\tfnaulrsecykgmxyzpqho') | {
        '{"', '":', '",', '"}', '"name', '"name":', '"age', 'age":', '"ok":', 'true', 'false', 'null', '12', '1,',
        '"a"', '"ab"', '["a', '"]', '"cat"', 'cat', '"kind":"', '1.5', 'e+', ', "', ': ', '  ', '\n ', 'é', '"q0":',
        '"loose":{', '"pts":[', '{"x":', '"y":'}
    return [p.encode() for p in sorted(pieces)] + [b""]


def _brute(vocab, state):
    want = torch.zeros(vocab.size, dtype=torch.bool)
    for i, t in enumerate(vocab.texts):
        if t is not None and vocab.machine.feed(state, t) is not None:
            want[i] = True
    if vocab.machine.complete(state):
        want[:] = False
        want[vocab.eos] = True
    return want


def test_masks_equal_feeding_every_token():
    table = _small_vocabulary()
    base = JsonVocabulary(table, eos_token_id=len(table) - 1, vocab_size=len(table) + 2)
    vocab = schema_vocabulary(base, SCHEMA)
    rng = random.Random(SEED + 1)
    states = {}
    for _ in range(25):
        state = vocab.machine.start
        for ch in _text(_document(rng), rng).encode().decode("latin-1"):
            states[state] = None
            state = vocab.machine.step(state, ch)
        states[state] = None
    assert len(states) > 300
    for state in states:
        got = vocab.mask(state)
        assert torch.equal(got, _brute(vocab, state)), (state, [vocab.texts[i] for i in (got ^ _brute(vocab, state)).nonzero()])
    assert base.machine is not vocab.machine and isinstance(schema_guide(base, SCHEMA), JsonGuide)


@pytest.mark.model
def test_smollm2_answers_guided_by_a_schema_validate(smollm2):
    """SmolLM2 under the schema's mask: its greedy answer ends by itself and is a document of the schema. (Asked
    for the capital of France instead, it writes the population's digits until max_tokens: an integer has no
    length limit, as in JSON.)"""
    from lib.modeling.generate import generate
    from lib.serve.serving import token_bytes

    model, tok = smollm2
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"enum": ["France", "Spain"]},
                                               "population": {"type": "integer"}},
              "required": ["city", "country", "population"]}
    vocab = JsonVocabulary(token_bytes(tok), tok.eos_token_id, model.config.vocab_size)
    ended = 0
    for temperature, seed in [(0.0, 0)]:
        question = "Name a big city in Spain as JSON with its country and population."
        ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        params = SamplingParams(temperature=temperature, eos_token_id=tok.eos_token_id, guide=schema_guide(vocab, schema))
        out = generate(model, ids, 60, sampling=params, eos_token_id=tok.eos_token_id,
                       generator=torch.Generator().manual_seed(seed))[0, ids.shape[1]:].tolist()
        if tok.eos_token_id in out:
            text = tok.decode(out[:out.index(tok.eos_token_id)])
            jsonschema.validate(json.loads(text), schema)
            ended += 1
    assert ended, "the greedy answer did not close its object within 60 tokens"
