"""A class in a browser: a member signs in to a shared local cluster's gateway in a real headless
Chromium, through the gateway's login form, and opens the dashboard's Overview, Jobs and Cluster
pages, their own job's page and the Actors, Serve, Logs and Metrics tabs: no token dialog, none of
another member's jobs, no answer of the gateway that leaves an error on a page (one cluster for
the module). bench/gateway.py's measurement runs here too, on the same cluster (docs/benchmarks.md)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import gateway as gateway_bench
from infra.core.sharing import certs as sharing_certs
from tests.browser_metrics import docs_screenshot
from tests.browser_session import Page, browser, keep_screenshot
from tests.local.test_e2e_sharing import Shared, shared_cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

#: What Ray's dashboard shows when one of its calls is answered 401 or 403.
TOKEN_DIALOG = "Authentication Token Required"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory, "cls", cpus=2) as cluster:
        yield cluster


def _settled(page: Page, wanted: str, seconds: float = 4.0) -> str:
    """The page's text once it shows `wanted`, after its background calls had `seconds` more."""
    wait_until(lambda: wanted in page.text(), f"{wanted!r} on the page", timeout=90, interval=0.5)
    time.sleep(seconds)
    return page.text()


def test_a_member_signs_in_from_a_browser_and_sees_only_their_jobs_without_a_token_dialog(
        shared: Shared, tmp_path: Path) -> None:
    ann, bo = shared.add("ann"), shared.add("bo")
    mine = ann.submit("python -c print(1)")
    theirs = bo.submit("python -c print(2)")
    token = Path(ann.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    cert = (Path(shared.env["RAYFLEET_HOME"]) / "keys" / shared.spec.stem
            / sharing_certs.SERVER_CERT).read_bytes()
    gateway = f"https://127.0.0.1:{shared.port}"
    with browser(cert) as page:
        page.open(gateway + "/")
        assert "Member token" in page.text() and TOKEN_DIALOG not in page.text()
        page.submit_form({"token": "f" * 64})
        assert "not accepted" in page.text()
        page.submit_form({"token": token})
        signed_in = len(page.requests)
        shots = {}
        for view, wanted in (("jobs", mine), ("overview", "Cluster"), ("cluster", "Node")):
            page.open(f"{gateway}/#/{view}")
            text = _settled(page, wanted)
            assert TOKEN_DIALOG not in text, view
            assert theirs not in text, view
            shots[view] = page.screenshot()
        # The member's own job (its driver's log shown: the gateway passed that file on) and the
        # other tabs: their background calls fire on opening, so a shorter wait covers them (the
        # module's cost stays about the same).
        for view, wanted in ((f"jobs/{mine}", "Running entrypoint for job"), ("actors", "Actor ID"),
                             ("serve", "Serve not started"), ("logs", "Logs Viewer"),
                             ("metrics", "Grafana")):
            page.open(f"{gateway}/#/{view}")
            text = _settled(page, wanted, seconds=1.0)
            assert TOKEN_DIALOG not in text and theirs not in text, view
            assert "AxiosError" not in text and "Request failed" not in text, view
            # Which tabs show a member nothing is said on the page itself.
            assert "Serve, Metrics and profiling are not open to members" in text, view
            if view == "logs":
                # A node's log files: the member's own job's only (not Ray's, not bo's).
                node = re.search(r"Node ID: ([0-9a-f]{56})", text)
                assert node, text
                page.open(f"{gateway}/#/logs?nodeId={node.group(1)}")
                files = _settled(page, f"job-driver-{mine}.log", seconds=1.0)
                assert theirs not in files and "gcs_server" not in files, files
        # Every answer the dashboard got from the gateway once signed in: none that raises the
        # dialog (before, the login page's own favicon and the wrong token were refused), and
        # none that leaves an error on a page (Ray's own calls answered 404 or 500 did).
        refused = [(url, status) for url, status in page.requests[signed_in:]
                   if url.startswith(gateway) and status in (401, 403)]
        assert refused == []
        # (Platform events excepted: 404 is Ray's own answer without any configured, and the
        # dashboard looks for them with HEAD to hide that tab, the owner's page included.)
        failed = sorted({(url.removeprefix(gateway), status)
                         for url, status in page.requests[signed_in:]
                         if url.startswith(gateway) and status in (404, 500, 502, 503)
                         and not url.startswith(f"{gateway}/api/v0/platform_events")})
        assert failed == []
    for view, png in shots.items():
        assert png.startswith(b"\x89PNG")
        kept = Path(os.environ.get("RAYFLEET_SCREENSHOTS") or tmp_path)
        keep_screenshot(png, kept, f"{view}.png")
    docs_screenshot("sharing-member-dashboard.png", shots["jobs"])


def test_bench_gateway_against_the_job_api_on_this_cluster(
        shared: Shared, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bench/gateway.py's quick measurement on this module's cluster (after the browser test: its
    members m0..m4 and their jobs come later, so the page above shows none of them)."""
    monkeypatch.setenv("RAYFLEET_HOME", shared.env["RAYFLEET_HOME"])  # the owner's registry
    exports = shared.invoke("env")
    assert exports.returncode == 0, exports.stdout + exports.stderr
    keys = Path(shared.env["RAYFLEET_HOME"]) / "keys" / shared.spec.stem
    target = gateway_bench.Target(shared.spec.stem, f"https://127.0.0.1:{shared.port}",
                                  exports.stdout.split("RAY_API_SERVER_ADDRESS=")[1].split()[0],
                                  (keys / "ray-token").read_text().strip(),
                                  str(keys / sharing_certs.CA_CERT))
    assert gateway_bench.measure(target, *gateway_bench.QUICK, quick=True) == 0
    printed = capsys.readouterr().out
    print(printed)  # the numbers, for -s and for the log of a failing run
    assert re.search(r"load 5 members x 4 requests: gateway errors 0, p99 [0-9.]+ ms", printed)
    assert re.search(r"targets: list (met|MISSED), submit (met|MISSED), load errors met "
                     r"\(load average", printed), printed
