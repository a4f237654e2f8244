"""`invoke ARGS` and `rayfleet ARGS` as a user runs them, without paying their imports each time.

A fresh `python -m invoke` spends ~0.4 s of CPU importing the CLI (Invoke, pydantic, the spec
models) before it reads its arguments; the quick tier runs the CLI about a hundred times. Here a
zygote, started once per test process, imports the CLI once; each run is a child forked from it
that takes its own argv, environment, working directory and stdin/stdout/stderr (real file
descriptors), runs the module as `python -m` does (runpy, `__main__`) and exits as Python exits
(SystemExit's code, 1 with a traceback for an exception). What the child gets from the zygote is
the state of a fresh interpreter that imported the CLI: nothing in infra/ reads the environment at
import time, and the zygote imports nothing else (not Ray, not Google's client).

Use it where a test asks what the command says and returns; a test about the process itself (what
a command imports, a held tunnel, Ctrl+C, a daemon it leaves, Ray it starts) runs a fresh one
(tests/conftest.py's `run_invoke`). Same signatures and results as those: a CompletedProcess,
TimeoutExpired past `timeout`. tests/test_forked_cli.py holds it to a fresh process's answers.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO

from tests.conftest import ROOT

#: The zygote: imports the CLI, then forks one child per request. The child returns from `serve`
#: and runs the module at top level, so it exits exactly as a `python -m` process would.
ZYGOTE = r"""
import importlib, json, os, runpy, socket, sys
for name in sys.argv[2:]:
    importlib.import_module(name)  # the CLI's own imports, made once

def serve(sock):
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            os._exit(0)  # the test process has gone
        pid = os.fork()
        if pid == 0:
            sock.close()
            return json.loads(message), fds
        for fd in fds:
            os.close(fd)
        sock.sendall(b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        sock.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))

request, fds = serve(socket.socket(fileno=int(sys.argv[1])))
for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
sys.argv = [request["module"], *request["args"]]
del serve, request, fds
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""

#: What the zygote imports: the CLI, every command module and every provider's spec and provider
#: (none of them imports Ray or Google's client at import time), and the libraries every command
#: prints or renders with.
PRELOAD = ["invoke.main", "infra.cli.tasks", "infra.cli.commands", "rich.console", "rich.table",
           "jinja2", *(f"infra.cli.{name}" for name in ("sharing", "check", "listing", "sweep",
                                                         "access", "term", "serve", "metrics")),
           *(f"infra.providers.{provider}.{part}" for provider in ("local", "gcp_tpu",
                                                                   "lambda_cloud", "slurm")
             for part in ("spec", "provider"))]


class _Zygote:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(theirs.fileno()),
                                         *PRELOAD],
                                        pass_fds=[theirs.fileno()], cwd=ROOT, env=dict(os.environ),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        theirs.close()
        self.socket = ours
        self.pending = b""

    def line(self, timeout: float | None) -> int:
        """The zygote's next answer (a child's pid, then its exit code)."""
        self.socket.settimeout(timeout)
        while b"\n" not in self.pending:
            chunk = self.socket.recv(64)
            if not chunk:
                raise RuntimeError(f"the CLI zygote exited ({self.process.wait()}); run the test "
                                   "with tests.conftest.run_invoke (a fresh process) to see why")
            self.pending += chunk
        text, _, self.pending = self.pending.partition(b"\n")
        return int(text)

    def stop(self) -> None:
        self.socket.close()
        self.process.wait(timeout=30)


_zygote: _Zygote | None = None
#: One command at a time per zygote; a second, concurrent one (another thread) runs fresh.
_busy = threading.Lock()


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Path = ROOT, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` forked from the zygote (the environment is this process's updated
    with `env`, as subprocess.run gets it in tests.conftest)."""
    global _zygote
    argv = [sys.executable, "-m", module, *args]
    environment = {**os.environ, **(env or {})}
    if not _busy.acquire(blocking=False):
        return subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True,
                              timeout=timeout, input=input, check=False)
    try:
        if _zygote is None:
            _zygote = _Zygote()
            atexit.register(_zygote.stop)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                tempfile.TemporaryFile() as given:
            given.write((input or "").encode())
            given.seek(0)
            request = json.dumps({"module": module, "args": args, "env": environment,
                                  "cwd": str(cwd)})
            socket.send_fds(_zygote.socket, [request.encode()],
                            [given.fileno() if input is not None else 0, out.fileno(), err.fileno()])
            pid = _zygote.line(30)
            try:
                code = _zygote.line(timeout)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                _zygote.line(30)
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            return subprocess.CompletedProcess(argv, code, _read(out), _read(err))
    finally:
        _busy.release()


def _read(file: IO[bytes]) -> str:
    """The output as subprocess.run(text=True) hands it back (universal newlines)."""
    file.seek(0)
    return file.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def run_invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Path = ROOT, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """`invoke ARGS` (as tests.conftest.run_invoke), forked from the zygote."""
    return run_module("invoke", *args, env=env, timeout=timeout, cwd=cwd, input=input)


def run_rayfleet(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`rayfleet ARGS` (`python -m infra`, as tests.conftest.run_rayfleet), forked from the
    zygote."""
    return run_module("infra", *args, env={"PYTHONPATH": str(ROOT), **(env or {})}, timeout=timeout,
                      cwd=cwd)
