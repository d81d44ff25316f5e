"""How often the tiny agentic policy completes a tool loop, per real scaffold, greedy and at
temperature 1.0, on the real vLLM CPU engine.

    .venv/bin/python -m bench.agent_policy [-n 20] [--url ENGINE_URL] [--only NAME]

Each scenario is a real scaffold's captured requests (``bench/captures/<client>/``: Claude Code
2.1.197 ``--bare`` and default mode, OpenCode 1.18.33 and its title call, Codex 0.169.0, each run
once against a logging endpoint). A loop puts a random shell command in the captured task
("Use the <Tool> tool to run: <command>"), parses the request with the ingress's own adapter,
renders it with the ingress's renderer, samples it token-in/token-out (no logits processor, no
guided decoding), and requires exactly one tool call with that name and arguments, parsed by the
ingress's parser, ending the turn; then it sends the scaffold's captured next request (the
tool result appended) and requires a text answer ending the turn, with no tool call. A scenario
without a tool (the title call, a question) requires text. Success counts are printed per
scenario and mode: they are the policy's own, not a speed, so there is no baseline ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.harness import command_line, write_results
from cli.dev.engine_process import start_vllm
from ingress.turns.turn import ChatTurn, SessionRef
from ingress.wire import anthropic_messages, openai_chat, openai_responses
from titoflow.settings import Settings
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

CAPTURES = Path(__file__).resolve().parent / "captures"
CAPTURED_COMMAND = "echo hello"  # what the captures' tasks and tool calls say
IM_END = 151645
Parse = Callable[[Any, SessionRef], tuple[ChatTurn, Any]]
PARSERS: dict[str, Parse] = {
    "messages": anthropic_messages.parse_request,
    "responses": openai_responses.parse_request,
    "completions": openai_chat.parse_request,
}
VERBS = ("echo", "ls", "cat", "pwd", "date", "wc", "head", "tail", "mkdir", "touch", "grep")
WORDS: tuple[str, ...] = ("hello", "world", "notes.txt", "-la", "/tmp", "-n", "3", "README.md")
WORDS += ("data", "foo", "src/main.py", "-l", "alpha", "beta", "42", "out.log", "/etc/hosts")


@dataclass(frozen=True)
class Scenario:
    name: str
    first: str  # capture of the first request, under captures/
    second: str | None  # capture of the request after the tool round trip
    tool: str | None  # the tool the task names; None: a text answer is expected
    key: str = "command"
    task: str | None = None  # replaces the captured task (a prompt that is not a task)


SCENARIOS = [
    Scenario(
        "claude-code --bare",
        "claude-bare/001-sess-x-v-messages.json",
        "claude-bare/002-sess-x-v-messages.json",
        "Bash",
    ),
    Scenario(
        "claude-code default (~19k tokens)",
        "claude-default/001-sess-x-v-messages.json",
        "claude-default/002-sess-x-v-messages.json",
        "Bash",
    ),
    Scenario(
        "claude-code default, a question",
        "claude-default/001-sess-x-v-messages.json",
        None,
        None,
        task="List the files in the current directory, then say what the largest one is.",
    ),
    Scenario(
        "opencode",
        "opencode/002-sess-x-v-chat-completions.json",
        "opencode/003-sess-x-v-chat-completions.json",
        "bash",
    ),
    Scenario("opencode title call", "opencode/001-sess-x-v-chat-completions.json", None, None),
    Scenario(
        "codex",
        "codex/001-sess-x-v-responses.json",
        "codex/002-sess-x-v-responses.json",
        "exec_command",
        "cmd",
    ),
]


def random_command(rng: random.Random) -> str:
    return " ".join([rng.choice(VERBS), *rng.sample(WORDS, rng.randint(0, 3))])


class Evaluator:
    def __init__(self, model: Path, url: str) -> None:
        self.tokenizer = load_tokenizer(model)
        self.renderer = ChatRenderer(self.tokenizer)
        self.url = url
        self.http = httpx.Client(timeout=900)

    def render(self, capture: str, command: str, task: str | None) -> tuple[list[int], ChatTurn]:
        raw = (CAPTURES / capture).read_text(encoding="utf-8")
        if task is not None:
            raw = raw.replace(f"Use the Bash tool to run: {CAPTURED_COMMAND}", task)
        raw = raw.replace(CAPTURED_COMMAND, json.dumps(command)[1:-1])
        captured = json.loads(raw)
        api = capture.rsplit("-", 1)[-1].removesuffix(".json")
        turn, _ = PARSERS[api](captured["body"], SessionRef(session_id="bench"))
        text = self.renderer.render_text(turn.messages, turn.tools, turn.template_kwargs, True)
        return self.renderer.encode(text), turn

    def sample(self, prompt: list[int], temperature: float, seed: int) -> list[int]:
        params = {"max_tokens": 80, "temperature": temperature, "top_p": 1.0, "seed": seed}
        body = {"model": "titoflow-policy", "token_ids": prompt, "sampling_params": params}
        answer = self.http.post(f"{self.url}/inference/v1/generate", json=body)
        answer.raise_for_status()
        return [int(t) for t in answer.json()["choices"][0]["token_ids"]]

    def parse(self, out: list[int], turn: ChatTurn) -> tuple[Any, str]:
        text = self.tokenizer.decode(out[:-1] if out[-1:] == [IM_END] else out)
        parser = self.renderer.family.parser(
            ParserOptions("step", tools=turn.tools, parse_tools=bool(turn.tools))
        )
        parser.feed(text)
        return parser.finish()[1], text

    def loop(self, scenario: Scenario, temperature: float, index: int) -> tuple[bool, str]:
        """One loop; whether it completed, and what went wrong if not."""
        rng = random.Random(f"{scenario.name}/{index}")
        command = random_command(rng) if index else CAPTURED_COMMAND
        prompt, turn = self.render(scenario.first, command, scenario.task)
        out = self.sample(prompt, temperature, 1000 + index)
        parsed, text = self.parse(out, turn)
        ended = out[-1:] == [IM_END]
        if scenario.tool is None:
            ok = ended and not parsed.tool_calls and bool(parsed.content.strip())
            return ok, f"[{len(prompt)} tokens] {text!r}"
        calls = parsed.tool_calls
        called = (
            ended
            and parsed.parse_error is None
            and len(calls) == 1
            and calls[0].name == scenario.tool
            and calls[0].arguments_value() == {scenario.key: command}
        )
        if not called:
            return False, f"call [{len(prompt)} tokens] {command!r}: {text!r}"
        if scenario.second is None:
            return True, ""
        prompt, turn = self.render(scenario.second, command, None)
        out = self.sample(prompt, temperature, 2000 + index)
        parsed, text = self.parse(out, turn)
        answered = out[-1:] == [IM_END] and not parsed.tool_calls and bool(parsed.content.strip())
        return answered, "" if answered else f"answer [{len(prompt)} tokens]: {text!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20, help="loops per scenario and mode")
    parser.add_argument("--url", help="an engine already serving the policy (else one is started)")
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    parser.add_argument("--workers", type=int, default=4, help="loops in flight")
    args = parser.parse_args()
    settings = Settings()  # the local default: the agentic policy, a 32k context
    engine = None
    url = args.url
    if url is None:
        started = time.monotonic()
        engine, url = start_vllm(settings, log_dir=Path("bench/results"))
        print(f"engine up in {time.monotonic() - started:.0f} s")
    evaluator = Evaluator(settings.model_path, url)
    results: dict[str, dict[str, int]] = {}
    try:
        for scenario in SCENARIOS:
            if args.only and args.only not in scenario.name:
                continue
            for mode, temperature in (("greedy", 0.0), ("T=1.0", 1.0)):
                started = time.monotonic()
                with ThreadPoolExecutor(args.workers) as pool:
                    runs = list(
                        pool.map(partial(evaluator.loop, scenario, temperature), range(args.n))
                    )
                done = sum(ok for ok, _ in runs)
                results.setdefault(scenario.name, {})[mode] = done
                took = time.monotonic() - started
                print(f"{scenario.name:36s} {mode:7s} {done}/{args.n}  ({took:.0f} s)", flush=True)
                for ok, why in runs:
                    if not ok:
                        print(f"   failed: {why[:400]}", flush=True)
    finally:
        if engine is not None:
            engine.stop()
    table = "\n".join(
        f"| {name} | {modes.get('greedy', '-')}/{args.n} | {modes.get('T=1.0', '-')}/{args.n} |"
        for name, modes in results.items()
    )
    header = "| scenario | greedy | T=1.0 |\n|---|---|---|\n"
    write_results("agent_policy", command_line(), {"n": args.n, "results": results}, header + table)


if __name__ == "__main__":
    main()
