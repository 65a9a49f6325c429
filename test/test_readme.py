"""What README.md shows a newcomer holds: its commands run as written, its settings are frnccl's."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _code_lines() -> list[str]:
    """The lines of its code blocks: fenced ones and indented ones (the sections after the quick start indent
    theirs, so that the quick start's fenced block is the only one a reader of its fences finds)."""
    blocks = re.findall(r"^```(?:bash|sh)?\n(.*?)^```", README, re.S | re.M)
    indented = [ln[4:] for ln in README.splitlines() if ln.startswith("    ") and ln.strip()]
    lines = [ln.split("#", 1)[0].strip() for block in blocks for ln in block.splitlines()] + \
            [ln.split("#", 1)[0].strip().removeprefix("$ ") for ln in indented]
    return [ln for ln in lines if ln]


def _frnccl() -> list[str]:
    found = shutil.which("frnccl")
    return [found] if found else [sys.executable, "-m", "fr_backend.cli"]


def test_quick_start_is_two_commands():
    section = README.split("## Try it: quick start", 1)[1].split("\n## ", 1)[0]
    commands = [ln for ln in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)[0].splitlines() if ln.strip()]
    assert commands == ["bash scripts/install.sh && frnccl demo",
                        "bash scripts/install.sh --test && python3 -m pytest -q"], commands


@pytest.mark.timeout(300)
def test_every_frnccl_command_shown_exists():
    """Each `frnccl SUB ...` line names a real subcommand; `frnccl SUB --help` answers, and so do the short
    commands that need no job (`frnccl --help`, `frnccl config`)."""
    parts = [part.strip() for ln in _code_lines() for part in ln.split("&&")]
    shown = [shlex.split(part) for part in parts if part.startswith("frnccl ")]
    subcommands = sorted({words[1] for words in shown if len(words) > 1 and not words[1].startswith("-")})
    assert {"analyze", "report", "trace", "export", "dump", "demo"} <= set(subcommands), subcommands
    for args in [["--help"], ["config"], *[[sub, "--help"] for sub in subcommands]]:
        done = subprocess.run(_frnccl() + args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (args, done.stderr)


def test_settings_table_is_frnccl_settings():
    """The README's settings table lists real settings with their real defaults."""
    from fr_backend.config import SETTINGS

    defaults = {s.name: str(s.default) for s in SETTINGS}
    rows = re.findall(r"^\| `(FRNCCL_[A-Z_]+)` \| `([^`]*)` \|", README, re.M)
    assert len(rows) == 6, rows
    for name, default in rows:
        assert name in defaults, name
        assert default == defaults[name] or default in defaults[name], (name, default, defaults[name])
