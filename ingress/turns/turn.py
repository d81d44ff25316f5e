"""The one internal model every wire format (OpenAI chat, Anthropic, Responses) maps to, and the
white-box token call. Messages themselves are :mod:`titoflow.tito.messages`."""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from titoflow.tito.messages import Message, render_key, tools_key

Api = Literal["openai.chat", "anthropic.messages", "openai.responses"]


class SamplingOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: not asked (Anthropic's top_k; OpenAI's APIs have none)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = Field(
        None, description="None: not asked; 0: the sampled token's; k: also the top k."
    )


class SessionRef(BaseModel):
    """Who a call belongs to: from the URL path, headers, or body fallbacks."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    instance_id: str | None = None
    turn_id: str | None = None


class ChatTurn(BaseModel):
    """One request to the policy, whatever API it came in through."""

    model_config = ConfigDict(frozen=True)

    session: SessionRef
    api: Api
    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = Field(
        (), description="OpenAI function-tool schemas, as chat templates take them."
    )
    tool_choice: Literal["auto", "none", "required", "named"] = "auto"
    tool_choice_name: str | None = None
    sampling: SamplingOptions = SamplingOptions()
    n: int = Field(1, description="Samples of the prompt (OpenAI chat's n): a step each.")
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    text_only: bool = Field(
        False,
        description="No message holds an image, as the wire bytes tell "
        "(ingress.wire.known_messages); False: it may, the messages tell.",
    )

    @cached_property
    def tools_key(self) -> str:
        """Chains continue only under the same tools and template switches: they shape prompts.
        Cached: a turn reads it three times (find, step record, chain advance)."""
        return tools_key(self.tools, self.template_kwargs)

    @cached_property
    def tools_digest(self) -> str:
        """SHA-256 of :attr:`tools_key`, hex: what chains compare (a long tool list's key would
        be compared byte for byte with every chain of the session on every turn) and what a step
        records of it (``tools_hash``, its first 16 digits)."""
        return hashlib.sha256(self.tools_key.encode()).hexdigest()

    @cached_property
    def render_key(self) -> str:
        """The tools and template switches as the renderer keeps their rendered parts."""
        return render_key(self.tools, self.template_kwargs)


class TokenCall(BaseModel):
    """One white-box call: the caller tokenized, the ingress only records and forwards ids."""

    model_config = ConfigDict(frozen=True)

    session: SessionRef
    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
