"""The policy's chat template rendered as transformers renders it, without redoing on every call
what only changes with the tool list.

Invariant: :meth:`ChatTemplate.render` returns exactly the text of
``tokenizer.apply_chat_template(messages, tools=list(tools) or None, add_generation_prompt=...,
tokenize=False, **template_kwargs)`` (tests/titoflow/tito/test_template.py holds it for every family
on generated conversations and tool lists): the same compiled template, in an overlay of
transformers' own sandboxed environment, given equal inputs. What changes is when they are made:
the tools' plain copy, the template switches with the special tokens, and each tool's ``tojson``
text once per tool list, kept, instead of on every call (a long tool list would be copied and
serialized on every turn); the messages, template dicts of plain JSON values made for the call,
are not copied (transformers' plain copy of them is equal to them), only stripped of None values
and given reasoning aliases by transformers' own function; and the sandbox's verdict on an
attribute name once per type. A kept tool's JSON cannot go stale: the sandbox refuses every
method that mutates a dict or a list, and jinja has no item assignment. Any call the shortcut
does not cover (a tokenizer with its own ``apply_chat_template``, a template switch that collides
with a parameter, no messages) goes to ``apply_chat_template`` itself.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import PreTrainedTokenizerBase
from transformers.utils import chat_template_utils as hf

# Distinct tool lists (with template switches) kept; a fleet's scaffolds send a handful.
TOOLSETS_KEPT = 64

# Names a template switch may not take: apply_chat_template's and render_jinja_template's own
# parameters (transformers refuses them as duplicate arguments, or reads them itself).
_RESERVED = frozenset(
    {"messages", "conversations"}
    | set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    | set(inspect.signature(hf.render_jinja_template).parameters)
)


@dataclass(frozen=True)
class _Toolset:
    template: Any  # the compiled template (jinja2.Template) for calls with or without tools
    tools: list[Any] | None  # the tools as the template sees them
    kwargs: dict[str, Any]  # the special tokens and the template switches, as transformers passes


class ChatTemplate:
    """``tokenizer``'s default chat template; :meth:`render` as ``apply_chat_template`` renders."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        kind = type(tokenizer)
        self._direct = (
            isinstance(tokenizer, PreTrainedTokenizerBase)
            and kind.apply_chat_template is PreTrainedTokenizerBase.apply_chat_template
            and kind.get_chat_template is PreTrainedTokenizerBase.get_chat_template
        )
        self._toolsets: dict[str, _Toolset] = {}
        self._templates: dict[str, Any] = {}
        # Every dict and list of a kept tool list, by id (the object itself held, so an id is
        # never reused while it is here), and the JSON made of them: (object, text) by call.
        self._kept: dict[int, Any] = {}
        self._json: dict[Any, tuple[Any, str]] = {}
        self._lock = threading.Lock()  # off-loop renders (worker threads) keep tool lists too

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
        key: str,
    ) -> str:
        """The template's text for ``messages`` (template dicts) under ``tools`` and
        ``template_kwargs``, whose :func:`titoflow.tito.messages.render_key` is ``key`` (kept
        parts are found by it: it tells apart what renders apart)."""
        if not self._direct or not messages or not _RESERVED.isdisjoint(template_kwargs):
            return str(
                self._tokenizer.apply_chat_template(
                    messages,
                    tools=list(tools) or None,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                    **template_kwargs,
                )
            )
        toolset = self._toolsets.get(key) or self._keep(key, tools, template_kwargs)
        # transformers' per-call preparation of the messages, less its copies: template dicts
        # hold plain JSON values only (so its plain copy equals them), and the sandbox never
        # mutates them; the dicts are the caller's own, made for this call.
        chat = hf._alias_reasoning_fields(
            [{name: value for name, value in m.items() if value is not None} for m in messages]
        )
        return str(
            toolset.template.render(
                messages=chat,
                tools=toolset.tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **toolset.kwargs,
            )
        )

    def _keep(
        self, key: str, tools: Sequence[dict[str, Any]], template_kwargs: dict[str, Any]
    ) -> _Toolset:
        schemas = list(tools) or None
        source = self._tokenizer.get_chat_template(None, schemas)
        plain = hf._plain_template_data(schemas)
        kwargs = hf._plain_template_data({**self._tokenizer.special_tokens_map, **template_kwargs})
        with self._lock:
            if len(self._toolsets) >= TOOLSETS_KEPT:
                self._toolsets.clear()
                self._kept.clear()
                self._json.clear()
            toolset = _Toolset(self._template(source), plain, kwargs)
            _hold(plain, self._kept)
            self._toolsets[key] = toolset
        return toolset

    def _template(self, source: str) -> Any:
        """transformers' compiled template, in an overlay of its environment whose ``tojson``
        keeps what it made of a kept tool list's objects and whose sandbox keeps its verdicts
        on attribute names (:func:`_known_safe`)."""
        template = self._templates.get(source)
        if template is None:
            environment: Any = hf._compile_jinja_template(source).environment.overlay()
            environment.filters = dict(environment.filters)
            environment.filters["tojson"] = self._tojson(environment.filters["tojson"])
            if type(environment) is ImmutableSandboxedEnvironment:
                namespace = environment.globals["namespace"]  # transformers' own class
                assert isinstance(namespace, type)
                known = _PLAIN_TYPES | {LoopContext, namespace}
                # This overlay's own verdicts, over the class's method it wraps.
                environment.is_safe_attribute = _known_safe(  # type: ignore[method-assign]
                    environment.is_safe_attribute, known
                )
            template = self._templates[source] = environment.from_string(source)
        return template

    def _tojson(self, tojson: Any) -> Any:
        kept, made_of = self._kept, self._json  # cleared in place, never replaced

        def kept_tojson(value: Any, *args: Any, **kwargs: Any) -> str:
            # Keyed by the object (and the call's options); the entry holds the object, so its
            # id is not reused while the entry is there.
            try:
                call = (
                    (id(value), args, tuple(sorted(kwargs.items())))
                    if args or kwargs
                    else id(value)
                )
                made = made_of.get(call)
            except TypeError:  # an unhashable option (a list of separators): made each time
                return str(tojson(value, *args, **kwargs))
            if made is not None and made[0] is value:
                return made[1]
            text = str(tojson(value, *args, **kwargs))
            if kept.get(id(value)) is value:
                made_of[call] = (value, text)
            return text

        return kept_tojson


