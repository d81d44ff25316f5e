"""The in-process image chat app the image tests share (tests/ingress/turns/test_chat_images.py,
tests/ingress/wire/test_chat_image_urls.py, tests/workers/test_image_record.py): the tiny
Qwen3-VL policy's tokenizer, template and processor config on the SCRIPTED ENGINE DOUBLE behind
the OpenAI chat, Responses and Anthropic messages routes, its service options, and the images
and tool calls sent to it.
"""

from __future__ import annotations

import atexit
import base64
import copy
import io
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import openai
from PIL import Image

from cli.dev.vl_policy import PREPROCESSOR_CONFIG, chat_template
from ingress.turns.service import ServiceOptions
from ingress.wire import anthropic_messages, openai_chat, openai_responses
from tests.support.apps import asgi_client, scripted_app
from tests.support.doubles import RecordingPublisher, ScriptedEngine
from tests.support.families import path_tool, qwen3
from titoflow.image_store import ImageStore
from titoflow.settings import Settings
from titoflow.tito.image_grid import ImageProcessing

PROCESSING = ImageProcessing.of_config(PREPROCESSOR_CONFIG)
# Content-addressed, so one store serves every test that uses these options
# (tests/workers/test_image_record.py checks what goes into a store of its own).
STORE = ImageStore(Path(tempfile.mkdtemp(prefix="titoflow-test-images-")))
atexit.register(shutil.rmtree, STORE.root, ignore_errors=True)


def vl_options(**limits: Any) -> ServiceOptions:
    """The VL policy's service options, images stored in ``STORE`` unless ``limits`` say."""
    given: dict[str, Any] = {"image_store": STORE} | limits
    return ServiceOptions(
        max_model_len=4096,
        default_max_tokens=64,
        image_processing=PROCESSING,
        image_fingerprint=PROCESSING.fingerprint("5.19.0"),
        **given,
    )


OPTIONS = vl_options()
TOOLS: Any = [path_tool("screenshot", "a screenshot of a path")]
CALL = '<tool_call>\n{"name": "screenshot", "arguments": {"path": "/tmp"}}\n</tool_call><|im_end|>'


@cache
def vl_tokenizer() -> Any:
    """The VL policy's: Qwen3's with Qwen3-VL's template, on a copy (``qwen3()`` is shared)."""
    tokenizer = copy.deepcopy(qwen3())
    tokenizer.chat_template = chat_template()
    return tokenizer


def vl_app(
    replies: list[str], options: ServiceOptions = OPTIONS, settings: Settings | None = None
) -> tuple[Any, ScriptedEngine, RecordingPublisher]:
    routers = [openai_chat.router, anthropic_messages.router, openai_responses.router]
    return scripted_app(replies, routers, settings, options, tokenizer=vl_tokenizer())


def client_for(app: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://ingress/sess/s1/v1",
        api_key="unused",
        http_client=asgi_client(app),
        max_retries=0,
    )


def png(width: int, height: int, colour: tuple[int, int, int] = (30, 90, 200)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


def image_part(data: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}
