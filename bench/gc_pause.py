"""The garbage collector's full-collection pause of an ingress holding many sessions, with and
without start-up's objects frozen out of the walk (titoflow/gc_pauses.py).

    .venv/bin/python -m bench.gc_pause [--sessions 200 1000] [--turns 40] [--rounds 5]

In process, as the ingress holds them: one :class:`~ingress.turns.service.ChatService` (the SCRIPTED
ENGINE DOUBLE of bench/tito_cost.py, answering at once with a tool call; steps dropped) takes
``--turns`` agent turns of each of ``--sessions`` sessions (bench/overhead.py's tool results),
round-robin, so its chain cache holds every session's conversation. Each case runs in a fresh
process, plain then frozen, so both pay the same start-up. Printed per case: the full
collections the collector ran during the turns (count, their total time, its share of the
process CPU), then the pause of one full collection of what is held at the end (the least of
``--rounds``), the objects it walks, and the frozen / plain ratio of the pause.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from typing import Any

from bench.harness import ROOT, command_line, write_results


def _case(sessions: int, turns: int, freeze: bool, rounds: int) -> dict[str, Any]:
    from bench.overhead import tool_output
    from bench.tito_cost import OPENING, TOOL_LISTS, doubled_service
    from ingress.turns.turn import ChatTurn, SessionRef
    from titoflow.gc_pauses import FULL_COLLECTION_SECONDS, freeze_startup, watch_full_collections
    from titoflow.tito.messages import Message

    tools = TOOL_LISTS["two"]()
    _, service = doubled_service(tools, sessions=sessions * 2)
    if freeze:
        freeze_startup()
    watch_full_collections()  # the services' own timing: from here on, in this fresh process

    async def drive() -> float:
        conversations = [list(OPENING) for _ in range(sessions)]
        cpu = time.process_time()
        for turn in range(1, turns + 1):
            for s, messages in enumerate(conversations):
                [result] = await service.complete(
                    ChatTurn(
                        session=SessionRef(session_id=f"s{s}"),
                        api="openai.chat",
                        model="policy",
                        messages=tuple(messages),
                        tools=tools,
                    )
                )
                await asyncio.sleep(0)  # the metrics and log line the step left run
                [call] = result.parsed.tool_calls
                messages.append(Message(role="assistant", tool_calls=(call,)))
                output = tool_output(s, turn, 300)
                messages.append(Message(role="tool", content=output, tool_call_id=call.id))
        return time.process_time() - cpu

    cpu = asyncio.run(drive())
    [metric] = FULL_COLLECTION_SECONDS.collect()
    during = {sample.name: sample.value for sample in metric.samples}
    count, total = during[f"{metric.name}_count"], during[f"{metric.name}_sum"]
    gc.collect()
    pauses = []
    for _ in range(rounds):
        start = time.perf_counter()
        gc.collect()
        pauses.append(time.perf_counter() - start)
    return {
        "sessions": sessions,
        "turns": turns,
        "frozen": freeze,
        "full_collections": int(count),
        "full_collections_ms": round(total * 1000, 1),
        "cpu_ms": round(cpu * 1000, 1),
        "pause_ms": round(min(pauses) * 1000, 2),
        "walked": len(gc.get_objects()),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "sessions  turns  frozen  full GCs during  their ms  share of CPU  pause ms  walked"
        "  frozen/plain pause"
    ]
    plain = {(r["sessions"], r["turns"]): r for r in rows if not r["frozen"]}
    for r in rows:
        base = plain.get((r["sessions"], r["turns"]))
        ratio = f"{r['pause_ms'] / base['pause_ms']:.2f}" if r["frozen"] and base else ""
        share = r["full_collections_ms"] / r["cpu_ms"] * 100
        lines.append(
            f"{r['sessions']:>8}  {r['turns']:>5}  {r['frozen']!s:>6}  "
            f"{r['full_collections']:>15}  {r['full_collections_ms']:>8}  {share:>10.1f}%  "
            f"{r['pause_ms']:>8}  {r['walked']:>6}  {ratio:>18}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a fresh process
    args = parser.parse_args()
    if args.case:
        sessions, freeze = json.loads(args.case)
        print(json.dumps(_case(sessions, args.turns, freeze, args.rounds)))
        return
    rows = []
    for sessions in args.sessions:
        for freeze in (False, True):
            case = json.dumps([sessions, freeze])
            command = [sys.executable, "-m", "bench.gc_pause", "--case", case]
            command += ["--turns", str(args.turns), "--rounds", str(args.rounds)]
            out = subprocess.run(
                command,
                cwd=ROOT,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    write_results("gc_pause", command_line(), {"rows": rows}, table(rows))


if __name__ == "__main__":
    main()
