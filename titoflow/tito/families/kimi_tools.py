"""The tool list as Kimi K2.5/K2.6's tokenizer code hands it to the chat template: ``tools_ts_str``,
TypeScript declarations of the tools, which the template writes instead of their JSON.

Kimi's ``tokenization_kimi.py`` (loaded with trust_remote_code) deep-sorts the tools' keys and
passes ``encode_tools_to_typescript_style(tools)`` from its ``tool_declaration_ts.py``; where that
raises, it passes nothing and the template falls back to the JSON. This is titoflow's own
rendering of the same text.

Invariant: :func:`tools_ts_str` returns exactly what Moonshot's ``tool_declaration_ts.py`` returns
for the deep-sorted tools, or None where it raises (tests/titoflow/tito/test_kimi_tools.py holds it
to that file, vendored as a test fixture, on the corpus's tools and on schemas built to reach every
branch: nested objects, arrays with documented items, enums, unions, ``anyOf``, ``$defs`` and
``$ref`` (``#`` included), ``additionalProperties``, defaults, constraints).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_INDENT = "  "
_FIELDS = ",\n"
# The constraints each scalar type documents (in a comment line, sorted by name).
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
}
_UNION = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}


class UnsupportedSchema(ValueError):
    """A schema Kimi's encoder refuses (its template then writes the tools' JSON)."""


@dataclass
class _Registry:
    definitions: dict[str, Any] = field(default_factory=dict)
    self_ref: bool = False

    def resolve(self, ref: str) -> Any:
        if ref == "#":
            self.self_ref = True
            return {"$self_ref": True}
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.definitions:
                raise UnsupportedSchema(f"reference not found: {ref}")
            return self.definitions[name]
        raise UnsupportedSchema(f"unsupported reference: {ref}")


def _comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


@dataclass
class _Type:
    """One schema as a TypeScript type: ``text(indent)``, and the comment lines written above a
    field of this type (its description, its constraints)."""

    kind: str  # scalar, object, array, enum, any_of, union, ref
    description: str = ""
    constraints: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # a scalar's type, a reference's target
    fields: list[_Field] = field(default_factory=list)
    extra: Any = None  # an object's additionalProperties: None, a bool, a _Type or as written
    item: _Type | None = None
    values: list[Any] = field(default_factory=list)  # an enum's values
    members: list[_Type] = field(default_factory=list)  # anyOf's types
    names: list[str] = field(default_factory=list)  # a type list's TypeScript names

    def comments(self, indent: str) -> str:
        lines = [_comment(self.description, indent)] if self.description else []
        if self.constraints:
            pairs = ", ".join(f"{k}: {v}" for k, v in sorted(self.constraints.items()))
            lines.append(f"{indent}// {pairs}")
        return "".join(line + "\n" for line in lines)

    def text(self, indent: str = "") -> str:
        if self.kind == "scalar":
            return "number" if self.name == "integer" else self.name
        if self.kind == "ref":
            return self.name
        if self.kind == "enum":
            return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)
        if self.kind == "any_of":
            return " | ".join(member.text(indent) for member in self.members)
        if self.kind == "union":
            return " | ".join(self.names)
        if self.kind == "array":
            assert self.item is not None
            inner = indent + _INDENT
            documented = self.item.comments(inner)
            if documented:
                return f"Array<\n{documented}{inner}{self.item.text(inner)}\n{indent}>"
            return f"Array<{self.item.text(indent)}>"
        return self._object(indent)

    def _object(self, indent: str) -> str:
        # Required fields first, each group by name.
        ordered = sorted(self.fields, key=lambda f: (f.optional, f.name))
        lines = [f.text(indent + _INDENT) for f in ordered]
        if self.extra is not None:
            if self.extra is True:
                extra = "any"
            elif self.extra is False:
                extra = "never"
            elif isinstance(self.extra, _Type):
                extra = self.extra.text(indent + _INDENT)
            else:
                raise UnsupportedSchema(f"unknown additionalProperties: {self.extra}")
            lines.append(f"{indent}{_INDENT}[k: string]: {extra}")
        if not lines:
            return "{}"
        return "{\n" + _FIELDS.join(lines) + f"\n{indent}}}"


@dataclass
class _Field:
    name: str
    type: _Type
    optional: bool
    default: Any

    def text(self, indent: str) -> str:
        comments = self.type.comments(indent)
        if self.default is not None:
            shown = (
                repr(self.default)
                if isinstance(self.default, (int, float, bool))
                else json.dumps(self.default, ensure_ascii=False)
            )
            comments += f"{indent}// Default: {shown}\n"
        mark = "?" if self.optional else ""
        return f"{comments}{indent}{self.name}{mark}: {self.type.text(indent)}"


def _parse(schema: Any, registry: _Registry) -> _Type:
    if isinstance(schema, bool):
        return _Type("scalar", name="any" if schema else "null")
    if "$ref" in schema:
        target = registry.resolve(schema["$ref"])
        self_ref = target.get("$self_ref", False)
        name = "parameters" if self_ref else schema["$ref"].split("/")[-1]
        return _Type("ref", schema.get("description", ""), name=name)
    if "anyOf" in schema:
        members = [_parse(member, registry) for member in schema["anyOf"]]
        return _Type("any_of", schema.get("description", ""), members=members)
    if "enum" in schema:
        _check_enum(schema)
        return _Type("enum", schema.get("description", ""), values=schema["enum"])
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):
            names = [_UNION[k] for k in kind]  # KeyError: a type Kimi's encoder does not know
            return _Type("union", schema.get("description", ""), names=names)
        if kind == "object":
            return _object(schema, registry)
        if kind == "array":
            limits = {k: v for k, v in schema.items() if k in ("minItems", "maxItems")}
            items = schema.get("items")
            item = _parse(items, registry) if items else _Type("scalar", name="any")
            return _Type("array", schema.get("description", ""), limits, item=item)
        allowed = _CONSTRAINTS.get(kind, ())
        limits = {k: v for k, v in schema.items() if k in allowed}
        return _Type("scalar", schema.get("description", ""), limits, name=kind)
    if schema == {}:
        return _Type("scalar", name="any")
    raise UnsupportedSchema(f"invalid JSON Schema object: {schema}")


def _object(schema: dict[str, Any], registry: _Registry) -> _Type:
    # Parsed in Kimi's order ($defs, then additionalProperties, then the properties): a
    # reference resolves only to a definition registered before it.
    made = _Type("object", schema.get("description", ""))
    if not schema:
        return made
    registry.definitions.update(schema.get("$defs") or {})
    made.extra = schema.get("additionalProperties")
    if isinstance(made.extra, dict):
        made.extra = _parse(made.extra, registry)
    if "properties" not in schema:
        return made
    required = set(schema.get("required", []))
    made.fields = [
        _Field(
            name,
            _parse(prop, registry),
            optional=name not in required,
            default=prop.get("default") if isinstance(prop, dict) else None,
        )
        for name, prop in schema["properties"].items()
    ]
    return made


def _check_enum(schema: dict[str, Any]) -> None:
    """Kimi's encoder refuses an enum whose values are not of its declared type."""
    if "type" not in schema:
        return
    kind = schema["type"]
    if isinstance(kind, list):
        if len(kind) == 2 and "null" in kind:
            kind = kind[0] if kind[0] != "null" else kind[1]
        elif len(kind) == 1:
            kind = kind[0]
        else:
            raise UnsupportedSchema(f"enum type {kind} is not supported")
    expected: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "number": (int, float),
        "integer": int,
        "boolean": bool,
    }
    wanted = expected.get(kind)
    for value in schema["enum"]:
        if value is not None and wanted is not None and not isinstance(value, wanted):
            raise UnsupportedSchema(f"enum value {value} is not a {kind}")


