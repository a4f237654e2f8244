"""The node package (infra/node/): what runs on a cluster's nodes imports only the standard
library, Ray (with what Ray itself imports, e.g. filelock), requests and the package itself, and
it reaches a head whole, as the zip `infra.core.shipping` builds.

Each module is imported in a fresh interpreter from that zip alone (the checkout off the path),
under an import hook that refuses any other module our code asks for; that one rule replaces the
per-provider lists of banned modules. GCP's modules call Google's client at run time (the GCP node
installer puts it on the head); they import it inside those calls, so importing them needs none.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
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


@pytest.fixture(scope="module")
def node_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("head") / shipping.zip_name()
    path.write_bytes(shipping.node_zip())
    return path


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
def test_imports_from_the_zip_with_stdlib_ray_and_requests_only(node_zip: Path,
                                                                module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, ",".join(ALLOWED)], cwd=node_zip.parent,
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(node_zip), "RAY_USAGE_STATS_ENABLED": "0"})
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip().startswith(str(node_zip)), done.stdout  # from the zip, not here


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
