"""The white-box token API: ``POST /sess/<id>/generate`` (or ``/generate`` with the session in
a header or the body) for agents that own their tokenization. Token ids in, the engine's token
ids, logprobs and weight versions out; recorded as a step like any chat call (``api:
generate``). Errors are in OpenAI's shape.

Invariant: what the engine sees is the caller's ids as sent, each checked to be an id of the
model's vocabulary, and only the sampling parameters named here: any other is a 400, since one
silently ignored would change what is sampled without saying so."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from ingress.turns.service import TokensResult
from ingress.turns.turn import SessionRef, TokenCall
from ingress.wire import errors, http
from titoflow.errors import InvalidRequest, TitoflowError


class SamplingParams(BaseModel):
    # Forbidden extras: a sampling parameter silently ignored would change what is sampled.
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(
        None, ge=1, validation_alias=AliasChoices("max_tokens", "max_new_tokens")
    )
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1: no top-k cut.")
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    logprobs: int = Field(0, ge=0, le=20, description="Top alternatives per token (0: none).")


class GenerateRequest(http.Lenient):
    input_ids: list[int] = Field(
        min_length=1, validation_alias=AliasChoices("input_ids", "token_ids")
    )
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = None


def parse_request(body: Any, session: SessionRef, vocab_size: int, model: str) -> TokenCall:
    """Validate a /generate body into a white-box call of ``session``."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    request = http.validated(GenerateRequest, body)
    bad = next((t for t in request.input_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"input_ids: {bad} is not a token id of this model (0..{vocab_size - 1})", "input_ids"
        )
    sampling = request.sampling_params
    return TokenCall(
        session=session,
        model=request.model or model,
        prompt_ids=tuple(request.input_ids),
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop_token_ids=tuple(sampling.stop_token_ids),
        top_logprobs=sampling.logprobs,
    )


def response_body(result: TokensResult) -> dict[str, Any]:
    step, generation = result.step, result.generation
    body: dict[str, Any] = {
        "session_id": step.session_id,
        "step_id": step.step_id,
        "chain_id": step.chain_id,
        "prefix": step.prefix,
        "prompt_tokens": result.prompt_len,
        "token_ids": generation.token_ids,
        "logprobs": generation.logprobs,
        "finish_reason": generation.finish_reason,
        "weight_versions": [span.model_dump() for span in generation.weight_versions],
    }
    if generation.top_logprobs and any(generation.top_logprobs):
        body["top_logprobs"] = [
            [{"token_id": t, "logprob": lp} for t, lp in alternatives]
            for alternatives in generation.top_logprobs
        ]
    return body


async def _generate(request: Request, session: str | None) -> Response:
    try:
        body = await http.read_json(request)
        svc = http.service(request)
        call = parse_request(
            body,
            http.session_of(request, session, body),
            svc.options.vocab_size,
            http.settings(request).served_model_name,
        )
        http.check_model(request, call.model)
        result = await svc.generate_tokens(call)
    except TitoflowError as exc:
        return errors.OPENAI.response(exc)
    return JSONResponse(response_body(result))


def router() -> APIRouter:
    routes = APIRouter()
    http.post_both_ways(routes, "/generate", _generate)
    return routes
