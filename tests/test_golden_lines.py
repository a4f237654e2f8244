"""Rendered files a person reads: no line of any golden file (every template's output, start
commands included) is 200 characters or more, nor any command that starts Ray on a node."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.golden import GOLDEN_DIR

LIMIT = 200


def test_every_golden_line_is_under_200_characters() -> None:
    files = sorted(p for p in GOLDEN_DIR.rglob("*") if p.is_file() and p.suffix != ".py"
                   and "__pycache__" not in p.parts)
    assert len(files) >= 20, files  # the goldens of all four providers are there
    long = [f"{p.relative_to(GOLDEN_DIR)}:{n} is {len(line)} characters"
            for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) >= LIMIT]
    assert long == [], "\n".join(long)


def _start_commands(config: dict[str, Any]) -> list[str]:
    """A Ray cluster YAML's start commands: top level and per node type."""
    scopes = [config, *(config.get("available_node_types") or {}).values()]
    return [str(c) for scope in scopes for key in ("head_start_ray_commands",
                                                   "worker_start_ray_commands")
            for c in scope.get(key) or []]


def _shell_starts(text: str) -> list[str]:
    """A shell golden's commands that start Ray, each as one line (`\\`-continued lines joined):
    those that run setup/users/ray.sh or node.sh, or a Slurm node's start (`rf-node`)."""
    logical = re.sub(r"\\\n\s*", " ", text).splitlines()
    return [line.strip() for line in logical
            if not line.lstrip().startswith("#") and re.search(r"\b(ray|node)\.sh\b|\brf-node\b", line)]


def test_every_start_command_is_one_line_under_200_characters() -> None:
    """Not only each line a golden shows (a long command folds over several): each command that
    starts Ray on a node, whole, is a line a person reads."""
    found: dict[str, list[str]] = {}
    for path in sorted(GOLDEN_DIR.rglob("*")):
        if path.suffix == ".yaml":
            found[path.name] = _start_commands(yaml.safe_load(path.read_text()))
        elif path.suffix in (".sh", ".sbatch"):
            found[path.name] = _shell_starts(path.read_text())
    # Each provider's goldens have some (Slurm's autoscaler YAML starts none: its batch jobs do).
    for kind in ("lambda", "gcp-tpu", "local", "slurm"):
        assert any(found[p.name] for p in (GOLDEN_DIR / kind).iterdir() if p.name in found), kind
    long = [f"{name}: {len(c)} characters, {c.count(chr(10)) + 1} line(s): {c[:80]}..."
            for name, commands in found.items() for c in commands if len(c) >= LIMIT or "\n" in c]
    assert long == [], "\n".join(long)
