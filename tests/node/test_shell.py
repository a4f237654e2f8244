"""infra/node/shell.py: command lines from argument lists. Each hostile value must reach the
program as exactly the one argument (or the one variable's value) it was, run by a real bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.node import shell

HOSTILE = ["two words", "it's", 'say "hi"', "$(touch {marker})", "`touch {marker}`",
           "a; touch {marker}", "line\ntouch {marker}", "$HOME", "~", "*", "-n", "", "\\", "#x",
           "a'b\"c\\$d", "ünï", "}; touch {marker}; {"]


def _bash(command: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30,
                          check=False, cwd=home, env={"PATH": "/usr/bin:/bin", "HOME": str(home)})


def _values(marker: Path) -> list[str]:
    return [v.replace("{marker}", str(marker)) for v in HOSTILE]


def test_argv_hands_each_word_over_whole(tmp_path: Path) -> None:
    marker = tmp_path / "INJECTED"
    values = _values(marker)
    done = _bash(shell.argv("printf", "%s\\0", *values), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\0")[:-1] == values
    assert not marker.exists()


def test_assignments_and_exports_keep_values_as_they_were(tmp_path: Path) -> None:
    marker = tmp_path / "INJECTED"
    values = _values(marker)
    env = {f"V{i}": v for i, v in enumerate(values)}
    show = shell.argv("printf", "%s\\0", *(shell.Shell(f'"${name}"') for name in env))
    exported = _bash(shell.all_of(shell.export(env), show), tmp_path)
    prefixed = _bash(shell.prefix(env) + shell.argv("env", "-0"), tmp_path)
    assert exported.stdout.split("\0")[:-1] == values
    seen = dict(line.split("=", 1) for line in prefixed.stdout.split("\0")[:-1])
    assert {k: seen[k] for k in env} == env
    assert not marker.exists()


@pytest.mark.parametrize("name", ["A B", "A;touch x", "1A", "A=B", "$(touch x)", ""])
def test_a_name_that_is_no_variable_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a shell variable name"):
        shell.assign({name: "v"})


def test_home_keeps_expanding_and_the_rest_stays_a_value(tmp_path: Path) -> None:
    marker = tmp_path / "INJECTED"
    for path in ("~/a b/$(touch {marker})", "$HOME/x'y"):
        done = _bash(shell.argv("printf", "%s", shell.home(path.replace("{marker}", str(marker)))),
                     tmp_path)
        rest = path.split("/", 1)[1].replace("{marker}", str(marker))
        assert done.stdout == f"{tmp_path}/{rest}"
    assert not marker.exists()


def test_joins_run_as_their_names_say(tmp_path: Path) -> None:
    run = lambda command: _bash(command, tmp_path).stdout  # noqa: E731
    assert run(shell.all_of("echo a", None, "", "false", "echo b")) == "a\n"
    assert run(shell.first_of("false", "echo b", "echo c")) == "b\n"
    assert run(shell.before("true") + "echo after") == "after\n"
    assert run(shell.before("") + "echo alone") == "alone\n"
    assert run(shell.lines(["false", "echo still"])) == "still\n"
    assert run(shell.all_of(shell.subshell("cd / && true"), "pwd")) == f"{tmp_path}\n"
    assert run(shell.all_of(shell.group(shell.first_of("false", "true")), "echo g")) == "g\n"
    # A whole command as one word (bash -c, ssh): quoted even though it is shell text.
    marker = tmp_path / "INJECTED"
    inner = shell.argv("printf", "%s", f"$(touch {marker}) it's")
    assert run(shell.argv("bash", "-c", shell.quoted(inner))) == f"$(touch {marker}) it's"
    assert not marker.exists()


def test_expanding_lets_variables_expand_and_nothing_else(tmp_path: Path) -> None:
    done = _bash(shell.all_of("rf_ip=10.0.0.5", shell.argv(
        "printf", "%s", shell.expanding("http://$rf_ip:5000/${rf_ip} x"))), tmp_path)
    assert done.stdout == "http://10.0.0.5:5000/10.0.0.5 x"
    for bad in ("$(touch x)", "`touch x`", 'a" ; touch x; "', "a\\", "a\nb"):
        with pytest.raises(ValueError, match="cannot go inside double quotes"):
            shell.expanding(bad)
