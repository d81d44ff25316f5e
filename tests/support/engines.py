"""A real vLLM CPU engine for tests, or one a developer already runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from cli.dev.engine_process import start_vllm
from schemas.events import LogprobsMode
from titoflow.settings import Settings

ENGINE_NICENESS = 10


def engine_for_tests(
    running_url_variable: str,
    model_dir: Path,
    log_dir: Path,
    logprobs_mode: LogprobsMode | None = None,
) -> Iterator[str]:
    """Yield the URL in ``running_url_variable`` if set (developers sharing one machine point
    tests at an engine already serving the same model; CI never sets it), else start vLLM on
    ``model_dir`` with ``--logprobs-mode logprobs_mode`` (None: the settings' own, which the
    test stacks record) and stop it afterwards."""
    running = os.environ.get(running_url_variable)
    if running:
        yield running
        return
    settings = Settings(model_path=model_dir)
    if logprobs_mode is not None:
        settings = settings.model_copy(update={"engine_logprobs_mode": logprobs_mode})
    proc, url = start_vllm(settings, log_dir=log_dir)
    # The engine shares the test host's cores with the stack it serves (a GPU host runs it
    # apart): at normal priority its busy API server and engine core starved the ingress, the
    # broker and the test's own client for seconds on two cores (pauses landing 9 s late, a
    # health check timing out). Niced, it takes what they leave; its outputs do not change.
    os.setpriority(os.PRIO_PGRP, proc.pid, ENGINE_NICENESS)
    try:
        yield url
    finally:
        proc.stop()
