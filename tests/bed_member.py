"""A member of a shared cluster on a test-bed host (tests/testbed): a home and variables of their
own, the stock `ray job` CLI, rayfleet's `invoke`, and the gateway's HTTP status for their token.
`join` is what a member does with a bundle: `invoke join`, then `invoke env`'s export lines.
For the remote providers' end-to-end sharing modules (a member on another host than the owner)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import ROOT


@dataclass
class Member:
    name: str
    home: Path
    #: The bed host the member works on (anything with `run(command, env=, cwd=, timeout=)`).
    host: Any
    env: dict[str, str] = field(default_factory=dict)

    def sh(self, command: str, timeout: float = 300) -> Any:
        """A shell line on the member's host, in their home, with only their variables."""
        return self.host.run(command, env=self.env, cwd=str(self.home), timeout=timeout)

    def invoke(self, *args: str, timeout: float = 300) -> Any:
        return self.sh(shlex.join([sys.executable, "-m", "invoke", "-r", str(ROOT), *args]),
                       timeout=timeout)

    def ray(self, *args: str, timeout: float = 300) -> Any:
        return self.sh(shlex.join(["ray", "job", *args]), timeout=timeout)

    def said(self, *args: str) -> str:
        """What `ray job ARGS` printed (Ray's CLI logs its answers on stderr)."""
        done = self.ray(*args)
        return str(done.stdout + done.stderr)

    def fetch(self, path: str = "/api/jobs/") -> tuple[str, str]:
        """(the gateway's HTTP status, the body) of a GET with this member's token (curl, the CA
        pinned): a cheap probe where Ray's CLI would take seconds to start."""
        out = self.sh('curl -s -w "\\n%{http_code}" --max-time 5 '
                      '--cacert "$REQUESTS_CA_BUNDLE" '
                      '-H "Authorization: Bearer $(cat "$RAY_AUTH_TOKEN_PATH")" '
                      f'"$RAY_API_SERVER_ADDRESS{path}"', timeout=30).stdout
        body, _, code = out.rpartition("\n")
        return code.strip(), body

    def status_code(self, path: str = "/api/jobs/") -> str:
        return self.fetch(path)[0]


def join(member: Member, bundle: Path, cluster: str) -> Member:
    """`invoke join BUNDLE` in the member's home, then their environment from `invoke env`."""
    joined = member.invoke("join", str(bundle))
    assert joined.returncode == 0, joined.stdout + joined.stderr
    printed = member.invoke("env", "--cluster", cluster)
    assert printed.returncode == 0 and printed.stdout.startswith("export "), printed.stderr
    member.env.update(item.split("=", 1) for item in
                      printed.stdout.strip().removeprefix("export ").split())
    return member
