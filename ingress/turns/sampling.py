"""Sampling as a call asked for it, as the rollout driver forces it, and as the engine is sent it.

Invariants:
- The driver's overrides win over the caller's values, and every replica applies the same ones:
  they are read from the session's :class:`~schemas.events.SessionBudgeted` record, which every
  replica follows (:mod:`ingress.turns.budgets`). A per-step seed derives from the step id alone
  (with the driver's base), so it is the same wherever the step is made and is recorded on it.
- A step's record is read from the very :class:`~titoflow.engine.api.GenerateParams` the engine
  was sent and from the request as parsed: values at hand, nothing recomputed, per turn.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from ingress.turns.turn import ChatTurn, TokenCall
from schemas.events import LogprobsMode, SamplingAsked, SamplingOverrides, SamplingUsed
from titoflow.engine.api import GenerateParams


def step_seed(base: int, step_id: str) -> int:
    """The seed of one step under the per_step policy: 31 bits, which every engine takes."""
    digest = hashlib.sha256(f"{base}\0{step_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def overridden(
    params: GenerateParams, overrides: SamplingOverrides, step_id: str
) -> GenerateParams:
    """``params`` with the driver's temperature, top_p, top_k and seed in their place (its
    max_tokens cap applies where max_tokens is computed, before the context check:
    :meth:`ingress.turns.admission.Admission.max_tokens`)."""
    changes: dict[str, Any] = {}
    if overrides.temperature is not None:
        changes["temperature"] = overrides.temperature
    if overrides.top_p is not None:
        changes["top_p"] = overrides.top_p
    if overrides.top_k is not None:
        changes["top_k"] = overrides.top_k
    if overrides.seed_policy == "per_step":
        changes["seed"] = step_seed(overrides.seed or 0, step_id)
    elif overrides.seed is not None:
        changes["seed"] = overrides.seed
    return replace(params, **changes) if changes else params


def used(params: GenerateParams, logprobs_mode: LogprobsMode) -> SamplingUsed:
    """What the engine was sent (``params``) and what its logprobs are."""
    return SamplingUsed(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        max_tokens=params.max_tokens,
        constrained=params.structured is not None,
        logprobs_mode=logprobs_mode,
    )


def asked(request: ChatTurn | TokenCall) -> SamplingAsked:
    """What the call asked for, as its API's adapter read it (a white-box call has no stop
    strings)."""
    source = request.sampling if isinstance(request, ChatTurn) else request
    return SamplingAsked(
        temperature=source.temperature,
        top_p=source.top_p,
        top_k=source.top_k,
        seed=source.seed,
        max_tokens=source.max_tokens,
        stop=list(request.sampling.stop) if isinstance(request, ChatTurn) else [],
    )
