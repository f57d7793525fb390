"""Structured output: the forms a judge can be asked to answer JSON in, and the schema it is given.

OpenAI-compatible servers take different subsets of ``response_format`` (docs/judges.md, "Structured
output"). The forms, in the order a run tries them:

- ``json_schema``: OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``
  (OpenAI, vLLM, Ollama, LM Studio, llama.cpp's ``llama-server``);
- ``json_object_schema``: ``{"type": "json_object", "schema": ...}``, the JSON object constrained by
  a grammar made from the schema (llama-cpp-python's server, which answers ``json_schema`` with
  HTTP 500 "Input should be 'text' or 'json_object'");
- ``json_object``: ``{"type": "json_object"}``, any JSON object (OpenAI's JSON mode);
- ``prompt``: no ``response_format``; the prompt alone asks for the JSON.

``structured_output: auto`` finds the first form an endpoint takes and answers in before the run
(``client.negotiate``), and moves to the next one when the endpoint refuses the form during the
run. The schema is made from the verdict's pydantic model (:func:`strict_schema`): one source for
the grammar a constrained judge writes in and the validator that reads it.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from .provider import Capabilities

FORMS = ("json_schema", "json_object_schema", "json_object", "prompt")
PINNED = {"on": "json_schema", "off": "prompt", **{f: f for f in FORMS}}  # structured_output -> its one form

# An error that says the endpoint does not take the response_format sent (its type, the schema in
# it, the grammar made from it), as servers word it: OpenAI "Invalid parameter: 'response_format'
# of type 'json_schema' is not supported", llama-cpp-python "Input should be 'text' or
# 'json_object'" (loc body.response_format.type), TGI "response_format: missing field `value`",
# vLLM's grammar backends ("xgrammar", "guided decoding", "outlines"), LM Studio
# "'response_format.type' must be 'json_schema'".
REFUSAL_WORDS = re.compile(
    r"response_format|json[_ ]schema|json_object|\bschema\b|grammar|guided|xgrammar|outlines|"
    r"structured output",
    re.I,
)
NOT_A_REFUSAL = {401, 403, 407, 408, 429}  # unauthorised, timed out, rate limited: never about the form

# the question that finds a form: a tiny object with a schema (models/builtin.py answers it too)
PROBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def configured_form(structured_output: str, caps: Capabilities | None) -> str | None:
    """The one form a connection's ``structured_output`` allows, or None for ``auto`` (found per
    endpoint). A provider that takes one form only (the builtin model: ``prompt``, never a
    ``response_format``) is asked in that form whatever the setting."""
    if caps is not None and caps.pinned_form is not None:
        return caps.pinned_form
    return PINNED.get(structured_output)


def next_form(form: str) -> str | None:
    i = FORMS.index(form)
    return FORMS[i + 1] if i + 1 < len(FORMS) else None


def later(a: str, b: str) -> str:
    """The later of two forms (a run only ever moves forward through them)."""
    return a if FORMS.index(a) >= FORMS.index(b) else b


def payload(form: str, name: str, schema: dict[str, Any], strict: bool = True) -> dict[str, Any] | None:
    """The ``response_format`` of ``form`` for ``schema`` (None: plain prompting)."""
    if form == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}
    if form == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    if form == "json_object":
        return {"type": "json_object"}
    if form == "prompt":
        return None
    raise ValueError(f"unknown structured-output form {form!r}; forms: {', '.join(FORMS)}")


def refusal(status: int | None, text: str | None) -> str | None:
    """When an HTTP error answer says the endpoint does not take the ``response_format`` sent:
    the server's words around what names it (at most 300 characters), else None. Any 4xx or 5xx
    but authorisation, timeout and rate-limit answers."""
    if status is None or status < 400 or status in NOT_A_REFUSAL or not text:
        return None
    m = REFUSAL_WORDS.search(text)
    if m is None:
        return None
    start = max(0, min(m.start() - 120, len(text) - 300))
    return ("…" if start else "") + text[start : start + 300].strip()


def probe_answer_ok(text: str | None) -> bool:
    """Whether a probe's answer is the JSON object asked for (``{"ok": <boolean>}``), read as
    judges' answers are read (a code fence, a preamble or a ``<think>`` block around it)."""
    from ..readers.judge_json import scan_json

    objects, unfinished = scan_json(text)
    return not unfinished and any(isinstance(o.get("ok"), bool) for o in objects)


def strict_schema(
    model: type[BaseModel], enums: dict[str, tuple[str, ...]] | None = None
) -> tuple[dict[str, Any], bool]:
    """(the JSON schema a judge is given for ``model``, whether OpenAI's ``strict`` mode takes it).

    Made from the model's own schema: every property ``required`` and ``additionalProperties:
    false``; no ``null`` in a field's type (a verdict that may lack a value says so another way: a
    decision ``"none"``, ``"unjudgeable": true``); references inlined; titles and defaults dropped.
    Literals stay enums and bounds stay ``minimum`` / ``maximum``. ``enums`` replaces a top-level
    field's type by an enum of strings (decision flip: the labels of the row, and ``"none"``).
    A free-form mapping (an object without properties) keeps its ``additionalProperties`` schema:
    strict mode takes none, so such a schema is sent with ``strict: false``."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})
    strict = True

    def walk(s: dict[str, Any]) -> dict[str, Any]:
        nonlocal strict
        if "$ref" in s:
            target = copy.deepcopy(defs[s["$ref"].rsplit("/", 1)[-1]])
            s = {**target, **{k: v for k, v in s.items() if k != "$ref"}}
        if "anyOf" in s:
            options = [o for o in s["anyOf"] if o.get("type") != "null"]
            rest = {k: v for k, v in s.items() if k != "anyOf"}
            s = {**options[0], **rest} if len(options) == 1 else {**rest, "anyOf": options}
        s = {k: v for k, v in s.items() if k not in ("title", "default")}
        if "anyOf" in s:
            s["anyOf"] = [walk(o) for o in s["anyOf"]]
        if s.get("type") == "object":
            props = s.get("properties")
            s.pop("description", None)  # a model's docstring, written for its readers, not for the judge
            if props:
                s["properties"] = {k: walk(v) for k, v in props.items()}
                s["required"] = list(props)
                s["additionalProperties"] = False
            else:
                strict = False
                if isinstance(s.get("additionalProperties"), dict):
                    s["additionalProperties"] = walk(s["additionalProperties"])
        if s.get("type") == "array" and isinstance(s.get("items"), dict):
            s["items"] = walk(s["items"])
        return s

    schema = walk(raw)
    for field, values in (enums or {}).items():
        if field not in schema.get("properties", {}):
            raise ValueError(f"{model.__name__} has no field {field!r} to take an enum")
        schema["properties"][field] = {"type": "string", "enum": list(values)}
    return schema, strict
