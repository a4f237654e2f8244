"""The docs name only files that exist: a file moves, the test fails until the docs follow.

What counts as a repository path, in backticks (`like/this.py`) outside fenced code blocks of
README.md, ARCHITECTURE.md and docs/**/*.md:

- a span without spaces whose first part is a top-level entry of the checkout (`infra/core/ssh.py`,
  `tests/testbed/`, `README.md`, `.ci/run`): it must exist as written;
- a relative tail whose first folder is a folder of the repository (`gcp_tpu/joiner.py`,
  `lambda_cloud/node_provider.py`): some tracked path must end with it;
- a bare file name of code, docs or a template (.py .md .j2), which only the repository has:
  some tracked file must have that name (bare .yaml and .sh names are often files `up` or the
  installer writes, so they are not checked).

Not repository paths, skipped: anything with a placeholder or pattern (`<cluster>`, `NAME`,
`{a,b}`, `*`, `$VAR`), URLs and anything with `:` or `=`, paths on a user's or a node's machine (`~/...`,
absolute `/tmp/...`, `.rayfleet/...` and other runtime folders that are not repository folders,
such as `session_latest/logs/` or Ray's own `ray/dashboard/utils.py`), and spans with spaces
(commands).

A package's docstring (`infra/**/__init__.py`) names modules three ways, each checked: a file name
(`provider.py`) or a backticked identifier that is the name of a module somewhere in infra/
(`joiner`) must be a module of that package (a module on the other side of the wire, in
infra/node/<p>/, is named by its dotted path or file path); a dotted path (`infra.node.files`)
must be a module; a path (`infra/node/__init__.py`) must exist.
"""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]
SUFFIXES = (".py", ".md", ".j2")
_NOT_A_PATH = re.compile(r"[\s<>{}*$:=~'\"()\[\]^|]")
_FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


@cache
def tracked() -> tuple[str, ...]:
    """Every file of the checkout as git sees it (tracked, plus new files not ignored)."""
    done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return tuple(line for line in done.stdout.splitlines() if (ROOT / line).exists())
    # Not a git checkout (an unpacked archive): every file but the virtualenv and caches.
    skip = {".venv", ".git", "site", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".rayfleet"}
    return tuple(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts))


@cache
def folders() -> frozenset[str]:
    """The name of every folder that holds a tracked file."""
    return frozenset(part for path in tracked() for part in Path(path).parts[:-1])


@cache
def top_level() -> frozenset[str]:
    """The first part of every tracked path (asked once per backticked span: ~2 CPU-s uncached)."""
    return frozenset(Path(path).parts[0] for path in tracked())


def problem(span: str) -> str | None:
    """Why `span` names a repository path that does not exist, or None (fine, or not a path)."""
    if _NOT_A_PATH.search(span) or span.startswith(("/", "http", ".rayfleet")):
        return None
    path = span.rstrip("/")
    if any(part.isupper() for part in re.split(r"[/.]", path)):
        return None  # a placeholder: clusters/NAME.yaml
    first = path.split("/")[0]
    if first in top_level():
        return None if (ROOT / path).exists() else "no such file or folder in the repository"
    if "/" in path:
        if first not in folders():
            return None  # a runtime folder (a node's work dir, Ray's session), not ours
        tail = "/" + path
        if any(("/" + p).endswith(tail) or ("/" + p).startswith(tail + "/") for p in tracked()):
            return None
        return "no repository path ends with it"
    if path.endswith(SUFFIXES):
        return None if any(Path(p).name == path for p in tracked()) else "no file of this name"
    return None


def page_problems(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    spans = dict.fromkeys(re.findall(r"`([^`\n]+)`", text))
    return [f"{page.relative_to(ROOT)}: `{span}`: {why}" for span in spans
            if (why := problem(span)) is not None]


def test_rules_tell_paths_from_the_rest() -> None:
    assert problem("infra/core/ssh.py") is None and problem("tests/testbed/") is None
    assert problem("infra/nothing_here.py") is not None
    assert problem("gcp_tpu/joiner.py") is None and problem("gcp_tpu/gone.py") is not None
    assert problem("NOTES.md") is None and problem("gone_module.py") is not None
    assert problem("clusters/NAME.yaml") is None and problem("rayfleet-activate.sh") is None
    for skipped in ("~/.ssh/known_hosts", "/tmp/ray", ".rayfleet/state/<cluster>.json",
                    "clusters/<name>.yaml", "http://127.0.0.1:8265", "session_latest/logs/",
                    "ray/dashboard/utils.py", "invoke up", "setup/envs/environment_{cpu,gpu}.yaml"):
        assert problem(skipped) is None, skipped


def test_docs_name_only_paths_that_exist() -> None:
    found = [line for page in PAGES for line in page_problems(page)]
    assert not found, "the docs name paths that do not exist:\n  " + "\n  ".join(found)


def _modules(package: Path) -> set[str]:
    """The modules and subpackages of a package."""
    return {p.stem for p in package.glob("*.py")} | {p.parent.name for p in package.glob("*/__init__.py")}


def docstring_problems(init: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    where = init.relative_to(ROOT)
    package = init.parent
    modules = _modules(package)
    everywhere = {p.stem for p in (ROOT / "infra").rglob("*.py") if p.stem != "__init__"}
    found: list[str] = []
    for name in dict.fromkeys(re.findall(r"(?<![\w/.<>-])([a-z_][a-z0-9_]*)\.py\b", doc)):
        if name not in modules:
            found.append(f"{where}: {name}.py is not a module of {package.name}")
    for dotted in dict.fromkeys(re.findall(r"\binfra(?:\.[a-z_][a-z0-9_]*)+", doc)):
        base = ROOT.joinpath(*dotted.split("."))
        if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
            found.append(f"{where}: {dotted} is not a module")
    for path in dict.fromkeys(re.findall(r"\b(?:infra|tests|templates|setup)/[\w/.-]*\w", doc)):
        if not (ROOT / path).exists():
            found.append(f"{where}: {path} does not exist")
    for name in dict.fromkeys(re.findall(r"`([a-z_][a-z0-9_]*)`", doc)):
        if name in everywhere and name not in modules:
            found.append(f"{where}: `{name}` is not a module of {package.name}")
    return found


def test_package_docstrings_name_only_modules_that_exist() -> None:
    found = [line for init in sorted((ROOT / "infra").rglob("__init__.py"))
             for line in docstring_problems(init)]
    assert not found, "package docstrings name modules that do not exist:\n  " + "\n  ".join(found)
