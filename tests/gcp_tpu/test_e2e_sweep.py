"""`invoke sweep` against the offline Google (issue 15): a VM and a TPU node of ours whose state file
is gone are found and removed with `--delete --yes`; a colleague's (another owner mark) is listed
only with `--all-owners` and never deleted unnamed; a VM of a cluster that has a state file here is
not a leak; a VM without rayfleet's labels, whatever its name, is never listed. `invoke` runs in
the test bed's client namespace with a service-account key the fake's token endpoint checks, over
TLS to Google's real names (the fixture `offline`, shared with the other offline tests).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from infra.core.state import State
from infra.node import identity
from infra.providers.gcp_tpu import config
from tests.gcp_tpu.offline import write_service_account_key
from tests.gcp_tpu.offline_bed import PROJECT, ZONE, Offline, spec_file

ME = "alice@laptop"
COLLEAGUE = "bob@workstation"


def _mark(who: str) -> str:
    # identity.owner_mark() of RAYFLEET_OWNER=who (its documented rule: sha256, 12 hex).
    return hashlib.sha256(who.encode()).hexdigest()[:12]


def _labels(cluster_id: str, name: str, owner: str) -> dict[str, str]:
    return {**config.sweep_labels(cluster_id, name), identity.TAG_OWNER: _mark(owner),
            identity.TAG_NAME: name, "ray-node-type": "worker"}


def _inventory(offline: Offline) -> dict[str, str]:
    """Every VM and TPU node at the fake (name -> status), TPU VMs' own instances left out."""
    with offline.fake.lock:
        found = {i["name"]: str(i["status"]) for i in offline.fake.instances.values()
                 if "tpu_cores" not in i["labels"]}
        found.update({n["name"].rsplit("/", 1)[-1]: str(n["state"])
                      for n in offline.fake.tpu_nodes.values()})
    return found


def test_sweep_finds_and_deletes_only_our_leaks(offline: Offline, tmp_path: Path) -> None:
    fake = offline.fake
    home = tmp_path / "rayfleet-home"
    key = write_service_account_key(tmp_path / "sa-key.json", offline.google.identity,
                                    f"sweeper@{PROJECT}.iam.gserviceaccount.com")
    # The sweep looks where this checkout's specs and state files point: this spec's project
    # and zone, with its key.
    specs = tmp_path / "clusters"
    specs.mkdir()
    spec_file(specs, key, name="course")
    env = {**offline.env(home), "RAYFLEET_OWNER": ME, "RAYFLEET_CLUSTERS": str(specs)}

    def sweep(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(offline.argv("sweep", *args), env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    leaked, colleague, kept = "1eaced01", "c011ea90", "57a7ef11"
    planted = ["ray-leaky-head-1a2b3c4d-compute", "ray-leaky-worker-00000000-tpu",
               "ray-theirs-head-5e6f7a8b-compute", "ray-kept-head-9c8d7e6f-compute",
               "ray-leaky-lookalike"]
    # What a crashed checkout left (its state file is gone), a colleague's cluster, one with a
    # state file here, and a VM named like ours without any rayfleet label.
    fake.add_instance(ZONE, planted[0], _labels(leaked, "leaky", ME))
    fake.add_tpu_node(ZONE, planted[1], "v4-8", _labels(leaked, "leaky", ME))
    fake.add_instance(ZONE, planted[2], _labels(colleague, "theirs", COLLEAGUE))
    fake.add_instance(ZONE, planted[3], _labels(kept, "kept", ME))
    fake.add_instance(ZONE, planted[4], {"ray-cluster-name": "leaky", "team": "data"})
    # (with the id its VMs were labelled with)
    kept_state = State.new(home / "state" / "kept.json", "kept", "gcp-tpu", cluster_id=kept)
    kept_state.save()
    try:
        before = _inventory(offline)
        listed = sweep("--json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        found: list[dict[str, Any]] = json.loads(listed.stdout)["resources"]
        assert sorted((r["name"], r["yours"], r["cluster_id"]) for r in found) == [
            (planted[0], True, leaked), (planted[1], True, leaked)], found
        assert all(r["hourly_usd"] and r["provider"] == "gcp-tpu" for r in found), found
        assert "gcp-tpu:" not in listed.stderr, listed.stderr  # swept, answered, no warning

        everyone = json.loads(sweep("--all-owners", "--json").stdout)["resources"]
        assert sorted((r["name"], r["yours"]) for r in everyone) == [
            (planted[0], True), (planted[1], True), (planted[2], False)], everyone

        unconfirmed = sweep("--delete")  # no terminal, no --yes: nothing happens
        assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr, unconfirmed.stderr
        assert _inventory(offline) == before

        deleted = sweep("--delete", "--yes", "--all-owners")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert "deleted 2 resource(s)" in deleted.stdout, deleted.stdout
        after = _inventory(offline)
        assert planted[0] not in after and planted[1] not in after, after
        assert {n: s for n, s in after.items()} == {
            n: s for n, s in before.items() if n not in planted[:2]}, "only the leaks may go"
        assert fake.nodes_with({"tpu_name": planted[1]}) == []  # its TPU VM's instances too
        assert json.loads(sweep("--json").stdout)["resources"] == []
    finally:
        # The shared fake goes back to what the other offline tests expect.
        with fake.lock:
            for key_ in [k for k, i in fake.instances.items()
                         if i["name"] in planted or i["labels"].get("tpu_name") in planted]:
                del fake.instances[key_]
            for full in [f for f in fake.tpu_nodes if f.rsplit("/", 1)[-1] in planted]:
                del fake.tpu_nodes[full]
