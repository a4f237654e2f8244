"""PID 1 of a test-bed node: set up the node's private view, start its daemons, reap orphans forever.

Started as `unshare --pid --fork --kill-child --mount-proc [--uts] python3 hostinit.py '<json>'` and run
by path, not imported, so it imports nothing from the package. The JSON holds:

- `hostname`: set in the node's own UTS namespace;
- `setup`: argv lists run in order (mounts), any failure aborts the node;
- `daemons`: [{"argv": [...], "log": path}] started once, in the foreground.

A real init is needed because daemonising programs (Ray, slurmstepd) re-parent their children to
PID 1; without reaping they would linger as zombies that still look alive to `kill -0`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time


def main() -> None:
    spec = json.loads(sys.argv[1])
    socket.sethostname(spec["hostname"])
    for argv in spec.get("setup", []):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"hostinit: {argv} failed: {done.stderr.strip()}")
    daemons: dict[int, list[str]] = {}
    for daemon in spec.get("daemons", []):
        with open(daemon["log"], "ab") as log:
            child = subprocess.Popen(daemon["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        daemons[child.pid] = daemon["argv"]
    print("hostinit: ready", flush=True)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            # No child right now; processes entered later via nsenter may still be re-parented to us.
            time.sleep(0.5)
            continue
        if pid in daemons:
            print(f"hostinit: {daemons.pop(pid)[0]} exited with status {status}", flush=True)


if __name__ == "__main__":
    main()
