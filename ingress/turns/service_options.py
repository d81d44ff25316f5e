"""What the turn logic reads of the settings: limits and the chain matcher (the model family
is the renderer's).

Plain values, fixed for the service's life (``app.py`` builds them from
:class:`~titoflow.settings.Settings`; tests and benchmarks build them directly), so every turn
is judged by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.events import LogprobsMode
from schemas.images import ImageProcessorFingerprint
from titoflow.image_store import ImageStore
from titoflow.tito.image_grid import ImageProcessing
from titoflow.tito.messages import Matcher


@dataclass(frozen=True)
class ServiceOptions:
    max_model_len: int
    default_max_tokens: int
    max_tokens_cap: int = 0  # 0: no cap beyond the context window
    context_policy: Literal["clamp", "refuse"] = "clamp"
    max_steps_per_session: int = 0  # 0: no limit
    matcher: Matcher = "strict"
    vocab_size: int = 1 << 31  # token ids a white-box call may send: [0, vocab_size)
    partial_rollout: bool = True  # False: refuse a step on newer weights than its chain's first
    max_in_flight: int = 0  # generations in flight on this replica; 0: no bound
    retry_after_s: int = 1  # what a call refused for overload is told to wait
    logprobs_mode: LogprobsMode = "raw_logprobs"  # the engines' --logprobs-mode, recorded
    image_processing: ImageProcessing | None = None  # None: the policy reads no images
    # With image_processing: what each recorded image names its processing by (made once, at
    # start), and where its bytes go before its step is published.
    image_fingerprint: ImageProcessorFingerprint | None = None
    image_store: ImageStore | None = None
    max_images: int = 16  # images one request's conversation may hold
    max_image_bytes: int = 16 << 20  # their decoded bytes, all together
    image_url_fetch: bool = True  # False: an image given by http(s) URL is a 400
    image_url_timeout_s: float = 5.0  # one image's fetch, its body included
    image_url_allowed_domains: frozenset[str] = frozenset()  # hosts fetched from; empty: any
    image_url_max_redirects: int = 3  # followed per image URL

    def __post_init__(self) -> None:
        if self.image_processing is not None and (
            self.image_fingerprint is None or self.image_store is None
        ):
            raise ValueError("a policy that reads images needs an image fingerprint and store")
