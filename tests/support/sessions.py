"""One session on a stack a test starts: the ingress and the worker (cli/dev/stack.py) on the
test's settings, and an OpenAI client on a fresh session's URL. Leaving closes the client, then
stops the ingress and the worker, whatever the test raised."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from openai import AsyncOpenAI

from cli.dev.stack import start_ingress, start_worker
from titoflow.settings import Settings


@contextlib.asynccontextmanager
async def session_on_stack(
    settings: Settings, tmp_path: Path, prefix: str
) -> AsyncIterator[tuple[str, str, AsyncOpenAI]]:
    """The ingress's URL, the session's id (``prefix`` and a random tail) and the client."""
    ingress, url = start_ingress(settings, tmp_path)
    worker = start_worker(settings, tmp_path)
    session = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=f"{url}/sess/{session}/v1", api_key="unused", max_retries=0)
    try:
        yield url, session, client
    finally:
        await client.close()
        ingress.stop()
        worker.stop()
