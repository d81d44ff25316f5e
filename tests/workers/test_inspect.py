"""``titoflow inspect`` rendering: decoded tokens in terminal text and a self-contained HTML page,
coloured and classed by loss mask, logprob source and weight version, with step boundaries."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from cli.dev.model_build import tokenizer_source_dir
from cli.main import main
from schemas.events import SegmentFinalized, StepRecorded, VersionSpan
from tests.support.factories import recorded_step as step
from tests.support.families import qwen3
from workers.assembler import Assembler
from workers.inspect.ansi import render_text
from workers.inspect.decode import TokenDecoder
from workers.inspect.html import render_html
from workers.inspect.load import load_jsonl
from workers.inspect.table import render_table
from workers.inspect.view import Loaded, SegmentView, build_view, source_names

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SAMPLED_FG, CONTEXT_FG, ANOMALY_FG, UNKNOWN_FG = "38;5;114", "38;5;245", "38;5;203", "38;5;177"
# A logprob source code the schema defines besides none and sampled (constrained, recomputed...).
OTHER_SOURCE = next((c for c, n in source_names().items() if n not in ("none", "sampled")), None)
UNKNOWN_SOURCE = 9
EXTERNAL = ("<script", "<link", "src=", "href=", "url(", "@import", "http://", "https://")


def template_ids(text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    encoded = qwen3().apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(encoded["input_ids"])


def completion_ids(text: str) -> list[int]:
    return [*qwen3().encode(text), 151645]  # + <|im_end|>


def two_turn_session() -> tuple[SegmentFinalized, dict[str, StepRecorded]]:
    """A real chat-template conversation: the emoji 🫠 is three byte-level tokens."""
    prompt1 = template_ids("Which file is largest? 你好")
    completion1 = completion_ids("The biggest is a🫠.txt")
    prompt2 = [198, *template_ids("Delete it.")]
    completion2 = completion_ids("<think>\nok\n</think>\n\nrm a.txt")
    first = step("one", prompt1, completion1, instance_id="prompt-9")
    second = step(
        "two",
        prompt2,
        completion2,
        parent="one",
        prefix_len=len(prompt1) + len(completion1),
        weight_versions=[
            VersionSpan(version="w7", start=0, end=3),
            VersionSpan(version="w8", start=3, end=len(completion2)),
        ],
    )
    assembler = Assembler()
    for offset, event in enumerate((first, second)):
        assert assembler.add_step(event, 0, offset).dead_letter_reason is None
    [segment] = assembler.finalize("s", "finalized", {"reward": 0.5})
    return segment, {"one": first, "two": second}


def view_of(
    segment: SegmentFinalized,
    events: dict[str, StepRecorded] | None = None,
    **raw_fields: Any,
) -> SegmentView:
    """The view ``inspect`` builds; ``raw_fields`` replace fields of the segment's JSON (None
    drops one), to show fields independently of what this schema version carries."""
    raw = json.loads(segment.model_dump_json())
    for name, value in raw_fields.items():
        raw.pop(name, None)
        if value is not None:
            raw[name] = value
    return build_view(Loaded(segment, raw), TokenDecoder(qwen3()), events)


def sgr(text: str, piece: str, after: str = "") -> list[str]:
    """The ANSI parameters the piece is shown with (its first one after ``after``)."""
    pattern = re.compile(r"\x1b\[([0-9;]*)m" + re.escape(piece) + r"\x1b\[0m")
    found = pattern.search(text, text.index(after) if after else 0)
    assert found, f"{piece!r} not coloured"
    return found.group(1).split(";")


def full_text(segment: SegmentFinalized) -> str:
    return str(
        qwen3().decode(
            segment.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    )


def with_sources(segment: SegmentFinalized, sources: dict[int, int]) -> SegmentFinalized:
    """The segment with some tokens' logprob source changed (2 = recomputed)."""
    changed = list(segment.logprob_source)
    for index, code in sources.items():
        changed[index] = code
    return segment.model_copy(update={"logprob_source": changed})


