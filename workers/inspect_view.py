"""``titoflow inspect``: one session's segments as a person wants to see them.

Tokens are decoded with the policy's tokenizer (special tokens shown, never re-encoded) and
coloured by loss mask (context vs generated), logprob source (the schema's codes: none, sampled,
constrained, recomputed once it exists) and, when known, the weight version that sampled them;
step boundaries and per-step metadata come with them. Output is ANSI text for a terminal or a
self-contained HTML page (inline CSS, no scripts, no external assets; hover a token for its id,
logprob, source and version).

Segments come from a JSONL file (what ``titoflow replay`` writes), from the segments topic
(scanned without a consumer group), or from a replay of the steps topic for the session — the
last one also shows each step's full ``step_recorded`` metadata and weight versions.
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import schemas.events as events
from schemas.events import SegmentFinalized, SegmentStep, StepRecorded
from titoflow.settings import Settings
from workers.assembler import StepsEvent
from workers.replay import (
    Progress,
    ReplayOptions,
    ReplayReport,
    read_range,
    replay_segments,
    start_offsets,
    start_reader,
    topic_partitions,
)

# Tokens decoded before a piece, so merges and leading spaces decode as in the full text.
_WINDOW = 6
# A UTF-8 character has at most 4 bytes: byte-level tokens of one character merge into one piece.
_MAX_MERGE = 4

_NOT_IN_HEADER = {
    "schema_version",
    "type",
    "token_ids",
    "loss_mask",
    "logprobs",
    "logprob_source",
    "steps",
    "weight_versions",
    "finalize_reason",
    "event_time",
}
_KNOWN_STEP_FIELDS = set(SegmentStep.model_fields)


def source_names() -> dict[int, str]:
    """Logprob source codes, from the schema's ``LOGPROB_SOURCE_*`` constants (``none``,
    ``sampled``, ``constrained``, and ``recomputed`` once the schema defines it)."""
    prefix = "LOGPROB_SOURCE_"
    return {
        value: name.removeprefix(prefix).lower()
        for name, value in vars(events).items()
        if name.startswith(prefix) and isinstance(value, int)
    }


def source_name(code: int) -> str:
    return source_names().get(code, f"source-{code}")


# --- decoding -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """Text of tokens ``[start, end)`` of a segment: one token, or the few tokens of one
    character that a byte-level vocabulary split."""

    text: str
    start: int
    end: int
    special: bool = False


class TokenDecoder:
    """Per-token text from a Hugging Face tokenizer (or ``⟨id⟩`` without one)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self._tokenizer = tokenizer
        self.special_ids: set[int] = set()
        if tokenizer is not None:
            self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
            self.special_ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        assert self._tokenizer is not None
        text = self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return str(text)

    def pieces(self, ids: Sequence[int], start: int, end: int) -> list[Piece]:
        """Pieces covering ``ids[start:end]``, none crossing ``start`` or ``end``."""
        if self._tokenizer is None:
            return [Piece(f"⟨{ids[i]}⟩", i, i + 1) for i in range(start, end)]
        out: list[Piece] = []
        at = start
        while at < end:
            if ids[at] in self.special_ids:
                out.append(Piece(self._decode([ids[at]]), at, at + 1, special=True))
                at += 1
                continue
            context = max(0, at - _WINDOW)
            seen = self._decode(ids[context:at])
            stop = at + 1
            text = self._decode(ids[context:stop])
            while (
                text.endswith("\ufffd")
                and stop < end
                and stop - at < _MAX_MERGE
                and ids[stop] not in self.special_ids
            ):
                stop += 1
                text = self._decode(ids[context:stop])
            piece = text[len(seen) :] if text.startswith(seen) else self._decode(ids[at:stop])
            out.append(Piece(piece, at, stop))
            at = stop
        return out


# --- the view model -----------------------------------------------------------------------------


