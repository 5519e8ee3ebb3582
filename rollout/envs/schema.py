"""Tool schemas derived from typed Python functions, and the validation of a model's arguments against them.

A tool is `fn(state, arg: T, ...) -> result` with a Google-style docstring: the first paragraph describes the tool,
`Args:` describes each parameter (every parameter must be described: the model sees nothing else), `Returns:` is
appended to the description. The schema is OpenAI/HF style:
    {"type": "function", "function": {"name", "description", "parameters": <JSON schema of an object>}}

Types understood: str, int, float, bool, None, Any, list[T], dict / dict[str, T], Literal[...], unions (`A | B`,
Optional), TypedDict (an object with those keys), and `Annotated[T, ...]` whose metadata may be a str (the
description) or a dict of JSON-schema keywords (minimum, maximum, minLength, maxLength, minItems, maxItems).

Validation covers exactly the keywords generated here, so every violation can be named in words the model can act
on ("missing required argument 'city'", "argument 'k' must be an integer, got string '5'"). It is strict on
purpose: no coercion ("5" is not 5), because a tool that silently repairs arguments teaches nothing.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from typing import Any

_PRIMITIVES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_SCHEMA_KEYWORDS = ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems")


# --------------------------------------------------------------------------------------------------- docstrings
def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring. Sections other than Args are kept in
    the description as "Section: text" (e.g. Returns), since they tell the model what it will get back."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        m = re.fullmatch(r"([A-Z][A-Za-z ]*):\s*", line)
        if m and not line.startswith(" "):
            current = m.group(1)
            sections[current] = []
        elif current is None:
            head.append(line)
        else:
            sections[current].append(line)
    args: dict[str, str] = {}
    body = [ln for ln in sections.pop("Args", []) + sections.pop("Arguments", []) if ln.strip()]
    base = min((len(ln) - len(ln.lstrip()) for ln in body), default=0)
    name = None
    for line in body:  # "name: text" at the section's indent starts a parameter; deeper lines continue it
        m = re.fullmatch(r"(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line.strip())
        if m and len(line) - len(line.lstrip()) == base:
            name = m.group(1)
            args[name] = m.group(2).strip()
        elif name is not None:
            args[name] = (args[name] + " " + line.strip()).strip()
    description = " ".join(" ".join(head).split())
    for title, section_lines in sections.items():
        text = " ".join(" ".join(section_lines).split())
        if text:
            description += f" {title}: {text}"
    return description.strip(), args


# ------------------------------------------------------------------------------------------------ type -> schema
def _is_typeddict(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def json_schema_of(tp) -> dict:
    """The JSON schema of a type hint (see the module docstring for the types understood)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        schema = json_schema_of(args[0])
        for meta in args[1:]:
            if isinstance(meta, str):
                schema["description"] = meta
            elif isinstance(meta, dict):
                unknown = set(meta) - set(_SCHEMA_KEYWORDS) - {"description"}
                if unknown:
                    raise TypeError(f"unsupported schema keywords {sorted(unknown)} (allowed: {_SCHEMA_KEYWORDS})")
                schema.update(meta)
        return schema
    if tp is Any:
        return {}
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if origin is typing.Literal:
        kinds = {_PRIMITIVES[type(a)] for a in args}
        schema = {"enum": list(args)}
        if len(kinds) == 1:
            schema["type"] = kinds.pop()
        return schema
    if origin in (typing.Union, types.UnionType):
        parts = [json_schema_of(a) for a in args]
        if all(set(p) == {"type"} and isinstance(p["type"], str) for p in parts):
            kinds = list(dict.fromkeys(p["type"] for p in parts))
            if "number" in kinds and "integer" in kinds:
                kinds.remove("integer")  # an integer is a number already
            return {"type": kinds if len(kinds) > 1 else kinds[0]}
        return {"anyOf": parts}
    if tp is list or origin is list:
        return {"type": "array", "items": json_schema_of(args[0])} if args else {"type": "array"}
    if tp is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError("JSON objects have string keys: use dict[str, T]")
        return {"type": "object", "additionalProperties": json_schema_of(args[1])} if args else {"type": "object"}
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {"type": "object", "properties": {k: json_schema_of(v) for k, v in hints.items()},
                "required": [k for k in hints if k in tp.__required_keys__], "additionalProperties": False}
    raise TypeError(f"no JSON schema for type {tp!r}")