class Spans(HTMLParser):
    """Every token span of the page: (classes, title, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[set[str], str, str]] = []
        self._open: list[tuple[set[str], str]] | None = None
        self.in_tokens = 0
        self.tags: list[str] = []
        self.sections: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.append(tag)
        classes = set((found.get("class") or "").split())
        if tag == "section":
            self.sections.append(found.get("class") or "")
        if tag == "div" and "tokens" in classes:
            self.in_tokens += 1
        if tag == "span" and "tok" in classes and self.in_tokens:
            self.spans.append((classes, found.get("title") or "", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self.in_tokens:
            self.in_tokens -= 1

    def handle_data(self, data: str) -> None:
        if self.in_tokens and self.spans and self.tags and self.tags[-1] == "span":
            classes, title, text = self.spans[-1]
            self.spans[-1] = (classes, title, text + data)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)


def parse_html(page: str) -> Spans:
    parser = Spans()
    parser.feed(page)
    return parser


def test_pieces_decode_to_exactly_the_segment_text() -> None:
    segment, _ = two_turn_session()
    view = view_of(segment)
    pieces = [p for s in view.steps for p in s.context + s.completion]
    assert "".join(p.text for p in pieces) == full_text(segment)
    # Contiguous, and the emoji's byte tokens are one piece, not three replacement characters.
    assert [p.start for p in pieces[1:]] == [p.end for p in pieces[:-1]]
    emoji = next(p for p in pieces if "🫠" in p.text)
    assert emoji.end - emoji.start == 3 and "\ufffd" not in "".join(p.text for p in pieces)
    assert any(p.special and p.text == "<|im_start|>" for p in pieces)


def test_terminal_text_colours_tokens_by_mask_and_source() -> None:
    segment, _ = two_turn_session()
    think_at = segment.steps[1].completion_start  # <think>
    changed = {think_at + 1: 0, think_at + 2: UNKNOWN_SOURCE}  # "\n" no source, "ok" unknown
    if OTHER_SOURCE is not None:
        changed[think_at] = OTHER_SOURCE
    segment = with_sources(segment, changed)
    text = render_text([view_of(segment, weight_versions=None)], color=True)

    assert sgr(text, " biggest") == [*SAMPLED_FG.split(";"), "1"]  # generated, sampled: bold
    assert sgr(text, "Which") == CONTEXT_FG.split(";")  # context
    assert sgr(text, "<|im_start|>") == [*CONTEXT_FG.split(";"), "3"]  # special: italic
    anomaly = sgr(text, "\n", after="<think>")  # generated without a logprob source
    assert anomaly[:3] == ANOMALY_FG.split(";") and "4" in anomaly  # red, underlined
    assert sgr(text, "ok")[:3] == UNKNOWN_FG.split(";")
    if OTHER_SOURCE is not None:
        assert sgr(text, "<think>")[:3] not in (SAMPLED_FG.split(";"), CONTEXT_FG.split(";"))
        assert f"generated·{source_names()[OTHER_SOURCE]}" in ANSI.sub("", text)
    assert "── step 1/2 · one · rendered" in text and "── step 2/2 · two · tito" in text
    assert '"reward": 0.5' in text and "prompt-9" in text
    plain = ANSI.sub("", text)
    assert "The biggest is a🫠.txt<|im_end|>" in plain
    assert "rm a.txt" in plain


def test_terminal_text_without_colour_brackets_generated_tokens() -> None:
    segment, _ = two_turn_session()
    text = render_text([view_of(segment)], color=False)
    assert "\x1b[" not in text
    assert "assistant\n⟦The biggest is a🫠.txt<|im_end|>⟧" in text
    assert "⟦<think>\nok\n</think>\n\nrm a.txt<|im_end|>⟧" in text
    # Eliding long contexts keeps their ends and says how many tokens were hidden.
    short = render_text([view_of(segment)], color=False, context_tokens=2)
    assert re.search(r"<\|im_start\|>user … \d+ tokens … assistant\n⟦The", short)
    assert "Which" not in short and "⟦<think>" in short


def test_weight_versions_from_the_segment_or_its_step_events() -> None:
    segment, events = two_turn_session()
    start = segment.steps[1].completion_start
    end = len(segment.token_ids)
    # Spans over segment positions on the segment itself, as workers write them...
    on_segment = [
        {"version": "w7", "start": start, "end": start + 3},
        {"version": "w8", "start": start + 3, "end": end},
    ]
    # ...or, for segments without them, the steps' spans over their completions.
    for view in (
        view_of(segment, weight_versions=on_segment),
        view_of(segment, events, weight_versions=None),
    ):
        assert view.versions[:start] == [None] * start
        assert view.versions[start : start + 3] == ["w7"] * 3
        assert view.versions[-1] == "w8" and view.version_names() == ["w7", "w8"]
        text = render_text([view], color=True)
        assert sgr(text, "<think>")[-3:] == ["48", "5", "17"]  # one background per version
        assert sgr(text, " a", after="<think>")[-3:] == ["48", "5", "52"]
        assert "version w7" in ANSI.sub("", text)
    assert "engine_request_id=r" in text  # step_recorded metadata, known from the steps replay
    assert view_of(segment, weight_versions=None).version_names() == []


def test_html_is_self_contained_and_classes_every_token() -> None:
    segment, events = two_turn_session()
    think_at = segment.steps[1].completion_start
    changed = {think_at + 1: 0}
    if OTHER_SOURCE is not None:
        changed[think_at] = OTHER_SOURCE
    segment = with_sources(segment, changed)
    page = render_html([view_of(segment, events, weight_versions=None)], title="session s")
    lowered = page.lower()
    assert not [marker for marker in EXTERNAL if marker in lowered]
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page

    parsed = parse_html(page)
    assert parsed.sections.count("step") == 2 and parsed.sections.count("segment") == 1
    spans = parsed.spans
    assert "".join(text for _, _, text in spans) == full_text(segment)
    generated = [(c, t, x) for c, t, x in spans if "gen" in c]
    context = [(c, t, x) for c, t, x in spans if "ctx" in c]
    assert sum(t.count("#") for _, t, _ in generated) == sum(segment.loss_mask)
    assert all({"ctx", "src-none"} <= c for c, _, _ in context)
    assert "".join(x for _, _, x in generated).startswith("The biggest is a🫠.txt")
    sampled = next(s for s in generated if s[2] == " biggest")
    assert {"tok", "gen", "src-sampled"} <= sampled[0]
    index = segment.token_ids.index(
        qwen3().encode(" biggest")[0], segment.steps[0].completion_start
    )
    assert (
        f"#{index} id={segment.token_ids[index]} mask=1 logprob=-1.0000 source=sampled"
        in (sampled[1])
    )
    think = next(s for s in generated if s[2] == "<think>")
    assert {"special", "ver-0"} <= think[0] and "version=w7" in think[1]
    if OTHER_SOURCE is not None:
        name = source_names()[OTHER_SOURCE]
        assert f"src-{name}" in think[0] and f"source={name}" in think[1]
        assert f".src-{name} {{" in page and f"generated · {name}" in page
    anomaly = next(s for s in generated if s[2] == "\n")
    assert "anomaly" in anomaly[0] and "source=none" in anomaly[1]
    assert any("ver-1" in c for c, _, _ in generated) and ".ver-1 {" in page
    emoji = next(s for s in generated if "🫠" in s[2])
    assert emoji[1].count("#") == 3  # its three byte tokens, each with id and logprob
    assert "logprob=—" in context[0][1]  # a context token's 0.0 is a placeholder, not a value
    assert 'class="legend"' in page and "generated · sampled" in page
    assert page.count('class="cut"') == 2  # where each step's completion starts


def test_table_lists_every_token() -> None:
    segment, _ = two_turn_session()
    lines = render_table([view_of(segment)]).splitlines()
    rows = [line.split("\t") for line in lines[2:]]
    assert len(rows) == len(segment.token_ids)
    assert [int(r[1]) for r in rows] == segment.token_ids
    assert [int(r[2]) for r in rows] == segment.loss_mask
    assert {r[3] for r in rows} == {"none", "sampled"}


def write_jsonl(path: Path, segments: list[SegmentFinalized]) -> Path:
    path.write_bytes(b"".join(s.model_dump_json().encode() + b"\n" for s in segments))
    return path


def test_jsonl_selection_and_cli_text_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    segment, _ = two_turn_session()
    other = segment.model_copy(update={"session_id": "other", "segment_id": "x" * 32})
    path = write_jsonl(tmp_path / "segments.jsonl", [segment, other, segment])  # a repeat
    assert [s.segment.segment_id for s in load_jsonl(path)] == [segment.segment_id, "x" * 32]
    assert [s.segment.session_id for s in load_jsonl(path, session="s")] == ["s"]

    tokenizer = str(tokenizer_source_dir())
    common: list[Any] = ["inspect", "--segments", str(path), "--model-path", tokenizer]
    assert main([*common, "--session", "s", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert out.count("═══ segment") == 1 and f"\x1b[{SAMPLED_FG};1m" in out
    assert "rm a.txt" in ANSI.sub("", out)

    page = tmp_path / "view.html"
    assert main([*common, "--session", "s", "--html", str(page)]) == 0
    spans = parse_html(page.read_text(encoding="utf-8")).spans
    assert "".join(text for _, _, text in spans) == full_text(segment)

    assert main([*common, "--session", "nobody"]) == 1
    assert main([*common, "--no-decode", "--color", "never", "--segment", "x" * 32]) == 0
    assert f"⟨{segment.token_ids[0]}⟩" in capsys.readouterr().out


def test_context_carried_over_from_a_size_split_is_shown_as_context() -> None:
    _, events = two_turn_session()
    assembler = Assembler(max_segment_tokens=24)  # the first turn (25 tokens) reaches it
    emitted = [
        s for i, e in enumerate(events.values()) for s in assembler.add_step(e, 0, i).segments
    ]
    [first] = emitted
    [last] = assembler.finalize("s", "finalized")
    assert first.finalize_reason == "size" and last.split_reason == "size"
    assert len(last.steps) == 2 and last.token_ids[: len(first.token_ids)] == first.token_ids
    view = view_of(last, weight_versions=None)
    assert "tokens_outside_steps" not in view.header
    spans = parse_html(render_html([view])).spans
    assert "".join(text for _, _, text in spans) == full_text(last)
    carried = [c for c, _, x in spans if "biggest" in x]  # turn one's completion, now context
    assert carried and all({"ctx", "src-none"} <= c for c in carried)
    assert "mean_logprob" not in view.steps[0].metadata  # no real logprobs left in step one
    assert any("gen" in c for c, _, x in spans if x == "rm")
