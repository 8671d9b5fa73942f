"""Guided decoding to a JSON Schema (`response_format: {"type": "json_schema", ...}`): `lib.serve.guided`'s idea, with a
machine that knows the schema.

    guide = schema_guide(vocabulary, {"type": "object", "properties": {...}, "required": [...]})  # a JsonGuide

`lib.serve.guided.JsonMachine` accepts any JSON object; `SchemaMachine` accepts the documents of one schema, so a mask
built from it (`lib.serve.guided.JsonVocabulary`, the same code: only the machine differs) lets the model write nothing
else. What the machine knows, by the schema's node at each point:

- an **object with `properties`** takes its keys in the schema's order, each key written out whole (the key's JSON
  text is the only continuation, as a literal), a property not in `required` may be skipped, no other key is
  allowed, and `}` only once every required property is there (OpenAI's strict mode asks for all of them);
- an **array** takes `items` values, at least `minItems` and at most `maxItems` of them;
- `string`, `number`, `integer` (no fraction, no exponent), `boolean`, `null`; `enum` and `const`: exactly one of
  the values' JSON texts;
- a node with no `type` (or an object without `properties`, an array without `items`) is any JSON value there.

Everything else a schema may say (`anyOf`, `$ref`, `pattern`, `minimum`, string lengths, a type list, ...) is
refused by name (`SchemaError`) rather than ignored, so a document the machine allows always validates. The root
must be an object. Annotations (`title`, `description`, `default`, `examples`, `$schema`) are ignored.

A state is (stack, mode, detail, ws) like `JsonMachine`'s — the stack a tuple of frames: ("o", node, next property),
("a", node, items begun), ("fo",) and ("fa",) for a free object or array — so `JsonVocabulary` caches masks by it.
"""
from __future__ import annotations

import json

from lib.serve.guided import MAX_WS, WS, JsonGuide, JsonMachine, JsonVocabulary

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment"}
KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum",
            "const"} | ANNOTATIONS
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
FREE = -1  # any JSON value
_LITERAL = {"t": "rue", "f": "alse", "n": "ull"}


class SchemaError(ValueError):
    """A schema this machine does not support, or not a schema: the message names the keyword and where it is."""


