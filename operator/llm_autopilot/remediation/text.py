"""Untrusted text (container logs, termination messages) made safe to store in a status. Pure.

A log line can carry terminal escapes, bidi overrides and secrets; whoever can read an LLMDeployment
must see none of them. Lines are kept as vLLM wrote them otherwise, so the evidence stays recognisable.
"""

from __future__ import annotations

import re

#: ESC sequences: CSI (colours, cursor), OSC (window titles, hyperlinks; ended by BEL or ST), DCS/SOS/PM/APC,
#: and two-character escapes
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[ -~])")
#: C0 and C1 controls (tab and newline become spaces first), DEL, bidi controls and invisible separators
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_SECRETS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{4,}"), "hf_[redacted]"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{4,}"), "sk-[redacted]"),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]+"), "Bearer [redacted]"),
)
_SPACES = re.compile(r"[ \t\r\n\f\v]+")
#: what a stored excerpt may hold (the status history caps every evidence value at 500)
EXCERPT_LIMIT = 400


def redact(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def clean_line(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """One line of untrusted text: no escapes or control characters, secrets redacted, at most ``limit``."""
    text = _ESCAPES.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _INVISIBLE.sub("", text).strip()
    text = redact(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _lines(text: str) -> list[str]:
    # log lines end at newlines only (a CR inside a line is a progress bar's, not a line break)
    return text.split("\n")


def last_line_with(text: str, *needles: str) -> str | None:
    """The last line that holds any of ``needles`` (as written: not cleaned)."""
    for line in reversed(_lines(text)):
        if any(needle in line for needle in needles):
            return line
    return None


def last_nonempty_line(text: str) -> str:
    for line in reversed(_lines(text)):
        if line.strip():
            return line
    return ""