@dataclass
class StepView:
    index: int
    step: SegmentStep
    context: list[Piece]
    completion: list[Piece]
    metadata: dict[str, Any]


@dataclass
class SegmentView:
    segment: SegmentFinalized
    steps: list[StepView]
    versions: list[str | None]  # per token
    header: dict[str, Any]
    still_open: bool = False

    def version_names(self) -> list[str]:
        return list(dict.fromkeys(v for v in self.versions if v is not None))


@dataclass
class Loaded:
    """A segment as read, with its raw JSON (fields this schema version does not know yet)."""

    segment: SegmentFinalized
    raw: dict[str, Any] = field(default_factory=dict)


def _span_field(span: Any, name: str) -> Any:
    return span.get(name) if isinstance(span, dict) else getattr(span, name)


def _spans_to_tokens(
    versions: list[str | None], spans: Iterable[Any], offset: int, limit: int
) -> None:
    for span in spans:
        start = offset + int(_span_field(span, "start"))
        end = min(offset + int(_span_field(span, "end")), limit)
        for i in range(start, end):
            versions[i] = str(_span_field(span, "version"))


def token_versions(
    loaded: Loaded, step_events: dict[str, StepRecorded] | None = None
) -> list[str | None]:
    """Weight version of each token, when known: spans ``{version, start, end}`` over the
    segment's tokens (``weight_versions`` on the segment), else over each step's completion
    (``weight_versions`` on a segment step, or on its ``step_recorded`` event)."""
    segment = loaded.segment
    n = len(segment.token_ids)
    versions: list[str | None] = [None] * n
    top = loaded.raw.get("weight_versions")
    if isinstance(top, list) and top:
        _spans_to_tokens(versions, top, 0, n)
        return versions
    raw_steps = loaded.raw.get("steps") or []
    for index, step in enumerate(segment.steps):
        raw_step = raw_steps[index] if index < len(raw_steps) else {}
        spans: Any = raw_step.get("weight_versions") if isinstance(raw_step, dict) else None
        if not spans and step_events and step.step_id in step_events:
            spans = step_events[step.step_id].weight_versions
        if spans:
            _spans_to_tokens(versions, spans, step.completion_start, step.completion_end)
    return versions


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _step_metadata(
    segment: SegmentFinalized, step: SegmentStep, raw_step: dict[str, Any], event: Any
) -> dict[str, Any]:
    completion = range(step.completion_start, step.completion_end)
    # Only real logprobs (a completion carried into a later segment as context has none).
    logprobs = [
        segment.logprobs[i]
        for i in completion
        if segment.logprob_source[i] != events.LOGPROB_SOURCE_NONE
    ]
    meta: dict[str, Any] = {
        "step_id": step.step_id,
        "prefix": step.prefix,
        "finish_reason": step.finish_reason,
        "context_tokens": step.completion_start - step.prompt_start,
        "completion_tokens": len(completion),
        "tokens": f"[{step.prompt_start}, {step.completion_start}) + "
        f"[{step.completion_start}, {step.completion_end})",
    }
    if logprobs:
        meta["mean_logprob"] = round(sum(logprobs) / len(logprobs), 4)
        meta["min_logprob"] = round(min(logprobs), 4)
    meta.update({k: v for k, v in raw_step.items() if k not in _KNOWN_STEP_FIELDS})
    if isinstance(event, StepRecorded):
        meta.update(
            {
                "parent_step_id": event.parent_step_id,
                "prefix_len": event.prefix_len,
                "turn_id": event.turn_id,
                "api": event.api,
                "stream": event.stream,
                "matcher": event.matcher,
                "model": event.model,
                "engine_request_id": event.engine_request_id,
                "render_ms": round(event.render_ms, 2),
                "engine_ms": round(event.engine_ms, 2),
                "event_time": _time(event.event_time),
                "new_messages": len(event.new_messages),
            }
        )
        if event.weight_versions:
            meta["weight_versions"] = [s.model_dump() for s in event.weight_versions]
        if event.tool_parse_error:
            meta["tool_parse_error"] = event.tool_parse_error
    return meta


