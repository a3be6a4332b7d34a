"""The burn-in's value types: the bounded load a new pod is given before traffic, and what was measured.

desired/burn_in.py decides the load and judges the measurement (pure); controller/burn_in_load.py runs the
load against one pod's own IP and measures (the shell). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

#: the pod condition the readiness gate waits on: Ready (and so the Services' endpoints) only once it is True
BURN_IN_GATE = "llm-autopilot.io/burn-in"
#: a KV cache this full while a request waits holds fewer requests than the load sent: while the cache has
#: room, a request waits only for the prefill budget (chunked prefill), and then the running ones hold less
FULL_KV_USAGE = 0.95


@dataclass(frozen=True)
class BurnInLoad:
    """What one pod is sent: ``requests`` completions at once, each a prompt of ``prompt_tokens`` token ids
    (distinct per request, so prefix caching shares no block) and ``max_tokens`` generated tokens, within
    ``timeout_seconds`` for the whole run."""

    model: str
    port: int
    requests: int
    prompt_tokens: int
    max_tokens: int
    timeout_seconds: float
    #: token ids are drawn below this (the model's vocabulary, capped)
    vocab_size: int = 1000

    @property
    def total_tokens(self) -> int:
        """The most tokens the run can cost (prompts and outputs): the token limit it is bounded by."""
        return self.requests * (self.prompt_tokens + self.max_tokens)

    def prompt(self, index: int) -> list[int]:
        """Request ``index``'s prompt: token ids that differ from the first one on, so no two requests share
        a cached prefix block."""
        span = max(self.vocab_size - 10, 1)
        return [10 + (index * 7919 + position * 31 + (position * position) % 97) % span
                for position in range(self.prompt_tokens)]


@dataclass(frozen=True)
class BurnInMeasurement:
    """What one run of the load measured on one pod (controller/burn_in_load.py)."""

    #: requests answered 200 / sent
    completed: int
    sent: int
    #: requests that failed: HTTP status or connection error, the first one's text (clean, short)
    errors: int = 0
    first_error: str = ""
    #: whether the run hit its time limit before every request was answered
    timed_out: bool = False
    #: vLLM's own counters and gauges on the pod's /metrics, sampled during the run
    preemptions: float = 0.0
    peak_kv_usage: float | None = None
    peak_waiting: float | None = None
    peak_running: float | None = None
    #: samples of /metrics read (0: the gauges above are unknown), and those with the KV cache full
    #: (``FULL_KV_USAGE``) while a request waited
    samples: int = 0
    full_while_waiting: int = 0
    generated_tokens: int = 0
    wall_seconds: float = 0.0
    #: when the run started (wall clock, UTC): a termination of the pod's vLLM after it happened during the run
    started_at: datetime | None = None