def _function(function: dict[str, Any]) -> str:
    registry = _Registry()
    parameters = _object(function.get("parameters") or {}, registry)
    interfaces = []
    # A schema that refers to itself ("#") is declared as an interface named "parameters", its
    # fields in the order written; only a reference found in the parameters themselves counts.
    self_ref = registry.self_ref
    if self_ref:
        lines = _FIELDS.join(f.text(_INDENT) for f in parameters.fields)
        body = "\n" + lines + "\n" if lines else ""
        interfaces.append("interface parameters {" + body + "}")
    for name, schema in dict(registry.definitions).items():
        described = schema.get("description", "")
        head = _comment(described) + "\n" if described else ""
        interfaces.append(f"{head}interface {name} {_parse(schema, registry).text()}")
    argument = "parameters" if self_ref else parameters.text()
    signature = f"type {function.get('name', 'function')} = (_: {argument}) => any;"
    description = function.get("description")
    parts = ["\n".join(interfaces), _comment(description) if description else "", signature]
    return "\n".join(part for part in parts if part)


def deep_sorted(value: Any) -> Any:
    """``value`` with every mapping's keys sorted, as Kimi's ``deep_sort_dict`` leaves tools."""
    if isinstance(value, dict):
        return {key: deep_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(item) for item in value]
    return value


def tools_ts_str(tools: Sequence[dict[str, Any]]) -> str | None:
    """What Kimi's tokenizer passes its template as ``tools_ts_str`` for ``tools`` (None: it
    passes nothing, no tools or a schema its encoder refuses)."""
    if not tools:
        return None
    try:
        functions = [
            _function(tool["function"])
            for tool in deep_sorted(list(tools))
            if tool.get("type") == "function" and tool.get("function")
        ]
    except (ValueError, KeyError, AttributeError, TypeError):  # Kimi's code: any exception
        return None
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"
