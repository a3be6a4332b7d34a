"""Validation errors as one line that names each field the way kubectl does (``spec.vllm.env[2].name``)."""

from __future__ import annotations

import re

from pydantic import ValidationError

#: The names pydantic gives union members and wrapped validators in an error's location: not fields.
_TYPE_TAG = re.compile(r"^(int|str|float|bool|none|[a-z-]+\[.*\]|constrained-\w+|function-\w+.*)$")


def field_path(loc: tuple[int | str, ...], root: str = "spec") -> str:
    path = root
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]" or _TYPE_TAG.match(part):
            continue
        else:
            path += f".{part}"
    return path


def validation_message(exc: ValidationError, root: str = "spec") -> str:
    """Every problem once, ``path: message``, joined with "; "."""
    seen: dict[str, None] = {}
    for err in exc.errors():
        seen.setdefault(f"{field_path(err['loc'], root)}: {err['msg']}")
    return "; ".join(seen)
