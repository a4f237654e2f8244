"""The code base stays ruff clean, mypy clean (infra/) and shellcheck clean (setup/, .ci/)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # a first run (no .mypy_cache) takes ~20 CPU-seconds; run `mypy` before a commit
def test_mypy_clean_on_infra() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian package shellcheck)")
    scripts = [str(p.relative_to(ROOT)) for p in [ROOT / ".ci" / "run", *ROOT.glob("setup/**/*.sh")]]
    result = _run("shellcheck", *scripts)
    assert result.returncode == 0, result.stdout + result.stderr
