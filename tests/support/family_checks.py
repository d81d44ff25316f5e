"""What the family tests (``tests/titoflow/tito/test_family_*.py``) do to every family the same
way: a family under test (its tokenizer directory, its template's rendering with the module's
tools, its parser, its forced-call grammar), the tools they call, and the checks they repeat (the
vendored template, the stand-in's markers, what the parser read or refused). The data every
check runs on (templates, markers, outputs, verdicts) stay in the module that calls it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from tests.support.families import family_token_id, family_tokenizer, function_tool
from tests.support.xgrammar_check import admitted, structural_tag
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.tokenizer import TextEncoder

USER = Message(role="user", content="go")
# The ``run`` tool's arguments in most family tests: a required string and an integer.
COMMAND_AND_TIMEOUT: dict[str, Any] = {
    "command": {"type": "string"},
    "timeout": {"type": "integer"},
}
LIST_DIR: dict[str, Any] = {
    "type": "function",
    "function": {"name": "list_dir", "description": "List"},
}
# ``list_dir`` with an empty ``parameters`` object, as some family tests declare it.
LIST_DIR_WITH_PARAMETERS: dict[str, Any] = {
    "type": "function",
    "function": {"name": "list_dir", "description": "List", "parameters": {"properties": {}}},
}


def run_tool(properties: dict[str, Any] = COMMAND_AND_TIMEOUT) -> dict[str, Any]:
    """The ``run`` tool with ``properties`` as its arguments, ``command`` required."""
    return function_tool("run", properties, "Run a command", ["command"])


def tool_call(arguments: dict[str, Any], name: str = "run", index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))


@dataclass(frozen=True)
class FamilyUnderTest:
    """A family, its tokenizer directory (``cli/dev/tokenizers``) and the tools its tests render
    and parse with; ``reasoning_open`` is what its parser assumes unless a test says."""

    name: str
    family: Family
    tools: Sequence[dict[str, Any]]
    reasoning_open: bool = False

    def tokenizer(self) -> Any:
        return family_tokenizer(self.name)

    def token_id(self, text: str) -> int | None:
        return family_token_id(self.name)(text)

    def render(self, messages: list[Message], **kwargs: Any) -> str:
        dicts = [m.template_dict() for m in messages]
        tools = list(self.tools)
        return str(
            self.tokenizer().apply_chat_template(dicts, tools=tools, tokenize=False, **kwargs)
        )

    def written_after_user(self, turn: Message, end: str) -> str:
        """What the template writes for ``turn`` after its prompt for ``[USER]``, up to ``end``
        (for a template whose user turn ends with the assistant's opening, as DeepSeek's)."""
        prompt = self.render([USER])
        full = self.render([USER, turn])
        assert full.startswith(prompt)
        return full[len(prompt) :].removesuffix(end)

    def parse(
        self, text: str, reasoning_open: bool | None = None, family: Family | None = None
    ) -> ParsedOutput:
        """``text`` through the parser of ``family`` (this one unless given), whole."""
        opened = self.reasoning_open if reasoning_open is None else reasoning_open
        options = ParserOptions("step", tools=list(self.tools), reasoning_open=opened)
        parser = (family or self.family).parser(options)
        parser.feed(text)
        return parser.finish()[1]

    def constraint(self, choice: grammar.ToolChoice, **options: Any) -> str:
        """The structural tag titoflow sends for ``choice`` with this module's tools."""
        return structural_tag(self.family, self.tools, choice, self.token_id, **options)

    def vendored_template(self, file: str, sha256: str) -> str:
        """The text of the template ``file``, once checked: its bytes are the vendored file's
        (``sha256``), the tokenizer directory serves it, and it is detected as the family."""
        path = template_path(file)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, file
        text = path.read_text()
        assert self.tokenizer().chat_template == text
        assert detect_family(text) is self.family
        return text

    def stand_in(self) -> str | None:
        """What the directory's stamp says the stand-in vocabulary is (none for a real one)."""
        found: str | None = json.loads((tokenizer_dir(self.name) / STAMP).read_text())["stand_in"]
        return found

    def assert_single_tokens(self, markers: Sequence[str], special: bool = False) -> None:
        """Each marker is one token of the vocabulary (and, if ``special``, a special one)."""
        for marker in markers:
            assert self.token_id(marker) is not None, marker
            if special:
                assert marker in self.tokenizer().all_special_tokens, marker

    def assert_kept_by_a_skipping_decode(self, text: str, end: str) -> None:
        """``text`` then the end token ``end`` decode, special tokens skipped, to ``text``: the
        markers in it are what the parser reads, so such a decode must not drop them."""
        assert self.tokenizer().eos_token == end
        ids = TextEncoder(self.tokenizer())(text)
        kept = self.tokenizer().decode([*ids, self.token_id(end)], skip_special_tokens=True)
        assert kept == text, kept

    def assert_xgrammar_admits_the_template(
        self, end: str, one: str, two: str, undeclared_tool: str, text_for_integer: str
    ) -> None:
        """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the named tag
        names both call markers by id; the template's rendering of one call (``one``, named) and
        of two (``two``, parallel) is admitted, then ``end`` ends the turn; a call to an
        undeclared tool and one with text for an integer argument are not."""
        assert self.constraint("named").count('"type":"token"') == 2
        cases = {
            "named": (self.constraint("named"), one),
            "parallel": (self.constraint("required", parallel=True), two),
            "undeclared_tool": (self.constraint("required"), undeclared_tool),
            "text_for_integer": (self.constraint("named"), text_for_integer),
        }
        assert admitted(self.name, end, cases) == {
            "named": True,
            "parallel": True,
            "undeclared_tool": False,
            "text_for_integer": False,
        }


def read_calls(parsed: ParsedOutput) -> list[tuple[str, Any]]:
    """The (name, arguments as JSON values) of each call the parser read."""
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


def assert_only_calls(parsed: ParsedOutput, calls: list[tuple[str, Any]]) -> None:
    """The output was ``calls`` and nothing else, read without error."""
    assert parsed.parse_error is None and parsed.content == "", parsed
    assert read_calls(parsed) == calls, read_calls(parsed)


def assert_left_as_text(parsed: ParsedOutput, text: str, why: str) -> None:
    """The output ``text`` was read as no call, kept whole as content, and the parse error
    says ``why``."""
    assert parsed.tool_calls == [] and parsed.content == text, parsed
    assert parsed.parse_error is not None and why in parsed.parse_error, parsed.parse_error
