"""The segments as ANSI text for a terminal (``titoflow inspect`` without ``--html``/``--table``).

Invariant: what the colours say is there without them too: with ``color=False`` every
generated run stands between ``⟦`` and ``⟧`` (the legend says so), and elided context always
says how many tokens it hides.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.inspect.decode import Piece
from workers.inspect.style import TokenStyle, elide, fmt, generated_sources, style_of
from workers.inspect.view import SegmentView

_RESET = "\x1b[0m"
_SOURCE_FG = {
    "none": "38;5;245",
    "sampled": "38;5;114",
    "constrained": "38;5;75",
    "recomputed": "38;5;214",
}


_OTHER_FG = "38;5;177"
_ANOMALY = "38;5;203;4"
_VERSION_BG = ["48;5;17", "48;5;52", "48;5;22", "48;5;53", "48;5;58", "48;5;23", "48;5;237"]


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
            for name in generated_sources()
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
    head, tail, hidden = elide(pieces, keep)
    out: list[str] = []
    open_generated = False

    def emit(piece: Piece) -> None:
        nonlocal open_generated
        style = style_of(view, piece, versions)
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


def render_text(
    views: Sequence[SegmentView], color: bool = True, context_tokens: int | None = None
) -> str:
    """The segments for a terminal. ``context_tokens`` elides the middle of long contexts."""
    out: list[str] = []
    bold = (lambda s: f"\x1b[1m{s}{_RESET}") if color else (lambda s: s)
    for number, view in enumerate(views, 1):
        versions = view.version_names()
        out.append(bold(f"═══ segment {number}/{len(views)} ═══"))
        out += [f"  {k}: {fmt(v)}" for k, v in view.header.items() if v is not None]
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
            out.append("   " + "  ".join(f"{k}={fmt(v)}" for k, v in details.items()))
            out.append(
                _pieces_text(view, step.context, versions, color, context_tokens)
                + _pieces_text(view, step.completion, versions, color, None)
            )
        out.append("")
    return "\n".join(out)
