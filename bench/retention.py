"""Bytes a topic holds per token: what a retention window of N days costs in disk
(docs/operations.md, "Retention").

    .venv/bin/python -m bench.retention [--tokens 250 1000 4000] [--steps-per-session 8]

Steps: sessions of TITO-chained ``StepRecorded`` events as ``bench/pipeline.py`` makes them (80 %
prompt tail, 20 % completion, packed as the ingress packs them), serialized as published.
Segments: the same sessions through the workers' own assembler, serialized as published. For
each, a least-squares line over the step sizes gives bytes per new token and fixed bytes per
event (ids, the step rows, metadata). Those events carry a short fixed message; real steps carry
the conversation text their tokens came from (``new_messages``, ``response_message``), so the
text's cost is measured apart on the captured scaffold requests of ``bench/captures``: JSON bytes
of their messages per token of the policy's tokenizer (``.models/tiny-qwen3-agent``, Qwen3's).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.harness import ROOT, command_line, write_results
from bench.pipeline import session_events
from schemas.events import SessionFinalized
from titoflow.tito.tokenizer import load_tokenizer
from workers.assembler import Assembler

CAPTURES = ROOT / "bench" / "captures"
MODEL = ROOT / ".models" / "tiny-qwen3-agent"


def event_sizes(tokens: int, steps: int, sessions: int) -> tuple[list[int], list[int]]:
    """Bytes of each step event and of each session's segment (one per session)."""
    step_bytes: list[int] = []
    segment_bytes: list[int] = []
    for index in range(sessions):
        session_id = f"retention-{tokens}-{index:03d}"
        events = session_events(session_id, steps, tokens, seed=index)
        assembler = Assembler()
        for offset, event in enumerate(events):
            value = event.model_dump_json().encode()
            step_bytes.append(len(value))
            assembler.apply(value, 0, offset)
        final = SessionFinalized(session_id=session_id, event_time=1_790_000_100.0)
        applied = assembler.apply(final.model_dump_json().encode(), 0, len(events))
        [segment] = applied.segments
        segment_bytes.append(len(segment.model_dump_json().encode()))
    return step_bytes, segment_bytes


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``bytes = fixed + per_token * tokens``: (per_token, fixed)."""
    slope, intercept = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return slope, intercept


def text_bytes_per_token(tokenizer: Any) -> list[dict[str, Any]]:
    """JSON bytes of each captured request's messages and of its tools, and the tokens of the
    messages' text."""
    rows = []
    for path in sorted(CAPTURES.glob("*/*.json")):
        body = json.loads(path.read_text())["body"]
        messages = body.get("messages") or body.get("input") or []
        if not isinstance(messages, list) or not messages:
            continue
        texts = [_text(m) for m in messages]
        tokens = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts if t)
        if tokens < 200:  # too little text to say anything per token
            continue
        size = len(json.dumps(messages, ensure_ascii=False).encode())
        name = f"{path.parent.name}/{path.name}"
        # A chain's rendered step also carries the tools (TITO steps share them).
        tools = len(json.dumps(body.get("tools") or [], ensure_ascii=False).encode())
        rows.append(
            {"capture": name, "text_tokens": tokens, "message_bytes": size, "tools_bytes": tools}
        )
    return rows


def _text(message: Any) -> str:
    """The text of a message in any of the three APIs' shapes."""
    if isinstance(message, str):
        return message
    if isinstance(message, list):
        return "".join(_text(part) for part in message)
    if not isinstance(message, dict):
        return ""
    # Chat and Anthropic content, Responses parts and items, tool calls' arguments.
    return "".join(_text(message.get(key)) for key in ("content", "text", "output", "arguments"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[250, 1000, 4000])
    parser.add_argument("--steps-per-session", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--name", default="retention")
    args = parser.parse_args()
    steps = args.steps_per_session
    step_points: list[tuple[float, float]] = []
    segment_points: list[tuple[float, float]] = []
    rows = []
    for tokens in args.tokens:
        step_bytes, segment_bytes = event_sizes(tokens, steps, args.sessions)
        step_points += [(tokens, b) for b in step_bytes]
        segment_points += [(tokens * steps, b) for b in segment_bytes]
        rows.append(
            {
                "tokens_per_step": tokens,
                "step_bytes": round(statistics.mean(step_bytes)),
                "segment_tokens": tokens * steps,
                "segment_bytes": round(statistics.mean(segment_bytes)),
            }
        )
    step_per_token, step_fixed = fit(step_points)
    segment_per_token, segment_fixed = fit(segment_points)
    texts = text_bytes_per_token(load_tokenizer(MODEL))
    text_per_token = sum(r["message_bytes"] for r in texts) / sum(r["text_tokens"] for r in texts)
    lines = [f"{'tokens/step':>11} {'step B':>9} {'segment tokens':>14} {'segment B':>10}"]
    lines += [
        f"{r['tokens_per_step']:>11} {r['step_bytes']:>9} {r['segment_tokens']:>14} "
        f"{r['segment_bytes']:>10}"
        for r in rows
    ]
    lines += [
        f"steps:    {step_per_token:.2f} B per new token + {step_fixed:.0f} B per step "
        "(arrays; the bench's short message)",
        f"segments: {segment_per_token:.2f} B per token + {segment_fixed:.0f} B per segment "
        f"({steps} steps)",
        f"message text (captures): {text_per_token:.2f} B per token of text",
    ]
    lines += [
        f"  {r['capture']}: {r['message_bytes']} B / {r['text_tokens']} tokens; "
        f"tools {r['tools_bytes']} B"
        for r in texts
    ]
    write_results(
        args.name,
        command_line(),
        {
            "rows": rows,
            "step_bytes_per_token": round(step_per_token, 3),
            "step_fixed_bytes": round(step_fixed),
            "segment_bytes_per_token": round(segment_per_token, 3),
            "segment_fixed_bytes": round(segment_fixed),
            "text_bytes_per_token": round(text_per_token, 3),
            "captures": texts,
        },
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