def tool_schema(fn) -> dict:
    """The OpenAI/HF tool schema of `fn(state, ...)`: its first parameter (the session state) is left out; every
    other parameter needs a type hint and an `Args:` line; parameters without a default are required."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        raise TypeError(f"tool {fn.__name__}: the first parameter must be the session state")
    hints = typing.get_type_hints(fn, include_extras=True)
    description, arg_docs = parse_docstring(fn.__doc__)
    if not description:
        raise TypeError(f"tool {fn.__name__}: needs a docstring (the model reads it)")
    properties, required = {}, []
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {fn.__name__}: parameter {p.name} must be a plain named parameter")
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} has no type hint")
        if p.name not in arg_docs:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} is not described under 'Args:'")
        schema = json_schema_of(hints[p.name])
        schema.setdefault("description", arg_docs[p.name])
        if p.default is p.empty:
            required.append(p.name)
        elif p.default is not None:
            json.dumps(p.default)  # a default the model is told about must be JSON
            schema["default"] = p.default
        properties[p.name] = schema
    return {"type": "function", "function": {
        "name": fn.__name__, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


# --------------------------------------------------------------------------------------------------- validation
_TYPE_CHECK = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
_ARTICLE = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
            "null": "null", "array": "an array", "object": "an object"}


def _json_kind(value) -> str:
    for kind in ("boolean", "integer", "number", "string", "null", "array", "object"):
        if _TYPE_CHECK[kind](value):
            return kind
    return type(value).__name__


def _show(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def validate(value, schema: dict, where: str) -> list[str]:
    """Every violation of `schema` by `value`, each naming its place (`where`, e.g. "argument 'plan'")."""
    if "anyOf" in schema:
        if any(not validate(value, s, where) for s in schema["anyOf"]):
            return []
        kinds = " or ".join(_ARTICLE.get(s.get("type"), "another form") for s in schema["anyOf"])
        return [f"{where} must be {kinds}, got {_json_kind(value)} {_show(value)}"]
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPE_CHECK[k](value) for k in kinds):
            want = " or ".join(_ARTICLE[k] for k in kinds)
            return [f"{where} must be {want}, got {_json_kind(value)} {_show(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where} must be one of {', '.join(_show(e) for e in schema['enum'])}; got {_show(value)}"]
    errors = []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where} must be >= {schema['minimum']}, got {_show(value)}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where} must be <= {schema['maximum']}, got {_show(value)}")
    if isinstance(value, (str, list)):
        unit = "characters" if isinstance(value, str) else "items"
        low = schema.get("minLength" if isinstance(value, str) else "minItems")
        high = schema.get("maxLength" if isinstance(value, str) else "maxItems")
        if low is not None and len(value) < low:
            errors.append(f"{where} must have at least {low} {unit}, got {len(value)}")
        if high is not None and len(value) > high:
            errors.append(f"{where} must have at most {high} {unit}, got {len(value)}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        errors += _validate_object(value, schema, where)
    return errors


def _validate_object(value: dict, schema: dict, where: str) -> list[str]:
    errors = []
    props = schema.get("properties")
    for key in schema.get("required", []):
        if key not in value:
            errors.append(f"{where} is missing the field {key!r}")
    for key, item in value.items():
        if not isinstance(key, str):
            errors.append(f"{where} has a non-string key {_show(key)}")
        elif props is not None and key in props:
            errors += validate(item, props[key], f"{where}.{key}")
        elif schema.get("additionalProperties") is False:
            allowed = ", ".join(props or {}) or "none"
            errors.append(f"{where} has an unexpected field {key!r} (allowed: {allowed})")
        elif isinstance(schema.get("additionalProperties"), dict):
            errors += validate(item, schema["additionalProperties"], f"{where}.{key}")
    return errors


def validate_arguments(args, schema: dict) -> list[str]:
    """The violations of a tool call's arguments against its tool schema, top-level ones named as arguments."""
    params = schema["function"]["parameters"]
    if not isinstance(args, dict):
        return [f"the arguments must be a JSON object of named arguments, got {_json_kind(args)} {_show(args)}"]
    props = params["properties"]
    errors = [f"missing required argument {key!r}" for key in params["required"] if key not in args]
    for key, value in args.items():
        if key not in props:
            errors.append(f"unexpected argument {key!r} (the tool takes: {', '.join(props) or 'no arguments'})")
        else:
            errors += validate(value, props[key], f"argument {key!r}")
    return errors
