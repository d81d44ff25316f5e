"""Session operations and discovery routes shared by every API: finalize, models, base URL."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ingress import http, openai_chat
from titoflow.errors import IngressError, InvalidRequest


async def _finalize(request: Request, session: str | None) -> Response:
    try:
        body = await http.read_json(request, allow_empty=True)
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        ref = http.session_ref(session, http.lower_headers(request), body)
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidRequest("metadata must be an object", "metadata")
        event = await http.service(request).finalize(ref, metadata)
    except IngressError as exc:
        return openai_chat.error_response(exc)
    return JSONResponse({"session_id": event.session_id, "finalized": True})


def router() -> APIRouter:
    routes = APIRouter()

    @routes.post("/sess/{session}/finalize")
    async def finalize_in_session(request: Request, session: str) -> Response:
        return await _finalize(request, session)

    @routes.post("/finalize")
    async def finalize_by_header(request: Request) -> Response:
        return await _finalize(request, None)

    @routes.get("/v1/models")
    @routes.get("/sess/{session}/v1/models")
    async def models(request: Request) -> dict[str, object]:
        config = http.settings(request)
        names = [config.served_model_name]
        if config.accepted_models != "*":
            names = [m.strip() for m in config.accepted_models.split(",")]
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "owned_by": "titoflow"} for n in names],
        }

    # Claude Code probes its base URL (HEAD /sess/<id>) before connecting; SDKs may GET it.
    @routes.api_route("/sess/{session}", methods=["GET", "HEAD"])
    @routes.api_route("/sess/{session}/v1", methods=["GET", "HEAD"])
    async def base_url(session: str) -> dict[str, str]:
        return {"session_id": session, "status": "ok"}

    return routes
