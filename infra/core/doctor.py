"""`invoke doctor`: the Ray and Python versions on each node of a running cluster, against the pins.

Mismatched Ray versions between this machine, the head and the workers break clusters in ways that
look like anything but a version problem (hanging jobs, pickling errors, workers that never join).
The check works the same for every provider: it submits a tiny job (infra/core/doctor_probe.py) through
the dashboard URL that `provider.connect` gives, and reads the versions back from the job's logs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.core import ui, versions
from infra.core.endpoint import Endpoint
from infra.core.errors import JobError
from infra.core.jobs import job_client
from infra.node import wait

PROBE = Path(__file__).with_name("doctor_probe.py")
_RESULT = "RESULT "


@dataclass
class NodeReport:
    """One node's answer (or the lack of one)."""

    #: Ray's node id (hex) and the IP Ray knows it by.
    node_id: str
    ip: str
    head: bool
    #: Hostname, full Python version and Ray version as the node's Ray worker sees them; "" when
    #: the node did not answer.
    host: str = ""
    python_version: str = ""
    ray_version: str = ""
    #: Why the node could not report (timeout, task error); "" when it did.
    error: str = ""
    #: Differences from this machine's pins (infra.core.versions.mismatches).
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error and not self.mismatches


def parse_result(logs: str) -> dict[str, Any]:
    """The probe's `RESULT {...}` line from a job's logs."""
    for line in reversed(logs.splitlines()):
        if line.startswith(_RESULT):
            parsed: dict[str, Any] = json.loads(line[len(_RESULT):])
            return parsed
    tail = " | ".join(logs.strip().splitlines()[-3:])
    raise JobError(f"the doctor job printed no result; last log lines: {tail or '(none)'}")


def assess(result: dict[str, Any], pins: dict[str, str]) -> list[NodeReport]:
    """Turn the probe's result into reports, head first, each compared with `pins`."""
    reports = []
    for node in result.get("nodes", []):
        report = NodeReport(
            node_id=str(node["node_id"]), ip=str(node["ip"]), head=bool(node.get("head")),
            host=str(node.get("host", "")), python_version=str(node.get("python_version", "")),
            ray_version=str(node.get("ray_version", "")), error=str(node.get("error", "")),
        )
        if not report.error:
            report.mismatches = versions.mismatches(
                {"ray_version": report.ray_version, "python_version": report.python_version}, pins)
        reports.append(report)
    return sorted(reports, key=lambda r: (not r.head, r.ip, r.node_id))


def probe(endpoint: Endpoint, timeout_s: float = 120.0) -> dict[str, Any]:
    """Submit the probe job, wait for it, and return its parsed result."""
    client = job_client(endpoint)
    staging = Path(tempfile.mkdtemp(prefix="rayfleet-doctor-"))
    try:
        # Only the probe travels: the job's working dir is a folder holding nothing else.
        shutil.copy(PROBE, staging / PROBE.name)
        job_id = f"rayfleet-doctor-{uuid.uuid4().hex[:8]}"
        with ui.step("submitting the version probe"):
            try:
                client.submit_job(
                    entrypoint=f"python {PROBE.name} {timeout_s / 2:g}",
                    runtime_env={"working_dir": str(staging)},
                    submission_id=job_id,
                )
            except Exception as exc:
                raise JobError(f"could not submit the doctor job: {str(exc).splitlines()[0]}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    def ended(step: ui.Step) -> str | None:
        status = str(client.get_job_status(job_id).value)
        step.detail(status)
        return status if status in ("SUCCEEDED", "FAILED", "STOPPED") else None

    try:
        status = ui.wait_for(ended, f"job {job_id} to report every node", timeout=timeout_s)
    except wait.WaitTimeout:
        client.stop_job(job_id)
        raise
    logs = client.get_job_logs(job_id)
    if status != "SUCCEEDED":
        tail = " | ".join(logs.strip().splitlines()[-3:])
        raise JobError(f"the doctor job {job_id} {status}: {tail or 'no logs'}")
    return parse_result(logs)


def run(endpoint: Endpoint, as_json: bool) -> int:
    """Check every node; print a table (or JSON); return 1 when any node differs or is silent."""
    pins = versions.node_pins()
    result = probe(endpoint)
    reports = assess(result, pins)
    driver = result.get("driver", {})
    bad = [r for r in reports if not r.ok]
    if as_json:
        ui.out(json.dumps({
            "this_machine": pins,
            "driver": driver,
            "nodes": [{**r.__dict__, "ok": r.ok} for r in reports],
            "ok": not bad,
        }, indent=2), soft_wrap=True, markup=False)
        return 1 if bad else 0
    from rich.table import Table

    table = Table(title=f"Ray and Python on each node (this machine: Ray {pins['ray_version']}, "
                        f"Python {pins['python_version']})")
    for column in ("node", "ip", "host", "head", "Python", "Ray", "check"):
        table.add_column(column)
    for r in reports:
        check = "ok" if r.ok else (r.error or "MISMATCH: " + "; ".join(r.mismatches))
        table.add_row(r.node_id[:12], r.ip, r.host, "yes" if r.head else "", r.python_version,
                      r.ray_version, check)
    ui.out(table)
    for r in bad:
        where = f"node {r.node_id[:12]} ({r.ip}{', head' if r.head else ''})"
        if r.error:
            ui.warn(f"{where} did not report its versions: {r.error}")
        else:
            ui.warn(f"{where} runs {' and '.join(r.mismatches)}; reinstall it with "
                    "setup/install.sh and this machine's pins (infra/core/versions.py), or match them here")
    if not bad:
        ui.out(f"all {len(reports)} node(s) match this machine", markup=False)
    return 1 if bad else 0
