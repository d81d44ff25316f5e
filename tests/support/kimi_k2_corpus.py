"""The shared corpus (tests/support/corpus.py) as a Kimi K2 model writes it: its
``call_N`` ids written as Kimi writes them (``functions.NAME:IDX``, IDX counting calls over the
conversation), shared by the Kimi K2 family's tests and the remote-code tokenizer's.
"""

from __future__ import annotations

from typing import Any

from tests.support.corpus import Conversation, corpus
from titoflow.tito.families.kimi_k2 import call_id


def kimi_ids(conversation: Conversation) -> Conversation:
    """The conversation with the corpus's ``call_N`` ids written as Kimi writes them."""
    ids: dict[str, str] = {}
    messages = []
    for message in conversation.messages:
        calls = []
        for call in message.tool_calls:
            ids[call.id] = call_id(call.name, int(call.id.removeprefix("call_")))
            calls.append(call.model_copy(update={"id": ids[call.id]}))
        update: dict[str, Any] = {"tool_calls": tuple(calls)}
        if message.tool_call_id is not None:
            update["tool_call_id"] = ids[message.tool_call_id]
        messages.append(message.model_copy(update=update))
    return Conversation(
        conversation.name, tuple(messages), conversation.tools, conversation.thinking
    )


CORPUS = [kimi_ids(c) for c in corpus()]