def build_view(
    loaded: Loaded,
    decoder: TokenDecoder,
    step_events: dict[str, StepRecorded] | None = None,
    still_open: bool = False,
) -> SegmentView:
    segment = loaded.segment
    ids = segment.token_ids
    raw_steps = loaded.raw.get("steps") or []
    steps = []
    for index, step in enumerate(segment.steps):
        raw_step = raw_steps[index] if index < len(raw_steps) else {}
        event = (step_events or {}).get(step.step_id)
        steps.append(
            StepView(
                index=index,
                step=step,
                context=decoder.pieces(ids, step.prompt_start, step.completion_start),
                completion=decoder.pieces(ids, step.completion_start, step.completion_end),
                metadata=_step_metadata(segment, step, raw_step, event),
            )
        )
    generated = [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m]
    header: dict[str, Any] = {
        "segment_id": segment.segment_id,
        "session_id": segment.session_id,
        "chain_id": segment.chain_id,
        "instance_id": segment.instance_id,
        "finalize_reason": segment.finalize_reason
        + (" (still open: closed for viewing)" if still_open else ""),
        "split_reason": segment.split_reason,
        "event_time": _time(segment.event_time),
        "tokens": len(ids),
        "generated_tokens": len(generated),
        "steps": len(segment.steps),
    }
    if generated:
        header["mean_generated_logprob"] = round(sum(generated) / len(generated), 4)
    sources = {source_name(c): n for c, n in _counts(segment.logprob_source).items()}
    header["logprob_sources"] = sources
    if segment.metadata:
        header["metadata"] = segment.metadata
    spans = loaded.raw.get("weight_versions")
    if isinstance(spans, list) and spans:
        header["weight_versions"] = ", ".join(
            f"{_span_field(s, 'version')} [{_span_field(s, 'start')}, {_span_field(s, 'end')})"
            for s in spans
        )
    covered = sorted((s.prompt_start, s.completion_end) for s in segment.steps)
    untracked, at = [], 0
    for start, end in [*covered, (len(ids), len(ids))]:
        if start > at:
            untracked.append(f"[{at}, {start})")
        at = max(at, end)
    if untracked:  # tokens no step accounts for: not shown below
        header["tokens_outside_steps"] = ", ".join(untracked)
    # Whatever else the segment carries (rollout id, diagnostics, fields newer than this code).
    header.update(
        {k: v for k, v in loaded.raw.items() if k not in header and k not in _NOT_IN_HEADER}
    )
    return SegmentView(
        segment, steps, token_versions(loaded, step_events), header, still_open=still_open
    )


