"""Prefill a GRPO group saves with group routing (TITOFLOW_ENGINE_GROUP_ROUTING), against
session-only routing, in one run on two vLLM CPU engines.

    .venv/bin/python -m bench.group_prefill          # starts two vLLM CPU engines (the policy)
    .venv/bin/python -m bench.group_prefill --engine-urls URL,URL --model .models/tiny-qwen3

Two ingress replicas run on the same two engines and the same tansu broker: one routes by
instance id, the other by session id (the default). Each round, each replica in turn (the
order alternating between rounds) gets one group: ``--group`` sessions opened with one instance
id (POST /v1/sessions, as a rollout driver does), then all of them asked at once for a reply
to the same long prompt (about ``--prompt-tokens`` tokens, which start with the round's own
nonce so that no group hits another's cache). Measured per group: its wall time (first request
sent to last answer) and the engines' prefix-cache hit rate over its calls, from the engines'
``/metrics`` before and after it (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``,
tokens, summed over both engines), and how many engines its calls went to. Printed: the medians
per routing and their ratios (group routing over session routing).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import command_line, started_processes, write_results
from cli.dev.broker import start_tansu
from cli.dev.engine_process import start_vllm
from cli.dev.stack import start_ingress
from titoflow.settings import Settings

ROUTINGS = {"session": False, "group": True}  # name: engine_group_routing
WORDS = ("the", "of", "a", "to", "in", "is", "for", "on", "that", "with", "as", "by", "at")


def long_prompt(nonce: str, tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens of text starting with ``nonce`` (a word is about a token)."""
    body = " ".join(rng.choice(WORDS) for _ in range(tokens))
    return f"Task {nonce}. Read this and summarize it. {body}"


async def prefix_cache(
    http: httpx.AsyncClient, engines: list[str]
) -> dict[str, tuple[float, float]]:
    """Per engine, its prefix-cache (hits, queries) counters, in tokens."""
    counts: dict[str, tuple[float, float]] = {}
    for url in engines:
        text = (await http.get(f"{url}/metrics")).text
        values = {"vllm:prefix_cache_hits": 0.0, "vllm:prefix_cache_queries": 0.0}
        for family in text_string_to_metric_families(text):
            if family.name in values:
                values[family.name] += sum(
                    s.value for s in family.samples if s.name.endswith("_total")
                )
        counts[url] = (values["vllm:prefix_cache_hits"], values["vllm:prefix_cache_queries"])
    return counts


async def run_group(
    http: httpx.AsyncClient, ingress: str, engines: list[str], prompt: str, size: int
) -> dict[str, Any]:
    """One group through ``ingress``: its wall time, hit rate, engines used, prompt length."""
    instance = f"prompt-{uuid.uuid4().hex[:8]}"
    sessions = [f"{instance}-{i}" for i in range(size)]
    for session in sessions:
        opened = await http.post(
            f"{ingress}/v1/sessions", json={"session_id": session, "instance_id": instance}
        )
        opened.raise_for_status()
    before = await prefix_cache(http, engines)

    async def ask(index: int, session: str) -> int:
        answer = await http.post(
            f"{ingress}/sess/{session}/v1/chat/completions",
            json={
                "model": "policy",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8,
                "seed": index,
            },
        )
        answer.raise_for_status()
        usage: int = answer.json()["usage"]["prompt_tokens"]
        return usage

    started = time.perf_counter()
    prompt_tokens = await asyncio.gather(*(ask(i, s) for i, s in enumerate(sessions)))
    wall = time.perf_counter() - started
    after = await prefix_cache(http, engines)
    hits = sum(after[u][0] - before[u][0] for u in engines)
    queries = sum(after[u][1] - before[u][1] for u in engines)
    used = sum(1 for u in engines if after[u][1] > before[u][1])
    return {
        "wall_s": wall,
        "hit_rate": hits / queries if queries else 0.0,
        "hits": hits,
        "queries": queries,
        "engines_used": used,
        "prompt_tokens": prompt_tokens[0],
    }


async def measure(
    ingresses: dict[str, str], engines: list[str], args: argparse.Namespace
) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(0)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ingresses}
    async with httpx.AsyncClient(timeout=600) as http:
        for number in range(args.rounds + 1):  # round 0 warms the engines up, not counted
            order = list(ingresses) if number % 2 else list(reversed(ingresses))
            for name in order:
                prompt = long_prompt(uuid.uuid4().hex, args.prompt_tokens, rng)
                result = await run_group(http, ingresses[name], engines, prompt, args.group)
                if number:
                    runs[name].append(result)
                    print(
                        f"round {number} {name:>7}: {result['wall_s']:.2f} s, hit rate "
                        f"{result['hit_rate']:.3f} on {result['engines_used']} engine(s)",
                        flush=True,
                    )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine-urls", default="", help="two running engines (else started)")
    parser.add_argument("--model", type=Path, default=Settings().model_path)
    parser.add_argument("--group", type=int, default=8, help="sessions per group")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5, help="groups per routing")
    args = parser.parse_args()
    settings = Settings(model_path=args.model)
    with started_processes("titoflow-bench-") as (log_dir, started):
        engines = [u.strip().rstrip("/") for u in args.engine_urls.split(",") if u.strip()]
        for index in range(len(engines), 2):
            engine_logs = log_dir / f"engine-{index}"
            engine_logs.mkdir()
            proc, url = start_vllm(settings, log_dir=engine_logs)
            started.append(proc)
            engines.append(url)
        broker, bootstrap = start_tansu(log_dir)
        started.append(broker)
        ingresses: dict[str, str] = {}
        for name, by_instance in ROUTINGS.items():
            replica = settings.model_copy(
                update={
                    "bootstrap_servers": bootstrap,
                    "engine_url": engines[0],
                    "engine_urls": ",".join(engines[1:]),
                    "topic_prefix": f"bench-{uuid.uuid4().hex[:8]}",
                    "engine_group_routing": by_instance,
                }
            )
            proc, url = start_ingress(replica, log_dir, f"ingress-{name}")
            started.append(proc)
            ingresses[name] = url
        runs = asyncio.run(measure(ingresses, engines, args))
    summary = {
        name: {
            key: statistics.median(r[key] for r in results)
            for key in ("wall_s", "hit_rate", "engines_used", "queries", "hits")
        }
        for name, results in runs.items()
    }
    session, group = summary["session"], summary["group"]
    rows = [
        f"| {name} | {s['engines_used']:.0f} | {s['hit_rate']:.3f} | "
        f"{s['queries'] - s['hits']:.0f} | {s['wall_s']:.2f} |"
        for name, s in summary.items()
    ]
    prefilled = {name: s["queries"] - s["hits"] for name, s in summary.items()}
    table = "\n".join(
        [
            f"{args.model.name}, group of {args.group} sessions, prompt of "
            f"{runs['group'][0]['prompt_tokens']} tokens, medians of {args.rounds} groups each",
            "",
            "| routing | engines used | prefix-cache hit rate | tokens prefilled | wall (s) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"group / session, same run: tokens prefilled "
            f"x{prefilled['group'] / max(prefilled['session'], 1):.2f}, "
            f"wall time x{group['wall_s'] / session['wall_s']:.2f}",
        ]
    )
    write_results(
        "group_prefill",
        command_line(),
        {"model": str(args.model), "engines": len(engines), "runs": runs, "summary": summary},
        table,
    )


if __name__ == "__main__":
    main()