def _hold(value: Any, kept: dict[int, Any]) -> None:
    """Every dict and list inside ``value`` (a plain copy: nothing else references them)."""
    if isinstance(value, dict):
        kept[id(value)] = value
        for item in value.values():
            _hold(item, kept)
    elif isinstance(value, list):
        kept[id(value)] = value
        for item in value:
            _hold(item, kept)


# Plain values' types: with the template's namespaces and loops, the objects a template reads
# attributes of. The sandbox's verdict on an attribute is a function of the object's type and the
# attribute's name (isinstance tests against internal types and the mutable ABCs, whose
# registrations do not change, and name tests); the value is not read.
_PLAIN_TYPES: frozenset[type] = frozenset({str, dict, list, tuple, int, float, bool, type(None)})


def _known_safe(is_safe: Any, types: frozenset[type]) -> Any:
    """The sandbox's ``is_safe_attribute``, its verdict kept per (type, name) for ``types``:
    templates read ``ns.last_query_index``, ``loop.last`` and ``message.content.startswith`` on
    every message of every render, each verdict a dozen isinstance tests (a fifth of a
    continuation's render)."""
    known: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in types:
            return bool(is_safe(obj, attr, value))
        safe = known.get((kind, attr))
        if safe is None:
            safe = known[kind, attr] = bool(is_safe(obj, attr, value))
        return safe

    return is_safe_attribute