def _counts(values: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


# --- token classes (shared by both renderers) ---------------------------------------------------


@dataclass(frozen=True)
class TokenStyle:
    mask: int
    source: str
    anomaly: bool  # generated (mask 1) but no logprob source: a silent zero
    version: int | None  # index into the segment's version names
    special: bool


def _style(view: SegmentView, piece: Piece, versions: list[str]) -> TokenStyle:
    last = piece.end - 1
    segment = view.segment
    mask = segment.loss_mask[last]
    code = segment.logprob_source[last]
    version = view.versions[last]
    return TokenStyle(
        mask=mask,
        source=source_name(code),
        anomaly=bool(mask) and code == events.LOGPROB_SOURCE_NONE,
        version=versions.index(version) if version is not None else None,
        special=piece.special,
    )


def _token_lines(view: SegmentView, piece: Piece) -> list[str]:
    segment = view.segment
    lines = []
    for i in range(piece.start, piece.end):
        code = segment.logprob_source[i]
        logprob = "—" if code == events.LOGPROB_SOURCE_NONE else f"{segment.logprobs[i]:.4f}"
        line = (
            f"#{i} id={segment.token_ids[i]} mask={segment.loss_mask[i]} "
            f"logprob={logprob} source={source_name(code)}"
        )
        if view.versions[i] is not None:
            line += f" version={view.versions[i]}"
        lines.append(line)
    return lines


def _elide(pieces: list[Piece], keep: int | None) -> tuple[list[Piece], list[Piece], int]:
    """First and last ``keep`` pieces and how many tokens lie between (``keep=None``: all)."""
    if keep is None or len(pieces) <= 2 * keep:
        return pieces, [], 0
    head, tail = pieces[:keep], pieces[len(pieces) - keep :]
    hidden = tail[0].start - head[-1].end if head else tail[0].start - pieces[0].start
    return head, tail, hidden


# --- terminal -------------------------------------------------------------------------------------

_RESET = "\x1b[0m"
_SOURCE_FG = {
    "none": "38;5;245",
    "sampled": "38;5;114",
    "constrained": "38;5;75",
    "recomputed": "38;5;214",
}
_SOURCE_MEANING = {
    "sampled": "the engine's logprob of the token it sampled",
    "constrained": "sampled under constrained decoding (a forced tool call)",
    "recomputed": "recomputed with the engine's prompt logprobs after a divergence",
}
_OTHER_FG = "38;5;177"
_ANOMALY = "38;5;203;4"
_VERSION_BG = ["48;5;17", "48;5;52", "48;5;22", "48;5;53", "48;5;58", "48;5;23", "48;5;237"]


def _generated_sources() -> list[str]:
    """Every source a generated token can have, for legends (known ones first)."""
    names = [n for n in source_names().values() if n != "none"]
    return [n for n in _SOURCE_MEANING if n in names] + sorted(set(names) - set(_SOURCE_MEANING))


def _ansi(style: TokenStyle) -> str:
    codes = [_ANOMALY if style.anomaly else _SOURCE_FG.get(style.source, _OTHER_FG)]
    if style.mask:
        codes.append("1")
    if style.special:
        codes.append("3")
    if style.version is not None:
        codes.append(_VERSION_BG[style.version % len(_VERSION_BG)])
    return "\x1b[" + ";".join(codes) + "m"


def _legend_text(view: SegmentView, color: bool) -> str:
    def sample(text: str, style: TokenStyle) -> str:
        return f"{_ansi(style)}{text}{_RESET}" if color else text

    parts = [
        sample("context", TokenStyle(0, "none", False, None, False)),
        *(
            sample(f"generated·{name}", TokenStyle(1, name, False, None, False))
            for name in _generated_sources()
        ),
        sample("generated without logprob!", TokenStyle(1, "none", True, None, False)),
        sample("<special>", TokenStyle(0, "none", False, None, True)),
    ]
    names = view.version_names()
    parts += [
        sample(f"version {name}", TokenStyle(1, "sampled", False, i, False))
        for i, name in enumerate(names)
    ]
    legend = "legend: " + "  ".join(parts)
    if not color:
        legend += "  (no colour: generated tokens are between ⟦ and ⟧)"
    return legend


def _pieces_text(
    view: SegmentView, pieces: list[Piece], versions: list[str], color: bool, keep: int | None
) -> str:
    head, tail, hidden = _elide(pieces, keep)
    out: list[str] = []
    open_generated = False

    def emit(piece: Piece) -> None:
        nonlocal open_generated
        style = _style(view, piece, versions)
        if color:
            out.append(f"{_ansi(style)}{piece.text}{_RESET}")
            return
        if style.mask and not open_generated:
            out.append("⟦")
        if not style.mask and open_generated:
            out.append("⟧")
        open_generated = bool(style.mask)
        out.append(piece.text)

    for piece in head:
        emit(piece)
    if hidden:
        note = f" … {hidden} tokens … "
        out.append(f"\x1b[2m{note}{_RESET}" if color else note)
    for piece in tail:
        emit(piece)
    if open_generated:
        out.append("⟧")
    return "".join(out)


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_text(
    views: Sequence[SegmentView], color: bool = True, context_tokens: int | None = None
) -> str:
    """The segments for a terminal. ``context_tokens`` elides the middle of long contexts."""
    out: list[str] = []
    bold = (lambda s: f"\x1b[1m{s}{_RESET}") if color else (lambda s: s)
    for number, view in enumerate(views, 1):
        versions = view.version_names()
        out.append(bold(f"═══ segment {number}/{len(views)} ═══"))
        out += [f"  {k}: {_fmt(v)}" for k, v in view.header.items() if v is not None]
        out.append(_legend_text(view, color))
        for step in view.steps:
            meta = step.metadata
            out.append("")
            out.append(
                bold(
                    f"── step {step.index + 1}/{len(view.steps)} · {meta['step_id']} · "
                    f"{meta['prefix']} · {meta['context_tokens']} context + "
                    f"{meta['completion_tokens']} generated · finish={meta['finish_reason']} ──"
                )
            )
            details = {
                k: v
                for k, v in meta.items()
                if k not in ("step_id", "prefix", "context_tokens", "completion_tokens")
                and k != "finish_reason"
                and v is not None
            }
            out.append("   " + "  ".join(f"{k}={_fmt(v)}" for k, v in details.items()))
            out.append(
                _pieces_text(view, step.context, versions, color, context_tokens)
                + _pieces_text(view, step.completion, versions, color, None)
            )
        out.append("")
    return "\n".join(out)


def render_table(views: Sequence[SegmentView]) -> str:
    """One line per token: position, id, mask, source, logprob, version, text."""
    out = []
    for view in views:
        segment = view.segment
        out.append(f"# segment {segment.segment_id} (session {segment.session_id})")
        out.append("pos\tid\tmask\tsource\tlogprob\tversion\tstep\ttext")
        for step in view.steps:
            for piece in step.context + step.completion:
                for i in range(piece.start, piece.end):
                    text = piece.text if i == piece.end - 1 else ""
                    out.append(
                        f"{i}\t{segment.token_ids[i]}\t{segment.loss_mask[i]}\t"
                        f"{source_name(segment.logprob_source[i])}\t"
                        f"{segment.logprobs[i]:.4f}\t{view.versions[i] or ''}\t"
                        f"{step.index + 1}\t{json.dumps(text, ensure_ascii=False)}"
                    )
    return "\n".join(out) + "\n"


# --- HTML -----------------------------------------------------------------------------------------

_VERSION_COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #111827; background: #fff; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
h3 { font-size: 1rem; margin: 1.2rem 0 0.3rem; }
table.meta { border-collapse: collapse; font-size: 0.85rem; margin: 0.3rem 0; }
table.meta td { padding: 0.1rem 0.6rem 0.1rem 0; vertical-align: top; }
table.meta td:first-child { color: #6b7280; }
.legend { font-size: 0.85rem; margin: 0.5rem 0; }
.legend .tok { margin-right: 0.8rem; padding: 0 0.2rem; }
section.segment { border-top: 2px solid #d1d5db; }
section.step { border-left: 3px solid #e5e7eb; padding-left: 0.8rem; margin-bottom: 1rem; }
.tokens { font-family: ui-monospace, monospace; font-size: 0.85rem; white-space: pre-wrap;
  word-break: break-word; line-height: 1.6; }
.tok:hover { outline: 1px solid #111827; }
.ctx { color: #6b7280; }
.gen { font-weight: 600; }
.src-sampled { color: #047857; background: #ecfdf5; }
.src-constrained { color: #1d4ed8; background: #eff6ff; }
.src-recomputed { color: #b45309; background: #fffbeb; }
.src-other { color: #7c3aed; background: #f5f3ff; }
.anomaly { color: #b91c1c; background: #fef2f2; text-decoration: underline wavy #b91c1c; }
.special { font-style: italic; outline: 1px dotted #9ca3af; }
.cut { border-left: 2px solid #111827; margin: 0 1px; }
.elided { color: #9ca3af; font-style: italic; }
"""


def _classes(style: TokenStyle) -> str:
    known = {"none", *_SOURCE_MEANING}
    names = ["tok", "gen" if style.mask else "ctx"]
    names.append(f"src-{style.source}" if style.source in known else "src-other")
    if style.anomaly:
        names.append("anomaly")
    if style.special:
        names.append("special")
    if style.version is not None:
        names.append(f"ver-{style.version}")
    return " ".join(names)


def _span(view: SegmentView, piece: Piece, versions: list[str]) -> str:
    style = _style(view, piece, versions)
    title = html.escape("\n".join(_token_lines(view, piece)), quote=True)
    return f'<span class="{_classes(style)}" title="{title}">{html.escape(piece.text)}</span>'


def _meta_table(items: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in items.items()
        if v is not None
    )
    return f'<table class="meta">{rows}</table>'


def _legend_html(view: SegmentView) -> str:
    def sample(text: str, style: TokenStyle, tip: str) -> str:
        return (
            f'<span class="{_classes(style)}" title="{html.escape(tip, quote=True)}">'
            f"{html.escape(text)}</span>"
        )

    parts = [
        sample("context", TokenStyle(0, "none", False, None, False), "loss mask 0"),
        *(
            sample(
                f"generated · {name}",
                TokenStyle(1, name, False, None, False),
                f"loss mask 1, logprob source {name}: {_SOURCE_MEANING.get(name, 'see schema')}",
            )
            for name in _generated_sources()
        ),
        sample(
            "generated, no logprob",
            TokenStyle(1, "none", True, None, False),
            "loss mask 1 without a logprob source: should never happen",
        ),
        sample("special", TokenStyle(0, "none", False, None, True), "a special/added token"),
    ]
    parts += [
        sample(f"version {name}", TokenStyle(1, "sampled", False, i, False), "weight version")
        for i, name in enumerate(view.version_names())
    ]
    return (
        '<div class="legend">' + "".join(parts) + " — hover a token for id, logprob, source and "
        "version; a bar marks where a step's completion starts.</div>"
    )


def _pieces_html(
    view: SegmentView, pieces: list[Piece], versions: list[str], keep: int | None
) -> str:
    head, tail, hidden = _elide(pieces, keep)
    out = [_span(view, p, versions) for p in head]
    if hidden:
        out.append(f'<span class="elided"> … {hidden} tokens … </span>')
    out += [_span(view, p, versions) for p in tail]
    return "".join(out)


def render_html(
    views: Sequence[SegmentView],
    title: str = "titoflow segments",
    context_tokens: int | None = None,
) -> str:
    """A self-contained page: inline CSS, no scripts, no external assets."""
    most = max((len(view.version_names()) for view in views), default=0)
    version_css = "".join(
        f".ver-{i} {{ border-bottom: 3px solid {_VERSION_COLOURS[i % len(_VERSION_COLOURS)]}; }}\n"
        for i in range(most)
    )
    body: list[str] = [f"<h1>{html.escape(title)}</h1>"]
    for number, view in enumerate(views, 1):
        versions = view.version_names()
        segment = view.segment
        body.append(f'<section class="segment" id="segment-{number}">')
        body.append(f"<h2>Segment {number}/{len(views)} · {html.escape(segment.segment_id)}</h2>")
        body.append(_meta_table(view.header))
        body.append(_legend_html(view))
        for step in view.steps:
            meta = step.metadata
            body.append(f'<section class="step" id="segment-{number}-step-{step.index + 1}">')
            body.append(
                f"<h3>Step {step.index + 1}/{len(view.steps)} · "
                f"{html.escape(str(meta['step_id']))}</h3>"
            )
            body.append(_meta_table(meta))
            body.append(
                '<div class="tokens">'
                + _pieces_html(view, step.context, versions, context_tokens)
                + '<span class="cut" title="completion starts"></span>'
                + _pieces_html(view, step.completion, versions, None)
                + "</div>"
            )
            body.append("</section>")
        body.append("</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}{version_css}</style>\n</head>\n"
        "<body>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


# --- where segments come from ---------------------------------------------------------------------


def parse_segment(raw_bytes: bytes | str) -> Loaded:
    raw = json.loads(raw_bytes)
    if not isinstance(raw, dict):
        raise ValueError("a segment must be a JSON object")
    return Loaded(SegmentFinalized.model_validate(raw), raw)


def select(
    loaded: Iterable[Loaded], session: str | None = None, segment_id: str | None = None
) -> list[Loaded]:
    """Matching segments, the first of each segment id (replays repeat them)."""
    seen: set[str] = set()
    out = []
    for item in loaded:
        s = item.segment
        if session is not None and s.session_id != session:
            continue
        if segment_id is not None and s.segment_id != segment_id:
            continue
        if s.segment_id in seen:
            continue
        seen.add(s.segment_id)
        out.append(item)
    return out


def load_jsonl(
    path: Path, session: str | None = None, segment_id: str | None = None
) -> list[Loaded]:
    """Segments from a JSONL file (``-``: stdin); lines that are not segments are errors."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    loaded = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            loaded.append(parse_segment(line))
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{path}:{number}: not a segment_finalized event: {exc}") from exc
    return select(loaded, session, segment_id)


def _may_mention(value: bytes, session: str) -> bool:
    return session.encode() in value or json.dumps(session)[1:-1].encode() in value


async def from_segments_topic(
    settings: Settings,
    session: str,
    segment_id: str | None = None,
    topic: str | None = None,
    progress: Progress | None = None,
) -> list[Loaded]:
    """The session's segments on the segments topic, read with no consumer group up to the end
    offsets at start (every partition: segments are keyed by instance, not session)."""
    name = topic or settings.topic("segments")
    consumer = await start_reader(settings)
    found: list[Loaded] = []
    try:
        tps = await topic_partitions(consumer, name)
        starts, ends = await start_offsets(consumer, tps, ReplayOptions())
        if progress is not None:
            progress.start(sum(ends[tp] - starts[tp] for tp in tps), f"scan {name}")
        for tp in tps:
            async for record in read_range(consumer, tp, starts[tp], ends[tp], progress):
                if record.value is None or not _may_mention(record.value, session):
                    continue
                try:
                    found.append(parse_segment(record.value))
                except (ValueError, ValidationError):
                    continue
    finally:
        if progress is not None:
            progress.close()
        await consumer.stop()
    return select(found, session, segment_id)


@dataclass
class FromSteps:
    loaded: list[Loaded]
    step_events: dict[str, StepRecorded]
    still_open: set[str]  # segment ids of sessions that were still open
    report: ReplayReport


async def from_steps_topic(
    settings: Settings,
    session: str,
    segment_id: str | None = None,
    progress: Progress | None = None,
) -> FromSteps:
    """Replay the steps topic for one session (open sessions closed for viewing)."""
    step_events: dict[str, StepRecorded] = {}

    def observe(event: StepsEvent, partition: int, offset: int) -> None:
        if isinstance(event, StepRecorded):
            step_events[event.step_id] = event

    options = ReplayOptions(session=session, finalize_open=True)
    segments, report = await replay_segments(settings, options, progress=progress, observe=observe)
    loaded = select(
        [Loaded(s, json.loads(s.model_dump_json())) for s in segments], session, segment_id
    )
    still_open = {
        item.segment.segment_id
        for item in loaded
        if item.segment.session_id in report.open_sessions
    }
    return FromSteps(loaded, step_events, still_open, report)
