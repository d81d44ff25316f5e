"""The start-up checks of the commands: what a service would refuse at its start, said before it
starts.

Invariant: each check passes silently or raises :class:`~titoflow.settings.SettingError` naming
the one setting at fault and the fix (the command then ends with that line, exit status 2)."""

from __future__ import annotations

from titoflow.settings import SettingError, Settings


def check_model(settings: Settings, tokenizer_needed: bool) -> None:
    """The policy's tokenizer loads and its chat template is of a model family titoflow knows,
    said before a service starts rather than as its start-up traceback; without
    ``tokenizer_needed`` (the worker) there may be no tokenizer at all."""
    from titoflow.tito.families import resolve_family
    from titoflow.tito.render import template_source
    from titoflow.tito.tokenizer import RemoteCodeRefused, load_tokenizer

    if not tokenizer_needed and not (settings.model_path / "tokenizer_config.json").exists():
        return
    try:
        tokenizer = load_tokenizer(settings.model_path, settings.trust_remote_code)
    except RemoteCodeRefused as exc:
        raise SettingError("TITOFLOW_TRUST_REMOTE_CODE", str(exc)) from None
    except (OSError, ValueError) as exc:
        raise SettingError("TITOFLOW_MODEL_PATH", str(exc)) from None
    try:
        resolve_family(settings.model_family, template_source(tokenizer))
    except ValueError as exc:
        raise SettingError("TITOFLOW_MODEL_FAMILY", str(exc)) from None


def check_broker(settings: Settings) -> None:
    if not settings.bootstrap_servers:
        raise SettingError(
            "TITOFLOW_BOOTSTRAP_SERVERS",
            "empty: set the Kafka broker's host:port (only `titoflow up` starts a broker)",
        )


def engine_urls(settings: Settings) -> list[str]:
    """The URLs of ``engine_url`` and ``engine_urls`` (none: `up` starts an engine, an ingress
    may get its engines by control commands)."""
    from titoflow.engine.pool import parse_engine_specs

    try:
        return [spec.url for spec in parse_engine_specs(settings)]
    except ValueError as exc:
        raise SettingError("TITOFLOW_ENGINE_URLS", str(exc)) from None


def check_hosts(settings: Settings) -> None:
    """The ingress' bind addresses resolve (the ingress itself binds them at start)."""
    import socket

    for plane, host in (("INGRESS", settings.ingress_host), ("DRIVER", settings.driver_host)):
        address = host or settings.ingress_host
        try:
            socket.getaddrinfo(address, None)
        except OSError as exc:
            raise SettingError(
                f"TITOFLOW_{plane}_HOST",
                f"{address!r}: {exc.strerror}: give an address of this machine",
            ) from None


def check_engines(settings: Settings, urls: list[str]) -> None:
    """Each engine URL is one the engine client can call."""
    from titoflow.engine.http1 import Http1Client

    for url in urls:
        try:
            Http1Client(url)
        except ValueError as exc:
            raise SettingError(
                "TITOFLOW_ENGINE_URL" if url == settings.engine_url else "TITOFLOW_ENGINE_URLS",
                f"{exc}: give the engine's base URL, e.g. http://127.0.0.1:8000",
            ) from None
