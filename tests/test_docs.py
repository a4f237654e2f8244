"""The docs cannot drift: the README's quickstart and the local provider page's commands run exactly
as printed and their printed output must match; the site builds with `mkdocs build --strict`; the
spec reference is what the models generate; CI runs the README's test command.

Documented output is matched line by line, in order: a line `...` skips any number of lines, `[…]`
inside a line stands for any text, and numbers and job ids may differ (ports, times, ids).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
LOCAL_PAGE = ROOT / "docs" / "providers" / "local.md"
JOB_ID = re.compile(r"raysubmit_[A-Za-z0-9]+")


def console_blocks(path: Path) -> list[list[tuple[str, list[str]]]]:
    """Every ```console block of a page as [(command, documented output lines)]."""
    blocks = re.findall(r"^```console\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    parsed = []
    for block in blocks:
        steps: list[tuple[str, list[str]]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                assert steps, f"{path.name}: output before the first command: {line!r}"
                steps[-1][1].append(line)
        parsed.append(steps)
    return parsed


def _normal(line: str) -> str:
    line = JOB_ID.sub("raysubmit_ID", line)
    line = re.sub(r"\d+", "0", line)
    return " ".join(line.split())


def _pattern(documented: str) -> re.Pattern[str]:
    parts = [re.escape(_normal(part)) for part in documented.split("[…]")]
    return re.compile(r".*".join(parts))


def mismatch(documented: list[str], actual: str) -> str | None:
    """None if `actual` shows the documented lines (see the module's docstring), else why not."""
    lines = [_normal(line) for line in actual.splitlines()]
    at, skipping = 0, False
    for want in documented:
        if want.strip() == "...":
            skipping = True
            continue
        pattern = _pattern(want)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            if not skipping:
                return f"expected {want!r}, got {lines[at]!r}"
            at += 1
        if at == len(lines):
            return f"documented line not in the output: {want!r}"
        at, skipping = at + 1, False
    if not skipping and at < len(lines):
        return f"undocumented output after the last documented line: {lines[at]!r}"
    return None


def test_mismatch_rules() -> None:
    out = "header\ncluster 'a' is up\n  port 25\nlast"
    assert mismatch(["...", "cluster 'a' is up", "  port 31", "..."], out) is None
    assert mismatch(["...", "cluster 'b' is up", "..."], out) is not None
    assert mismatch(["cluster 'a' is up", "..."], out) is not None  # no skip before it
    assert mismatch(["...", "last"], out) is None
    assert mismatch(["...", "  port 25"], out) is not None  # output after it
    assert mismatch(["...", "port […]", "..."], out) is None
    assert mismatch(["job raysubmit_abc done"], "job raysubmit_XyZ9 done") is None


def _run(command: str, env: dict[str, str], job: str | None) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "invoke", f"only invoke commands run here: {command!r}"
    if job:
        # The reader copies the id `submit` printed; so does the test.
        argv = [JOB_ID.sub(job, arg) for arg in argv]
    # One stream, in the order a terminal shows it (progress goes to stderr, results to stdout).
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)


def _walk(page: Path, steps: list[tuple[str, list[str]]], env: dict[str, str],
          job: str | None) -> str | None:
    for command, documented in steps:
        done = _run(command, env, job)
        output = done.stdout
        assert done.returncode == 0, f"{page.name}: `{command}` exited {done.returncode}:\n{output}"
        why = mismatch(documented, output)
        assert why is None, f"{page.name}: `{command}`: {why}\n--- its output:\n{output}"
        submitted = re.search(r"job (raysubmit_[A-Za-z0-9]+) submitted", output)
        job = submitted.group(1) if submitted else job
    return job


@pytest.mark.slow
def test_readme_quickstart_and_local_page(tmp_path: Path) -> None:
    """One cluster: the README's quickstart up to its teardown, the local page's commands on that
    cluster, then the README's teardown; afterwards nothing of the cluster is left."""
    readme = console_blocks(README)
    assert len(readme) == 1, "the README has one console block: the quickstart"
    quickstart = readme[0]
    commands = [c for c, _ in quickstart]
    for needed in ("invoke up", "invoke submit", "invoke status", "invoke logs", "invoke teardown"):
        assert any(c.startswith(needed) for c in commands), f"the quickstart lacks `{needed}`"
    assert commands[-1] == "invoke teardown"
    local = [step for block in console_blocks(LOCAL_PAGE) for step in block]
    assert local, "docs/providers/local.md has console blocks"
    env = {**os.environ, "RAYFLEET_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    try:
        job = _walk(README, quickstart[:-1], env, None)
        _walk(LOCAL_PAGE, local, env, job)
        _walk(README, quickstart[-1:], env, job)
    finally:
        _run("invoke teardown", env, None)
    assert not list((tmp_path / "home" / "state").glob("*.json"))


def test_ci_runs_the_readme_test_command() -> None:
    """README's contributing section gives the quick tier's command first, then `bash .ci/run`
    for everything; .ci/run runs that same command without the tier's `-m "not slow"`."""
    section = README.read_text().split("## Contributing", 1)[1].split("\n## ", 1)[0]
    blocks = [block.strip() for block in re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)]
    assert len(blocks) >= 2, "README's contributing section shows the quick and the whole command"
    quick, whole = blocks[:2]
    assert quick.endswith(' -m "not slow"'), f"the first command is the quick tier: {quick!r}"
    assert re.fullmatch(r"(sudo )?bash \.ci/run", whole), f"the second runs .ci/run: {whole!r}"
    run = (ROOT / ".ci" / "run").read_text()
    full = quick.removesuffix(' -m "not slow"')
    assert full in run.splitlines(), f".ci/run must run {full!r}, the quick command without -m"


def test_spec_reference_is_generated_from_the_models() -> None:
    done = subprocess.run([sys.executable, "tools/spec_reference.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """Broken links, missing pages and bad anchors are build errors."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is missing: pip install -e '.[dev]'")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_provider_pages_have_one_shape() -> None:
    """One page per provider, each with the same sections in the same order."""
    from infra import providers

    pages = {name: ROOT / "docs" / "providers" / f"{name}.md" for name in providers.names()}
    missing = [name for name, page in pages.items() if not page.exists()]
    assert not missing, f"no page in docs/providers/ for {missing}"
    shapes = {name: re.findall(r"^## (.+)$", page.read_text(), flags=re.M)
              for name, page in pages.items()}
    local = shapes["local"]
    assert local[:3] == ["What it needs", "Quick start", "Spec fields"], local
    for name, sections in shapes.items():
        assert sections == local, f"docs/providers/{name}.md: sections {sections}, local.md has {local}"
