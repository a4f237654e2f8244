"""The node package (infra/node/): what runs on a cluster's nodes imports only the standard
library, Ray (with what Ray itself imports, e.g. filelock), requests and the package itself, and
it reaches a head whole, as the zip `infra.core.shipping` builds.

Each module is imported in a fresh interpreter (a fork of one that has imported only the standard
library: ZYGOTE) from that zip alone (the checkout off the path), under an import hook that
refuses any other module our code asks for; that one rule replaces the per-provider lists of
banned modules. GCP's modules call Google's client at run time (the GCP node
installer puts it on the head); they import it inside those calls, so importing them needs none.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import shipping
from tests.conftest import ROOT
from tests.import_graph import modules

NODE_MODULES = sorted(m for m in modules() if m.startswith("infra.node"))

#: Top-level modules the node package may import itself (besides the standard library). psutil and
#: filelock come with Ray (psutil in ray/thirdparty_files, which infra.node.rayproc finds without
#: importing Ray), and so does PyYAML (one of Ray's own requirements); urllib3 comes with requests.
ALLOWED = ("ray", "requests", "filelock", "psutil", "urllib3", "yaml")

# Runs first in the child: a meta-path hook that refuses what our code (a module named infra...)
# imports beyond the rule, and any module of rayfleet outside the node package, whoever asks.
PROBE = """
import importlib, sys
ALLOWED = set(sys.argv[2].split(","))
STDLIB = set(sys.stdlib_module_names)

def importer():
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != "__main__":
            return name
        frame = frame.f_back
    return "__main__"

class Rule:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top == "infra":
            if name != "infra" and not name.startswith("infra.node"):
                raise ImportError(f"the node package imports {name}, outside itself")
            return None
        who = importer()
        if (who == "__main__" or who.startswith("infra")) and top not in STDLIB | ALLOWED:
            raise ImportError(f"{who} imports {name}: not the standard library, {sorted(ALLOWED)}")
        return None

sys.meta_path.insert(0, Rule())
module = importlib.import_module(sys.argv[1])
print(module.__file__)
"""


#: A fresh interpreter as the node's (the zip alone on its path, the checkout off it) that forks
#: one child per module named on its stdin; each child runs PROBE as `python -c PROBE MODULE` would
#: and reports its exit code. A fork of an interpreter that has imported only the standard library
#: is a fresh interpreter for PROBE's rule (it refuses imports beyond the standard library), and
#: spares each module an interpreter's start and the test process's fork: ~4 CPU-s of this module.
ZYGOTE = """
import json, os, sys, traceback
probe = sys.argv[1]
for line in sys.stdin:
    module, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        for target, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), target)
        sys.argv = ["-c", module, sys.argv[2]]
        code = 0
        try:
            exec(compile(probe, "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def node_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("head") / shipping.zip_name()
    path.write_bytes(shipping.node_zip())
    return path


@pytest.fixture(scope="module")
def zygote(node_zip: Path) -> Iterator[subprocess.Popen[str]]:
    started = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, PROBE, ",".join(ALLOWED)], cwd=node_zip.parent,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(node_zip), "RAY_USAGE_STATS_ENABLED": "0"})
    yield started
    assert started.stdin is not None
    started.stdin.close()
    started.wait(timeout=30)


def test_the_zip_holds_the_whole_package(node_zip: Path) -> None:
    names = set(zipfile.ZipFile(node_zip).namelist())
    expected = {str(path.relative_to(ROOT)) for name, path in modules().items()
                if name.startswith("infra.node")} | {"infra/__init__.py"}
    assert names == expected
    assert len(NODE_MODULES) > 20
    # Deterministic: the same sources give the same bytes, and so the same name on the head.
    shipping.node_zip.cache_clear()
    assert shipping.node_zip() == node_zip.read_bytes()


@pytest.mark.parametrize("module", NODE_MODULES)
def test_imports_from_the_zip_with_stdlib_ray_and_requests_only(
        node_zip: Path, zygote: subprocess.Popen[str], module: str, tmp_path: Path) -> None:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    assert zygote.stdin is not None and zygote.stdout is not None
    zygote.stdin.write(json.dumps([module, str(out), str(err)]) + "\n")
    zygote.stdin.flush()
    answer = zygote.stdout.readline()
    assert answer, f"the probe's zygote ended (exit {zygote.poll()})"
    returncode = int(answer)
    assert returncode == 0, err.read_text()[-1500:]
    assert out.read_text().strip().startswith(str(node_zip)), out.read_text()  # from the zip


def test_the_rule_refuses_what_it_must(node_zip: Path, tmp_path: Path) -> None:
    # The hook is the test: a module of ours importing pydantic (or the laptop's code) fails.
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(node_zip) as source, zipfile.ZipFile(bad, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item))
        target.writestr("infra/node/heavy.py", "import pydantic\n")
        target.writestr("infra/node/laptop.py", "import infra.core.spec\n")
    for module, word in (("infra.node.heavy", "pydantic"), ("infra.node.laptop", "infra.core")):
        done = subprocess.run([sys.executable, "-c", PROBE, module, ",".join(ALLOWED)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(bad)})
        assert done.returncode != 0 and word in done.stderr, done.stderr[-500:]
