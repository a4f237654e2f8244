"""Issue 49, the student's side (defects 8, 9, 10, 15): the member folder's env.sh in bash and
dash, its README, and what its .rayignore lets an upload take."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.cli import sharing as commands_sharing
from infra.core.sharing import member_folder
from tests.classroom_owner import URL, owner_cluster


def _folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    return tmp_path / "class-alice"


def _source(shell: str, folder: Path) -> subprocess.CompletedProcess[str]:
    line = ". ./env.sh; echo \"rc=$?\"; echo \"token=${RAY_AUTH_TOKEN_PATH:-}\"; " \
           "echo \"address=${RAY_ADDRESS:-}|${RAY_API_SERVER_ADDRESS:-}\""
    return subprocess.run([shell, "-c", line], cwd=folder, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(folder)}, timeout=30)


def test_term_record_defect15_env_sh_refuses_dash_in_one_line_and_returns_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dash = shutil.which("dash") or shutil.which("sh")
    assert dash is not None
    done = _source(dash, _folder(tmp_path, monkeypatch))
    assert "rc=1" in done.stdout and "token=\n" in done.stdout, done
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "bash or zsh" in said[0] and "Bad substitution" not in said[0]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_term_record_defect9_env_sh_in_bash_and_zsh_sets_no_ray_address(
        shell: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here")
    folder = _folder(tmp_path, monkeypatch)
    done = _source(shell, folder)
    assert "rc=0" in done.stdout and done.stderr == "", done
    assert f"token={folder / 'ray-token'}" in done.stdout
    # RAY_ADDRESS=https://... would make `python script.py` (ray.init()) fail.
    assert f"address=|{URL}" in done.stdout


def test_term_record_defect9_code_kept_in_the_member_folder_uploads_but_the_token_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's own packer, as `ray job submit --working-dir .` runs it from the member folder."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    folder = _folder(tmp_path, monkeypatch)
    (folder / "train.py").write_text("print('hi')\n")
    taken: list[str] = []
    _dir_travel(folder, [_get_excludes(folder, [])],
                lambda p: taken.append(p.name) if p.is_file() else None, include_gitignore=True)
    assert "train.py" in taken
    assert not {"ray-token", "class-alice.rayfleet.json", "ca.pem", "env.sh"} & set(taken)


def test_term_record_defect9_10_the_readme_tells_the_dashboard_and_where_the_reason_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (_folder(tmp_path, monkeypatch) / member_folder.README_FILE).read_text()
    assert URL in readme and "ray-token" in readme and "ca.pem" in readme
    assert "dashboard" in readme.lower() and "LAST line" in readme and "traceback" in readme


def test_term_record_defect8_the_sign_in_page_names_the_ray_token_file() -> None:
    from infra.node import gateway_browser

    page = gateway_browser.login_page("class", "").text
    assert "<code>ray-token</code>" in page and "<code>token</code> in" not in page
