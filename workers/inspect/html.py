"""The segments as one self-contained HTML page (``titoflow inspect --html``).

Invariants:
- The page is inert and whole: inline CSS, no scripts, no fonts, no external references, so it
  can be mailed or attached to an issue.
- Every text from the segment or the tokenizer is escaped; every token is a ``<span>`` whose
  classes say what it is and whose tooltip gives position, id, loss mask, logprob, source and
  weight version of each of its tokens.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import schemas.events as events
from workers.inspect.decode import Piece
from workers.inspect.style import (
    SOURCE_MEANING,
    TokenStyle,
    elide,
    fmt,
    generated_sources,
    style_of,
)
from workers.inspect.view import SegmentView, source_name

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
    known = {"none", *SOURCE_MEANING}
    names = ["tok", "gen" if style.mask else "ctx"]
    names.append(f"src-{style.source}" if style.source in known else "src-other")
    if style.anomaly:
        names.append("anomaly")
    if style.special:
        names.append("special")
    if style.version is not None:
        names.append(f"ver-{style.version}")
    return " ".join(names)


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


def _span(view: SegmentView, piece: Piece, versions: list[str]) -> str:
    style = style_of(view, piece, versions)
    title = html.escape("\n".join(_token_lines(view, piece)), quote=True)
    return f'<span class="{_classes(style)}" title="{title}">{html.escape(piece.text)}</span>'


def _meta_table(items: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(fmt(v))}</td></tr>"
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
                f"loss mask 1, logprob source {name}: {SOURCE_MEANING.get(name, 'see schema')}",
            )
            for name in generated_sources()
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
    head, tail, hidden = elide(pieces, keep)
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
