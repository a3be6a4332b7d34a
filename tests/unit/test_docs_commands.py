"""Every `llm-autopilot` command line the docs show runs, and prints what the page shows after it.

A command is a line `$ llm-autopilot ...` in a `console` block of README.md or docs/; the lines after it, up to
the block's end or the next `$ `, are its output as shown. The shown output must be the start of what the
command prints (stdout then stderr), compared word by word, so a page may wrap long lines and stop early.
Commands that need the Hub are not run offline: the docs use catalog models.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Shown:
    page: str
    line: int
    command: str
    output: str


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        language: str | None = None
        current: tuple[int, str, list[str]] | None = None
        for number, line in enumerate(lines, 1):
            fence = FENCE.match(line)
            if fence:
                if current:
                    found.append(Shown(str(page.relative_to(ROOT)), current[0], current[1], "\n".join(current[2])))
                current = None
                language = None if language is not None else fence.group(2)
                continue
            if language != "console":
                continue
            text = line.strip()
            if text.startswith("$ "):
                if current:
                    found.append(Shown(str(page.relative_to(ROOT)), current[0], current[1], "\n".join(current[2])))
                current = (number, text[2:], []) if text.startswith("$ llm-autopilot ") else None
            elif current:
                current[2].append(line)
    return found


def _words(text: str) -> list[str]:
    return text.split()


def test_the_docs_show_commands() -> None:
    commands = shown_commands()
    assert len(commands) >= 4, commands
    assert all(c.output.strip() for c in commands), "a command shown without its output"


@pytest.mark.parametrize("shown", shown_commands(), ids=lambda s: f"{s.page}:{s.line}")
def test_a_shown_command_runs_and_prints_what_the_page_shows(shown: Shown) -> None:
    argv = shlex.split(shown.command)
    assert not set(argv) & {"|", ">", "&&", ";"}, "a shown command is one command, without a shell"
    executable = Path(sys.executable).with_name("llm-autopilot")
    result = subprocess.run([str(executable), *argv[1:]], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=ROOT)
    assert result.returncode in (0, 1), f"{shown.page}:{shown.line}: `{shown.command}` failed: {result.stderr}"
    printed, expected = _words(result.stdout + result.stderr), _words(shown.output)
    assert printed[:len(expected)] == expected, (
        f"{shown.page}:{shown.line}: `{shown.command}` prints something else than the page shows; it prints:\n"
        f"{result.stdout}{result.stderr}")
