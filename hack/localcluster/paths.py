"""Where the local cluster keeps its cache and state, and how it reports progress."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HACK_DIR = Path(__file__).resolve().parents[1]
ROOT = HACK_DIR.parent


def log(message: str, *, who: str = "cluster") -> None:
    """Print a progress line (to stderr, so `env` output stays clean)."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{who} {stamp}] {message}", file=sys.stderr, flush=True)


def fmt_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


class ClusterError(RuntimeError):
    """A failure worth a one-line message rather than a traceback."""


def cache_root() -> Path:
    env = os.environ.get("LLM_AUTOPILOT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-autopilot"


def state_dir() -> Path:
    env = os.environ.get("LLM_AUTOPILOT_CLUSTER_DIR")
    return Path(env).expanduser() if env else cache_root() / "cluster"
