"""`invoke check`: which providers this machine can use, and the fix for each missing piece.

Each provider is judged with its default spec (`clusters/<provider>.yaml`), which says where its
account, project or login host is; providers are asked in parallel, each with a time limit, and a
provider that does not answer is a row saying so.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict

from infra import providers
from infra.cli import loading
from infra.core import ui
from infra.core.errors import RayfleetError
from infra.providers.base import Readiness

#: Tools that `ssh`, `exec`, `sync` and the remote providers' tunnels run on this machine.
_SSH_TOOLS = (("ssh client", "ssh", "apt-get install openssh-client"),
              ("rsync", "rsync", "apt-get install rsync (also needed on the head for `sync`)"))


def provider_readiness(name: str) -> list[Readiness]:
    """Everything `invoke check` reports for one provider; never raises."""
    try:
        selected = loading.resolve(name, None)
        impl = providers.create(selected)
    except RayfleetError as exc:
        return [Readiness.failed("spec", exc, f"fix clusters/{name}.yaml")]
    try:
        rows = list(impl.readiness())
    except Exception as exc:  # any failure of one provider is its row, never the whole table's
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        rows = [Readiness("provider", False, message[:200], "see the message")]
    if impl.capabilities.ssh:
        for what, tool, fix in _SSH_TOOLS:
            found = shutil.which(tool)
            rows.append(Readiness(what, found is not None, found or "not installed",
                                  "" if found else fix))
    return rows


def run(as_json: bool, timeout: float) -> int:
    names = providers.names()
    results: dict[str, list[Readiness]] = {}
    pool = ThreadPoolExecutor(max_workers=len(names))
    futures = {name: pool.submit(provider_readiness, name) for name in names}
    for name, future in futures.items():
        try:
            results[name] = future.result(timeout=timeout)
        except FutureTimeout:
            results[name] = [Readiness("answer", False, f"no answer within {timeout:g}s",
                                       "check this machine's network; retry with --timeout")]
    pool.shutdown(wait=False, cancel_futures=True)
    usable = {name: all(r.ok for r in rows) for name, rows in results.items()}
    if as_json:
        ui.out(json.dumps([{"provider": name, "usable": usable[name],
                            "checks": [asdict(r) for r in rows]}
                           for name, rows in results.items()], indent=2),
               soft_wrap=True, markup=False)
        return 0
    from rich.table import Table

    # The fixes (commands to copy, often longer than a terminal is wide) are lines under the table,
    # which the terminal wraps and nothing cuts; table cells fold rather than end in "…".
    table = Table(title="what this machine can use")
    for column in ("provider", "check", "", "found", "fix"):
        table.add_column(column, overflow="fold")
    fixes: list[str] = []
    for name, rows in results.items():
        for i, row in enumerate(rows):
            label = (f"{name} ({'ready' if usable[name] else 'NOT ready'})" if i == 0 else "")
            mark = ""
            if row.fix:
                fixes.append(f"[{len(fixes) + 1}] {name}, {row.what}: {row.fix}")
                mark = f"see [{len(fixes)}]"
            table.add_row(label, row.what, "ok" if row.ok else "MISSING", row.detail, mark)
    ui.out(table)
    if fixes:
        ui.out("how to fix:\n" + "\n".join(f"  {line}" for line in fixes), markup=False,
               soft_wrap=True)
    ready = [name for name in names if usable[name]]
    ui.info(f"ready: {', '.join(ready) or 'none'}")
    return 0
