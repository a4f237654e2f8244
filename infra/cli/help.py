"""rayfleet's command line: Invoke's `Program`, with help that says what to type, built through
Invoke's public API only (a `Program` subclass overriding its documented `parse_tasks` and
`print_task_help`; the parser's contexts and arguments read, never patched).

What it adds to Invoke's own:

- a value placeholder for number and list options (Invoke shows one for str and int only, so
  `--timeout` (float) and `--only` (a list) looked like switches); positional arguments shown as
  their NAME, not as `-s STRING, --script=STRING`;
- a missing value is one line naming the option and the fix, not `Flag <Argument: timeout (t)
  [float]> needed value`;
- `TASK --help` is the task's help whatever positional arguments it takes (Invoke eats `--help`
  as the first positional, then fails on the others);
- positional arguments that may be left out (`rayfleet logs [JOB]`; Invoke knows only required
  ones), then "".

This is the `rayfleet` command (and `python -m infra`). `invoke` in a checkout is Invoke's own
program, which a tasks.py cannot replace: there help is Invoke's (`invoke --help TASK` works),
and every positional argument must be given.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from invoke import Program
from invoke.exceptions import ParseError
from invoke.parser import Argument, ParserContext

_PLACEHOLDERS = {float: "NUMBER", list: "VALUE", str: "STRING", int: "INT"}
_HELP = ("-h", "--help")


def placeholder(arg: Argument) -> str:
    """What an option's value looks like in help and errors."""
    return _PLACEHOLDERS.get(arg.kind, "VALUE")


def option_names(arg: Argument) -> str:
    """`-t NUMBER, --timeout=NUMBER` for a value, `--[no-]wait` for a switch that defaults on,
    `SCRIPT` for a positional argument."""
    if arg.positional:
        return str(arg.name).upper().replace("_", "-")
    flags = sorted((("-" if len(n) == 1 else "--") + n.replace("_", "-") for n in arg.names),
                   key=len)
    if not arg.takes_value:
        if arg.kind is bool and arg.default is True:
            return ", ".join(f"--[no-]{f[2:]}" if f.startswith("--") else f for f in flags)
        return ", ".join(flags)
    value = placeholder(arg)
    return ", ".join(f"{f} {value}" if len(f) == 2 else f"{f}={value}" for f in flags)


class RayfleetProgram(Program):
    """Invoke's Program, with the help and errors above. `optional_positionals` names, per
    task, positional arguments that may be left out."""

    def __init__(self, *, optional_positionals: Mapping[str, set[str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.optional_positionals = dict(optional_positionals or {})

    def parse_tasks(self) -> None:
        argv = list(self.core.unparsed)
        if argv and argv[0] in self.collection.task_names and any(a in _HELP for a in argv[1:]):
            # `TASK ... --help`: Invoke's own `--help TASK`, before any positional eats it.
            self.core.unparsed = []
            super().parse_tasks()
            self.args.help.value = argv[0]
            return
        for _ in range(len(self.optional_positionals.get(argv[0], ())) if argv else 0):
            try:
                super().parse_tasks()
                return
            except ParseError as error:
                context = self.parser.contexts.get(argv[0])
                missing = {a.name for a in context.missing_positional_args} if context else set()
                if not missing or not missing <= self.optional_positionals[argv[0]]:
                    raise self._explained(error, argv) from None
                # The left-out ones are "" (the task takes that as "not given").
                self.core.unparsed = [*self.core.unparsed, ""]
        try:
            super().parse_tasks()
        except ParseError as error:
            raise self._explained(error, argv) from None

    def _explained(self, error: ParseError, argv: list[str]) -> ParseError:
        """`error`, or for an option given last without its value, one line naming it."""
        context = error.context
        flag = context.flags.get(argv[-1]) if context is not None and argv else None
        if context is None or flag is None or not flag.takes_value:
            return error
        name = flag.name.replace("_", "-")
        return ParseError(f"--{name} needs a value, e.g. --{name}={placeholder(flag)} (see "
                          f"`{self.binary} --help {context.name}`)", context)

    def print_task_help(self, name: str) -> None:
        """Invoke's per-task help, with `option_names` for each option."""
        context: ParserContext = self.parser.contexts[name]
        print(f"Usage: {self.binary} [--core-opts] {name} [--options] [other tasks here ...]")
        print("")
        print("Docstring:")
        docstring = inspect.getdoc(self.collection[name])
        for line in (docstring or "none").splitlines():
            print(self.leading_indent + line if line.strip() else "")
        print("")
        print("Options:")
        # Invoke's own order (help_tuples), each row renamed from its argument.
        rows = [(option_names(self._argument(context, names)), text)
                for names, text in context.help_tuples()]
        if rows:
            self.print_columns(rows)
        else:
            print(self.leading_indent + "none")
            print("")

    @staticmethod
    def _argument(context: ParserContext, names: str) -> Argument:
        """The argument behind one of Invoke's help rows (`-t, --timeout`, `--[no-]wait`)."""
        first = names.split(", ")[-1].split("=")[0].split(" ")[0].replace("[no-]", "")
        return context.flags[first]
