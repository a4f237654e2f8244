"""What `submit` uploads: the script's project (git root, else its folder) or --working-dir, without
what git (or the folder's .gitignore) ignores; and the `rayfleet` command from any directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.core import jobs
from infra.core.errors import UsageError


def _git_project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "train.py").write_text("print('hi')\n")
    (root / ".gitignore").write_text("*.ckpt\ncache/\n")
    (root / "src" / ".gitignore").write_text("local.cfg\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".git" / "info" / "exclude").write_text("scratch*\n")
    for name in ("model.ckpt", "src/local.cfg", "scratch [1].txt", "cache/a.bin", "keep.txt"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    return root


def test_a_script_in_a_git_repository_ships_its_root_without_ignored_files(tmp_path: Path) -> None:
    root = _git_project(tmp_path / "proj")
    command, env = jobs.prepare(str(root / "src" / "train.py"), ["--lr", "0.1"], None)
    assert command == "python src/train.py --lr 0.1"
    assert env["working_dir"] == str(root.resolve())
    ignored = set(env["excludes"]) - set(jobs.ALWAYS_EXCLUDED)
    # Exact paths (wildcards escaped), folders as one entry, .git/info/exclude honoured too.
    assert ignored == {"/model.ckpt", "/src/local.cfg", "/scratch \\[1\\].txt", "/cache/"}


def test_the_excludes_leave_out_exactly_the_ignored_files(tmp_path: Path) -> None:
    from pathspec import PathSpec  # what Ray reads `excludes` with

    root = _git_project(tmp_path / "proj")
    _, env = jobs.prepare(str(root / "src" / "train.py"), [], None)
    spec = PathSpec.from_lines("gitwildmatch", env["excludes"])
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
             and ".git/" not in p.relative_to(root).as_posix() + "/"}
    shipped = {f for f in files if not spec.match_file(f)}
    assert shipped == {".gitignore", "src/.gitignore", "src/train.py", "keep.txt"}


def test_a_script_outside_any_repository_ships_its_folder_with_its_gitignore(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "run.py").write_text("print(1)\n")
    (folder / ".gitignore").write_text("# comment\n\nout/\n")
    command, env = jobs.prepare(str(folder / "run.py"), [], None)
    assert command == "python run.py" and env["working_dir"] == str(folder.resolve())
    assert "out/" in env["excludes"] and "# comment" not in env["excludes"]


def test_working_dir_chooses_the_upload_and_must_hold_the_script(tmp_path: Path) -> None:
    root = _git_project(tmp_path / "proj")
    command, env = jobs.prepare(str(root / "src" / "train.py"), [], None, str(root / "src"))
    assert command == "python train.py" and env["working_dir"] == str((root / "src").resolve())
    with pytest.raises(UsageError, match="--working-dir"):
        jobs.prepare(str(root / "src" / "train.py"), [], None, str(tmp_path / "elsewhere"))
    (tmp_path / "other").mkdir()
    with pytest.raises(UsageError, match=r"SCRIPT .*must be inside .*--working-dir"):
        jobs.prepare(str(root / "src" / "train.py"), [], None, str(tmp_path / "other"))


def _rayfleet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("rayfleet")
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_rayfleet_lists_every_task_from_any_directory(tmp_path: Path) -> None:
    from tests.conftest import run_invoke

    listed = _rayfleet("--list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    in_checkout = run_invoke("--list")
    assert in_checkout.returncode == 0, in_checkout.stderr
    # The same tasks as `invoke` in the checkout (the first line names the program).
    assert listed.stdout.splitlines()[1:] == in_checkout.stdout.splitlines()[1:]
    assert "submit" in listed.stdout and "teardown" in listed.stdout


def test_rayfleet_task_help_and_spec_errors_from_any_directory(tmp_path: Path) -> None:
    # The command's answers, from a fork of a process that imported the CLI (tests/forked_cli.py),
    # run in another directory; the installed script itself starts above (and test_forked_cli.py).
    from tests.forked_cli import run_rayfleet

    helped = run_rayfleet("submit", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: rayfleet [--core-opts] submit" in helped.stdout and "--working-dir" in helped.stdout
    missing = run_rayfleet("plan", "--cluster", "no-such-spec.yaml", cwd=tmp_path)
    assert missing.returncode != 0 and missing.stderr.startswith("error:")
    assert "Traceback" not in missing.stderr
    # A spec by name comes from the checkout's clusters/, whatever the current directory.
    planned = run_rayfleet("plan", "--cluster", "local", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
