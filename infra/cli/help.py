"""Corrections to Invoke's option parsing and help, installed by tasks.py.

Invoke shows a value placeholder only for str and int options (so `--timeout` (float) and `--only`
(a list) looked like switches), shows positional arguments as `-s STRING, --script=STRING`, and
reports a missing value as `Flag <Argument: timeout (t) [float]> needed value`; and `--help`
after a task with several positional arguments is a parse error instead of the task's help.
rayfleet's help must say what to type, and errors name the option and the fix, so these are
adjusted here, in one place.
"""

from __future__ import annotations

from typing import Any

_PLACEHOLDERS = {float: "NUMBER", list: "VALUE"}


def install(optional_positionals: dict[str, set[str]] | None = None) -> None:
    """Patch Invoke's parser once. `optional_positionals` names, per task, positional arguments
    that may be left out (`invoke logs [JOB]`): they are then "" (Invoke knows only required
    ones)."""
    optional = optional_positionals or {}

    from invoke.exceptions import ParseError
    from invoke.parser.context import ParserContext
    from invoke.parser.parser import ParseMachine

    if getattr(ParserContext, "_rayfleet_help", False):
        return
    original_help_for = ParserContext.help_for
    original_complete = ParseMachine.complete_flag
    original_context = ParseMachine.complete_context

    def help_for(self: ParserContext, flag: str) -> tuple[str, str]:
        names, text = original_help_for(self, flag)
        arg = self.flags[flag]
        if arg.positional:
            return arg.name.upper().replace("_", "-"), text
        value = _PLACEHOLDERS.get(arg.kind)
        if value is not None:
            names = ", ".join(f"{n} {value}" if len(n.lstrip("-")) == 1 else f"{n}={value}"
                              for n in names.split(", "))
        return names, text

    def complete_flag(self: Any) -> None:
        flag = self.flag
        try:
            original_complete(self)
        except ParseError:
            if flag is None or not flag.takes_value or flag.raw_value is not None:
                raise
            name = flag.name.replace("_", "-")
            raise ParseError(f"--{name} needs a value, e.g. --{name}="
                             f"{_PLACEHOLDERS.get(flag.kind, 'VALUE')} (see `invoke --help "
                             f"{getattr(self.context, 'name', 'TASK')}`)") from None

    def complete_context(self: Any) -> None:
        # `invoke sync --help` is eaten as sync's first positional argument; fill the others so
        # that the task's wrapper sees the request and shows the help, not a parse error.
        context = self.context
        if context is not None:
            asked_help = any(a.value in ("-h", "--help") for a in context.positional_args)
            for missing in context.missing_positional_args:
                if asked_help or missing.name in optional.get(context.name, set()):
                    missing.set_value("")
        original_context(self)

    ParserContext.help_for = help_for  # type: ignore[method-assign]
    ParseMachine.complete_flag = complete_flag  # type: ignore[method-assign]
    ParseMachine.complete_context = complete_context  # type: ignore[method-assign]
    ParserContext._rayfleet_help = True  # type: ignore[attr-defined]
