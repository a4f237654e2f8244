"""Shell command lines built from argument lists: every word quoted unless it is already shell.

rayfleet sends many short command lines over SSH and into Ray's start commands. They are built
here, and only here, from Python values: `argv` quotes each word (shlex), `assign` writes `NAME=value`
words (the name checked, the value quoted), and `all_of`/`first_of` join whole commands with `&&`
and `||`. A word that must stay shell syntax (a `"$HOME"/path` that expands on the node, a `$(...)`
of our own) is marked `Shell`: it is printed as is, so every unquoted spot is a deliberate one.
The same `Shell` marks text that templates print as is (infra/core/render.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

from infra.node.where import home_path

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What `expanding` lets through: plain characters, and `$` only as $NAME, ${NAME}, $((NAME + 12)).
EXPANDABLE = re.compile(r"(?:[^$\\`\"\x00-\x1f\x7f]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\}"
                        r"|\$\(\([A-Za-z_][A-Za-z0-9_]* \+ [0-9]+\)\))*")


class Shell(str):
    """Text that is already shell syntax (quoted, or our own checked words): printed as is."""


def word(value: object) -> Shell:
    """One word: `value` as is when it is already `Shell`, else quoted."""
    return value if isinstance(value, Shell) else Shell(shlex.quote(str(value)))


def quoted(text: object) -> Shell:
    """`text` as one quoted word, even shell text: a whole command handed to `bash -c` or ssh."""
    return Shell(shlex.quote(str(text)))


def argv(*words: object) -> Shell:
    """A simple command from its words, each quoted unless `Shell`."""
    return Shell(" ".join(word(w) for w in words))


def expanding(text: str) -> Shell:
    """Our own text as one double-quoted word whose `$NAME` parts expand on the node (e.g.
    `http://$rf_ip:5000`); refused if anything else in it would (`$(...)`, a backquote, a quote)."""
    if not EXPANDABLE.fullmatch(text):
        raise ValueError(f"{text!r} cannot go inside double quotes (only $NAME, ${{NAME}} and "
                         "$((NAME + N)) may expand there)")
    return Shell(f'"{text}"')


def home(path: str) -> Shell:
    """A path on the node as one word, `~/x` (or `$HOME/x`) kept expanding: `"$HOME"/x`."""
    return Shell(home_path(path.replace("$HOME/", "~/", 1) if path.startswith("$HOME/") else path))


def assign(env: Mapping[str, object]) -> Shell:
    """`NAME=value` words (for `export`, or before a command), each value one quoted word;
    an empty mapping is empty text. A name that is not a shell variable name is refused: it would
    turn the assignment into a command."""
    for name in env:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a shell variable name")
    return Shell(" ".join(f"{name}={word(value)}" for name, value in env.items()))


def export(env: Mapping[str, object]) -> Shell:
    """`export NAME=value ...` (see `assign`)."""
    return Shell(f"export {assign(env)}")


def prefix(env: Mapping[str, object]) -> Shell:
    """`NAME=value ` words that go before a command (see `assign`), with their trailing space."""
    return Shell(f"{assign(env)} " if env else "")


def all_of(*commands: str | None) -> Shell:
    """Commands joined with `&&`: each runs only if all before it succeeded. Empty ones are left
    out; each is shell text (build it with `argv`)."""
    return Shell(" && ".join(c for c in commands if c))


def first_of(*commands: str | None) -> Shell:
    """Commands joined with `||`: the next runs only if the one before failed."""
    return Shell(" || ".join(c for c in commands if c))


def before(command: str) -> Shell:
    """`command && ` as a prefix: what follows runs only if it succeeded (empty stays empty)."""
    return Shell(f"{command} && " if command else "")


def subshell(commands: str) -> Shell:
    """Commands in a subshell (`( ... )`): a umask or `cd` there stays there."""
    return Shell(f"( {commands} )")


def group(commands: str) -> Shell:
    """Commands as one command (`{ ...; }`), e.g. to join them to others with `&&`."""
    return Shell(f"{{ {commands}; }}")


def lines(commands: Iterable[str]) -> Shell:
    """Commands run one after the other whatever each returns (`;`)."""
    return Shell("; ".join(commands))
