"""The engine-side witness: what the engine saw and returned, recorded in front of it, and the
check that segments hold exactly that.

:class:`RecordingProxy` sits between the ingress and vLLM (a real HTTP hop on its own thread) and
forwards every request unchanged. For each ``/inference/v1/generate`` call it keeps the prompt
token ids and sampling parameters it forwarded and the token ids, logprobs, weight-version spans
and finish reason the engine answered, streamed or not. Nothing in it comes from titoflow's own
events.

:func:`check_segments` holds segments to that record (concat mode): every trainable step's
completion is the concatenation of witnessed completions (one call, or several when a pause
aborted a generation and the ingress continued it), each sampled after exactly the tokens before
it in the segment (steps with recomputed tokens, source 3, hold re-rendered turns and are left to
the recompute tests); sampled logprobs equal the engine's as float32 bits; no witnessed call is
trainable twice; with ``complete``, every witnessed call is trainable in exactly one segment
(a marked unused sample counts) unless the test names it as accounted for. A call is one sample:
one that asked the engine for ``n`` > 1 fails the check rather than go partly unaccounted.

Images (issue 30): a call is sent one placeholder id per image with the images as
``content_parts``; the proxy records each image's uuid and the sha256 of the bytes sent with it
(none for an image sent by uuid alone), and from the answer the engine's expanded prompt and its
placeholder runs (``mm_placeholders``). What a segment is held to is that expanded prompt, what
the model saw. :func:`check_images` holds the calls to themselves first: an image's uuid is the
sha256 of its bytes; an image sent by uuid alone was sent with its bytes to the same engine on an
earlier call; the engine returned one placeholder run per image, each one id repeated, and cutting
every run to its first id gives back exactly the ids it was sent (no double expansion).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cli.dev.procs import free_port
from schemas.events import (
    LOGPROB_SOURCE_RECOMPUTED,
    SegmentFinalized,
)

GENERATE = "/inference/v1/generate"


@dataclass(frozen=True)
class WitnessedImage:
    """An image of a call's ``content_parts``: its ``uuid``, and the sha256 (hex) of the bytes
    its ``data:`` URL carried; ``by_uuid``: sent without a URL (the engine's cached copy)."""

    uuid: str
    sha256: str | None
    by_uuid: bool = False

    @classmethod
    def of_part(cls, part: dict[str, Any]) -> WitnessedImage:
        url = part.get("url")
        if url is None:
            return cls(str(part.get("uuid")), None, by_uuid=True)
        header, _, data = str(url).partition(",")
        digest = None
        if header.startswith("data:") and header.endswith(";base64"):
            try:
                digest = hashlib.sha256(base64.b64decode(data, validate=True)).hexdigest()
            except binascii.Error:
                digest = "undecodable"
        return cls(str(part.get("uuid")), digest)


@dataclass
class Witnessed:
    """One generate call as the engine saw and answered it. ``prompt``: the ids it was sent;
    with images, ``expanded`` is the prompt the engine made of them and ``placeholders`` the
    (offset, length) of each image's run in it, as the engine answered."""

    prompt: tuple[int, ...]
    stream: bool
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    prompt_logprobs: bool = False  # a scoring call (recompute), not a sample
    # Samples the call asked for (vLLM's ``n``): the record holds choice 0 only, so a call of
    # more would hide samples from the check, which refuses it instead.
    samples: int = 1
    sampling_params: dict[str, Any] = field(default_factory=dict)  # as the engine was sent them
    engine: str = ""  # the engine's URL (an image cached by one engine is not in another's cache)
    images: list[WitnessedImage] = field(default_factory=list)
    expanded: tuple[int, ...] | None = None
    placeholders: list[tuple[int, int]] | None = None

    @property
    def seen(self) -> tuple[int, ...]:
        """The prompt the model saw: the engine's expansion when it returned one."""
        return self.prompt if self.expanded is None else self.expanded

    def take(self, payload: dict[str, Any]) -> None:
        if payload.get("prompt_token_ids") is not None and self.expanded is None:
            self.expanded = tuple(int(t) for t in payload["prompt_token_ids"])
        if payload.get("mm_placeholders") is not None and self.placeholders is None:
            runs = payload["mm_placeholders"].get("image") or []
            self.placeholders = [(int(run["offset"]), int(run["length"])) for run in runs]
        choice = (payload.get("choices") or [{}])[0]
        self.completion += [int(t) for t in choice.get("token_ids") or []]
        entries = (choice.get("logprobs") or {}).get("content") or []
        self.logprobs += [float(entry["logprob"]) for entry in entries]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.weight_versions = list(choice.get("weight_versions") or [])


class Witness:
    """The calls recorded by one or more proxies (one per engine a test runs)."""

    def __init__(self) -> None:
        self.calls: list[Witnessed] = []
        self.lock = threading.Lock()
        self._proxies: list[RecordingProxy] = []

    def front(self, engine_url: str) -> str:
        """A recording proxy in front of ``engine_url``: the URL to give the ingress."""
        proxy = RecordingProxy(engine_url, self).start()
        self._proxies.append(proxy)
        return proxy.url

    def witnessed(self) -> list[Witnessed]:
        """The sampling calls recorded so far that the engine answered."""
        with self.lock:
            return [c for c in self.calls if c.finish_reason is not None and not c.prompt_logprobs]

    def stop(self) -> None:
        for proxy in self._proxies:
            proxy.stop()


class RecordingProxy:
    """A pass-through HTTP proxy in front of an engine that records every generate call."""

    def __init__(self, engine_url: str, witness: Witness) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.witness = witness
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RecordingProxy:
        port = free_port()
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the recording proxy did not start")
            threading.Event().wait(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        call: Witnessed | None = None
        stream = False
        if request.url.path == GENERATE and request.method == "POST":
            sent = json.loads(body)
            stream = bool(sent.get("stream"))
            scoring = bool((sent.get("sampling_params") or {}).get("prompt_logprobs") is not None)
            samples = int((sent.get("sampling_params") or {}).get("n") or 1)
            call = Witnessed(
                tuple(sent["token_ids"]),
                stream,
                prompt_logprobs=scoring,
                samples=samples,
                sampling_params=dict(sent.get("sampling_params") or {}),
                engine=self.engine_url,
                images=[WitnessedImage.of_part(part) for part in sent.get("content_parts") or []],
            )
            with self.witness.lock:
                self.witness.calls.append(call)
        client = httpx.AsyncClient(base_url=self.engine_url, timeout=None)
        upstream = await client.send(
            client.build_request(request.method, path, content=body, headers=headers), stream=True
        )
        if not stream:
            content = await upstream.aread()
            await upstream.aclose()
            await client.aclose()
            if call is not None and upstream.status_code == 200:
                call.take(json.loads(content))
            return Response(
                content, status_code=upstream.status_code, headers=_passed(upstream.headers)
            )

        async def relay() -> AsyncIterator[bytes]:
            buffer = b""
            try:
                async for chunk in upstream.aiter_raw():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if call is not None and line.startswith(b"data: {"):
                            call.take(json.loads(line[len(b"data: ") :]))
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        return StreamingResponse(
            relay(), status_code=upstream.status_code, headers=_passed(upstream.headers)
        )


def _passed(headers: httpx.Headers) -> dict[str, str]:
    dropped = ("content-length", "transfer-encoding", "connection", "content-encoding")
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def _bits(values: Iterable[float]) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


class WitnessError(AssertionError):
    pass


def check_segments(
    segments: Iterable[SegmentFinalized],
    calls: list[Witnessed],
    complete: bool = False,
    accounted: Iterable[tuple[int, ...]] = (),
) -> Counter[str]:
    """Hold ``segments`` to the witnessed ``calls`` (see the module doc); returns counts of
    what it checked. ``accounted``: full token sequences (prompt + completion) of calls a test
    expects in no segment (a discarded session, an aborted request)."""
    several = [call for call in calls if call.samples != 1]
    if several:
        raise WitnessError(
            f"{len(several)} generate calls asked for several samples (n); the witness records "
            "one sample per call (the ingress sends a call per sample)"
        )
    counts: Counter[str] = check_images(calls)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for index, call in enumerate(calls):
        by_prompt.setdefault(call.seen, []).append(index)
    used: Counter[int] = Counter()
    for segment in segments:
        counts["segments"] += 1
        counts["unused_samples"] += segment.unused_sample
        if segment.build_mode != "concat":
            continue
        tokens, mask = segment.token_ids, segment.loss_mask
        covered = [False] * len(tokens)
        # The image runs the engine placed in the prompts its completions followed, and how far
        # those prompts reach.
        runs: set[tuple[int, int, str]] = set()
        reach = 0
        for entry in segment.steps:
            start, end = entry.completion_start, entry.completion_end
            sources = segment.logprob_source[start:end]
            if not any(mask[start:end]):
                continue  # context here
            if LOGPROB_SOURCE_RECOMPUTED in sources:
                # A rebuilt turn: its leading sampled tokens must still be the engine's.
                kept = sources.index(LOGPROB_SOURCE_RECOMPUTED)
                _check_sampled_prefix(segment, calls, by_prompt, start, start + kept)
                covered[start:end] = [True] * (end - start)
                counts["rebuilt_steps"] += 1
                continue
            at = start
            while at < end:
                found = _witnessed_at(calls, by_prompt, tokens, at, end, used)
                if found is None:
                    raise WitnessError(
                        f"segment {segment.segment_id} step {entry.step_id}: tokens "
                        f"[{at}, {end}) were not sampled by the engine after the {at} tokens "
                        "before them"
                    )
                call = calls[found]
                stop = at + len(call.completion)
                if _bits(segment.logprobs[at:stop]) != _bits(call.logprobs):
                    raise WitnessError(
                        f"segment {segment.segment_id} step {entry.step_id}: logprobs differ "
                        "from the engine's"
                    )
                used[found] += 1
                counts["witnessed_runs"] += 1
                runs |= image_runs(call)
                reach = max(reach, at)
                at = stop
            for p in range(start, end):
                covered[p] = True
            counts["trainable_steps"] += 1
        # Recomputed tokens (source 3) carry the engine's prompt logprobs, not a sample's.
        uncovered = [
            p
            for p, (c, m, source) in enumerate(
                zip(covered, mask, segment.logprob_source, strict=True)
            )
            if m and not c and source != LOGPROB_SOURCE_RECOMPUTED
        ]
        if uncovered:
            raise WitnessError(
                f"segment {segment.segment_id}: trainable positions {uncovered[:8]} lie in no "
                "witnessed step"
            )
        counts["segment_images"] += _check_image_records(segment, runs, reach)
    twice = [i for i, n in used.items() if n > 1]
    if twice:
        raise WitnessError(f"{len(twice)} witnessed completions are trainable more than once")
    if complete:
        expected = set(accounted)
        missing = [
            i
            for i, call in enumerate(calls)
            if not used[i] and call.completion and (*call.seen, *call.completion) not in expected
        ]
        if missing:
            raise WitnessError(
                f"{len(missing)} of {len(calls)} witnessed completions reached no segment"
            )
    counts["witnessed_calls"] = len(calls)
    return counts


def check_images(calls: list[Witnessed]) -> Counter[str]:
    """Hold the calls' images to themselves (see the module doc); counts what it checked."""
    counts: Counter[str] = Counter()
    cached: set[tuple[str, str]] = set()  # (engine, uuid) sent with bytes so far
    for index, call in enumerate(calls):
        where = f"witnessed call {index}"
        for image in call.images:
            if image.by_uuid:
                if (call.engine, image.uuid) not in cached:
                    raise WitnessError(
                        f"{where}: image {image.uuid[:12]} was sent by uuid alone, but never "
                        "with its bytes to that engine before"
                    )
                counts["images_by_uuid"] += 1
                continue
            if image.sha256 != image.uuid:
                raise WitnessError(
                    f"{where}: image uuid {image.uuid[:12]} is not the sha256 of the bytes sent "
                    f"with it ({'no data: URL' if image.sha256 is None else image.sha256[:12]})"
                )
            cached.add((call.engine, image.uuid))
            counts["images_with_bytes"] += 1
        if call.images or call.placeholders:
            _check_expansion(call, where)
            counts["expanded_calls"] += 1
        elif call.expanded is not None and call.expanded != call.prompt:
            raise WitnessError(f"{where}: the engine changed a prompt without images")
    return counts


def _check_expansion(call: Witnessed, where: str) -> None:
    """One run per image, in order, each one id repeated, and the ids sent are the expanded
    prompt with every run cut to its first id: the engine expanded each placeholder once."""
    expanded, placeholders = call.expanded, call.placeholders
    if expanded is None or placeholders is None:
        raise WitnessError(f"{where}: the engine returned no expanded prompt for its images")
    if len(placeholders) != len(call.images):
        raise WitnessError(
            f"{where}: {len(call.images)} image(s) sent, {len(placeholders)} placeholder runs "
            "returned"
        )
    collapsed: list[int] = []
    start = 0
    for offset, length in placeholders:
        run = expanded[offset : offset + length]
        if offset < start or length < 1 or len(run) != length or len(set(run)) != 1:
            raise WitnessError(
                f"{where}: placeholder run [{offset}, {offset + length}) is out of order, "
                "outside the prompt or not one id repeated"
            )
        collapsed += expanded[start : offset + 1]
        start = offset + length
    collapsed += expanded[start:]
    if tuple(collapsed) != call.prompt:
        raise WitnessError(
            f"{where}: the {len(expanded)} expanded ids cut back to one placeholder per image "
            f"are not the {len(call.prompt)} ids sent (an image expanded twice?)"
        )


def image_runs(call: Witnessed) -> set[tuple[int, int, str]]:
    """(offset, length, uuid) of each image run the engine placed in ``call``'s prompt."""
    return {
        (offset, length, image.uuid)
        for (offset, length), image in zip(call.placeholders or [], call.images, strict=False)
    }


def _check_image_records(
    segment: SegmentFinalized, runs: set[tuple[int, int, str]], reach: int
) -> int:
    """A segment's ``images`` (sha256, offset, length per image) within its first ``reach``
    ids are exactly the image runs the engine placed in the prompts of the calls its
    completions came from."""
    recorded = {
        (r.offset, r.length, r.sha256) for r in segment.images if r.offset + r.length <= reach
    }
    if recorded != runs:
        raise WitnessError(
            f"segment {segment.segment_id}: its image records {sorted(recorded)} are not the "
            f"image runs the engine placed {sorted(runs)}"
        )
    return len(recorded)


def _check_sampled_prefix(
    segment: SegmentFinalized,
    calls: list[Witnessed],
    by_prompt: dict[tuple[int, ...], list[int]],
    start: int,
    end: int,
) -> None:
    """Tokens ``[start, end)`` with their logprobs begin a completion the engine sampled after
    exactly ``token_ids[:start]``."""
    if start == end:
        return
    tokens, logprobs = segment.token_ids[start:end], _bits(segment.logprobs[start:end])
    for index in by_prompt.get(tuple(segment.token_ids[:start]), []):  # keyed by call.seen
        call = calls[index]
        if call.completion[: end - start] == tokens and _bits(call.logprobs[: end - start]) == (
            logprobs
        ):
            return
    raise WitnessError(
        f"segment {segment.segment_id}: sampled tokens [{start}, {end}) of a rebuilt turn are not "
        "what the engine sampled there"
    )


def _witnessed_at(
    calls: list[Witnessed],
    by_prompt: dict[tuple[int, ...], list[int]],
    tokens: list[int],
    at: int,
    end: int,
    used: Counter[int],
) -> int | None:
    """A witnessed call sampled after exactly ``tokens[:at]`` whose completion is
    ``tokens[at:...]`` within ``end`` (an unused one first: two identical samples are two)."""
    found: int | None = None
    for index in by_prompt.get(tuple(tokens[:at]), []):
        completion = calls[index].completion
        if completion and tokens[at : at + len(completion)] == completion:
            if at + len(completion) > end:
                continue
            if not used[index]:
                return index
            found = index if found is None else found
    return found