def _text(value) -> str:
    """A value's JSON text as the machine reads it: UTF-8 bytes, one character per byte."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8").decode("latin-1")


def compile_schema(schema) -> list[dict]:
    """The schema as a table of nodes (node 0 the root): {"kind": ..., ...}. `SchemaError` for what is not
    supported."""
    nodes: list[dict] = []

    def add(node: dict) -> int:
        nodes.append(node)
        return len(nodes) - 1

    def visit(s, where: str) -> int:
        if s is True or s == {}:
            return FREE
        if not isinstance(s, dict):
            raise SchemaError(f"{where}: a schema must be an object, got {s!r}")
        unknown = sorted(set(s) - KEYWORDS)
        if unknown:
            raise SchemaError(f"{where}: {', '.join(map(repr, unknown))} is not supported by this server's guided "
                              f"decoding (supported: {', '.join(sorted(KEYWORDS - ANNOTATIONS))})")
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else s["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{where}: 'enum' must be a non-empty list")
            return add({"kind": "enum", "values": tuple(sorted({_text(v) for v in values}))})
        kind = s.get("type")
        if kind is None:
            if set(s) - ANNOTATIONS:
                raise SchemaError(f"{where}: a schema with {sorted(set(s) - ANNOTATIONS)} needs a 'type'")
            return FREE
        if kind not in TYPES:
            raise SchemaError(f"{where}: 'type' must be one of {', '.join(TYPES)} (one type, not a list); got {kind!r}")
        if kind == "object":
            props = s.get("properties")
            if props is None:
                if s.get("required"):
                    raise SchemaError(f"{where}: 'required' needs 'properties'")
                return add({"kind": "free_object"})
            if not isinstance(props, dict):
                raise SchemaError(f"{where}: 'properties' must be an object")
            required = s.get("required", [])
            if not isinstance(required, list) or set(required) - set(props):
                raise SchemaError(f"{where}: 'required' must list names of 'properties'; got {required!r}")
            if s.get("additionalProperties", False) not in (False, True):
                raise SchemaError(f"{where}: 'additionalProperties' may only be true or false here")
            index = add({"kind": "object"})  # the root stays node 0
            nodes[index]["props"] = tuple((_text(name), visit(sub, f"{where}.properties.{name}"), name in required)
                                          for name, sub in props.items())
            return index
        if kind == "array":
            low, high = s.get("minItems", 0), s.get("maxItems")
            if not isinstance(low, int) or low < 0 or (high is not None and (not isinstance(high, int) or high < low)):
                raise SchemaError(f"{where}: 'minItems' / 'maxItems' must be integers, 0 <= minItems <= maxItems")
            if "items" not in s:
                return add({"kind": "array", "items": FREE, "min": low, "max": high})
            index = add({"kind": "array", "min": low, "max": high})
            nodes[index]["items"] = visit(s["items"], f"{where}.items")
            return index
        extra = sorted(set(s) - ANNOTATIONS - {"type"})
        if extra:
            raise SchemaError(f"{where}: {extra} do not apply to type {kind!r} here")
        return add({"kind": kind})

    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise SchemaError("the schema's root must be {'type': 'object', ...} (the answer is a JSON object)")
    visit(schema, "schema")
    return nodes


class SchemaMachine(JsonMachine):
    """A byte-level recogniser of the documents of one schema (see the module's docstring)."""

    def __init__(self, schema):
        self.nodes = compile_schema(schema)
        self.start = ((), "value", (0, "top"), 0)

    # -- where a value ends ---------------------------------------------------------------------------------
    def after_value(self, stack):
        return (stack, "after", "", 0) if stack else ((), "done", "", 0)

    def _key_choices(self, frame):
        """A schema object's keys that may come next: from the next property up to the first required one."""
        props = self.nodes[frame[1]]["props"]
        out = []
        for i in range(frame[2], len(props)):
            out.append((props[i][0], i))
            if props[i][2]:
                break
        return tuple(out)

    def _may_close(self, frame) -> bool:
        return not any(required for _, _, required in self.nodes[frame[1]]["props"][frame[2]:])

    # -- one character -----------------------------------------------------------------------------------------
    def step(self, state, ch: str):
        stack, mode, detail, ws = state
        if mode in ("string", "number", "literal"):  # JSON's own (it ends them through this machine's after_value)
            return super().step(state, ch)
        if mode == "integer":  # a number without fraction or exponent
            nxt = None if ch in ".eE" else self._number(detail, ch)
            if nxt is not None:
                return (stack, mode, nxt, 0)
            if detail[-1] not in "0123456789":
                return None
            return self.step(self.after_value(stack), ch)
        if mode in ("keylit", "enum"):
            return self._literal_choice(stack, mode, detail, ch)
        if ch in WS:
            return None if ws >= MAX_WS or mode == "done" else (stack, mode, detail, ws + 1)
        if mode == "value":
            return self._value(stack, detail, ch)
        if mode == "key":
            top = stack[-1]
            if top[0] == "fo":
                if ch == '"':
                    return (stack, "string", (True, 0, 0), 0)
                return self.after_value(stack[:-1]) if ch == "}" and detail == "first" else None
            if ch == "}" and detail == "first" and self._may_close(top):
                return self.after_value(stack[:-1])
            choices = self._key_choices(top)
            return self._literal_choice(stack, "keylit", (choices, ""), ch) if choices else None
        if mode == "colon":
            return (stack, "value", (FREE if detail == "" else detail, ""), 0) if ch == ":" else None
        if mode == "after":
            return self._after(stack, ch)
        return None

    def _literal_choice(self, stack, mode, detail, ch):
        """Keys and enum values: the text typed so far must stay a prefix of one of the choices. A complete key
        (keys are quoted, so none is a prefix of another) moves its object's frame past that property, and the
        colon comes next; a complete enum value is followed by what follows a value."""
        choices, typed = detail
        if mode == "keylit":
            for text, index in choices:
                if typed == text:
                    frame = stack[-1]
                    node = self.nodes[frame[1]]["props"][index][1]
                    moved = stack[:-1] + ((frame[0], frame[1], index + 1),)
                    if ch in WS:
                        return (moved, "colon", node, 1)
                    return (moved, "value", (node, ""), 0) if ch == ":" else None
        texts = [c[0] for c in choices] if mode == "keylit" else choices
        grown = typed + ch
        if any(t.startswith(grown) for t in texts):
            return (stack, mode, (choices, grown), 0)
        if mode == "enum" and typed in texts:  # a complete value, then what follows a value
            return self.step(self.after_value(stack), ch)
        return None

    def _value(self, stack, detail, ch):
        node, where = detail
        if where == "top":
            if ch != "{":
                return None
        elif stack and stack[-1][0] in ("a", "fa") and where == "first" and ch == "]":
            top = stack[-1]
            if top[0] == "a" and self.nodes[top[1]]["min"] > 0:
                return None
            return self.after_value(stack[:-1])
        if stack and stack[-1][0] == "a":  # one more item of a schema array begins
            top = stack[-1]
            high = self.nodes[top[1]]["max"]
            if high is not None and top[2] >= high:
                return None
            stack = stack[:-1] + (("a", top[1], top[2] + 1),)
        kind = "free" if node == FREE else self.nodes[node]["kind"]
        if kind == "free":
            return self._free_value(stack, ch)
        if kind == "object":
            return (stack + (("o", node, 0),), "key", "first", 0) if ch == "{" else None
        if kind == "free_object":
            return (stack + (("fo",),), "key", "first", 0) if ch == "{" else None
        if kind == "array":
            if ch != "[":
                return None
            return (stack + (("a", node, 0),), "value", (self.nodes[node]["items"], "first"), 0)
        if kind == "string":
            return (stack, "string", (False, 0, 0), 0) if ch == '"' else None
        if kind in ("number", "integer"):
            return (stack, kind, ch, 0) if ch == "-" or (ch.isdigit() and ch.isascii()) else None
        if kind == "boolean":
            return (stack, "literal", _LITERAL[ch], 0) if ch in "tf" else None
        if kind == "null":
            return (stack, "literal", "ull", 0) if ch == "n" else None
        if kind == "enum":
            return self._literal_choice(stack, "enum", (self.nodes[node]["values"], ""), ch)
        return None

    def _free_value(self, stack, ch):
        if ch == "{":
            return (stack + (("fo",),), "key", "first", 0)
        if ch == "[":
            return (stack + (("fa",),), "value", (FREE, "first"), 0)
        if ch == '"':
            return (stack, "string", (False, 0, 0), 0)
        if ch == "-" or (ch.isdigit() and ch.isascii()):
            return (stack, "number", ch, 0)
        if ch in _LITERAL:
            return (stack, "literal", _LITERAL[ch], 0)
        return None

    def _after(self, stack, ch):
        top = stack[-1]
        kind = top[0]
        if kind == "fo":
            return (stack, "key", "", 0) if ch == "," else self.after_value(stack[:-1]) if ch == "}" else None
        if kind == "fa":
            return (stack, "value", (FREE, ""), 0) if ch == "," else self.after_value(stack[:-1]) if ch == "]" else None
        node = self.nodes[top[1]]
        if kind == "a":
            if ch == "," and (node["max"] is None or top[2] < node["max"]):
                return (stack, "value", (node["items"], ""), 0)
            return self.after_value(stack[:-1]) if ch == "]" and top[2] >= node["min"] else None
        if ch == ",":  # another key must follow: only if one may
            return (stack, "key", "", 0) if self._key_choices(top) else None
        return self.after_value(stack[:-1]) if ch == "}" and self._may_close(top) else None


def schema_vocabulary(vocabulary: JsonVocabulary, schema) -> JsonVocabulary:
    """`vocabulary`'s token tables (built once per tokenizer) with a `SchemaMachine` for `schema` and masks of its
    own. `SchemaError` for a schema the machine does not support."""
    machine = SchemaMachine(schema)
    out = object.__new__(type(vocabulary))
    out.__dict__.update(vocabulary.__dict__)
    out.machine, out._masks = machine, {}
    return out


def schema_guide(vocabulary: JsonVocabulary, schema) -> JsonGuide:
    """A guide (one sequence's) whose answers are the documents of `schema`."""
    return JsonGuide(schema_vocabulary(vocabulary, schema))
