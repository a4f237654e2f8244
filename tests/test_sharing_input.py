"""Bad input around sharing, without a cluster: one line naming the field and the fix, exit != 0,
nothing created or lost."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.forked_cli import run_invoke


def _spec(folder: Path, body: str) -> Path:
    path = folder / f"shr-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("example", ["lambda.yaml", "gcp-tpu.yaml"])
def test_sharing_on_a_public_head_needs_allowed_source_ranges(tmp_path: Path, example: str) -> None:
    base = (ROOT / "clusters" / example).read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  port: 8443\n")
    done = run_invoke("plan", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "h")})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "sharing: allowed_source_ranges is required" in lines[0], done.stderr
    assert not (tmp_path / "h").exists()


def test_two_halves_of_the_internet_are_refused_in_one_line_naming_the_acknowledgement(
        tmp_path: Path) -> None:
    """`/0` alone was refused; two `/1`s opened the gateway to every address all the same."""
    base = (ROOT / "clusters" / "lambda.yaml").read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  allowed_source_ranges: [0.0.0.0/1, 128.0.0.0/1]\n")
    done = run_invoke("plan", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "h")})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "sharing: allowed_source_ranges together cover 4,294,967,296 IPv4" \
        in lines[0] and "allowed_source_ranges_ack_wide: true" in lines[0], done.stderr
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize(("ranges", "wide"), [
    (["198.51.100.0/24"], False),
    (["10.8.0.0/16"], False),
    # Overlaps count once: a /16 and a /24 inside it are a /16.
    (["10.8.0.0/16", "10.8.3.0/24"], False),
    (["10.8.0.0/16", "10.9.0.0/32"], True),
    (["10.0.0.0/15"], True),
    (["0.0.0.0/1", "128.0.0.0/1"], True),
    (["2001:db8::/48", "198.51.100.0/24"], False),
    (["2001:db8::/47"], True),
    (["2001:db8::/48", "2001:db9::/48"], True),
])
@pytest.mark.parametrize("example", ["lambda.yaml", "gcp-tpu.yaml"])
def test_ranges_wider_than_a_site_need_the_acknowledgement(
        tmp_path: Path, example: str, ranges: list[str], wide: bool) -> None:
    from infra.cli import loading
    from infra.core.errors import SpecError

    base = (ROOT / "clusters" / example).read_text()
    for ack in (False, True):
        block = f"\nsharing:\n  allowed_source_ranges: {json.dumps(ranges)}\n" \
                f"  allowed_source_ranges_ack_wide: {'true' if ack else 'false'}\n"
        path = tmp_path / f"wide{int(ack)}.yaml"
        path.write_text(base + block)
        if wide and not ack:
            with pytest.raises(SpecError, match="allowed_source_ranges_ack_wide: true"):
                loading.load_spec(path)
        else:
            loaded = loading.load_spec(path)
            assert loaded.sharing is not None and loaded.sharing.allowed_source_ranges == ranges


def test_the_acknowledgement_never_opens_the_whole_internet(tmp_path: Path) -> None:
    base = (ROOT / "clusters" / "gcp-tpu.yaml").read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  allowed_source_ranges: [0.0.0.0/0]\n"
                                  "  allowed_source_ranges_ack_wide: true\n")
    done = run_invoke("plan", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "h")})
    assert done.returncode == 2 and "opens the gateway to the whole internet" in done.stderr, \
        done.stderr


def test_sharing_ranges_on_slurm_are_refused_before_anything_exists(tmp_path: Path) -> None:
    """rayfleet opens no firewall on a Slurm site: ranges it cannot enforce are refused, not
    silently ignored (they were refused with the whole block before the gateway ran there)."""
    base = (ROOT / "clusters" / "slurm.yaml").read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  allowed_source_ranges: [10.0.0.0/8]\n"
                                  "  members_run_as_owner: true\n")
    for verb in ("plan", "up"):
        done = run_invoke(verb, "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "h")})
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "sharing.allowed_source_ranges" in lines[0] \
            and "controls no firewall" in lines[0] and "remove the field" in lines[0], done.stderr
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize(("block", "expected"), [
    ("  allowed_source_ranges: [0.0.0.0/0]", "opens the gateway to the whole internet"),
    ("  allowed_source_ranges: [10.0.0.1/8]", "is not a CIDR range"),
    ("  max_runing_jobs_per_member: 3", "did you mean 'max_running_jobs_per_member'"),
    ("  port: 80", "sharing.port"),
    ("  hostname: not a name", "is not a DNS name"),
    ("  hostname: localhost", "is not a DNS name"),
    ("  max_upload_mb: 0", "sharing.max_upload_mb"),
])
def test_sharing_block_is_strict(tmp_path: Path, block: str, expected: str) -> None:
    spec = _spec(tmp_path, f"provider: local\nsharing:\n  members_run_as_owner: true\n{block}\n")
    done = run_invoke("plan", "--cluster", str(spec), env={"RAYFLEET_HOME": str(tmp_path / "h")})
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_member_add_on_a_cluster_without_sharing(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "provider: local\n")
    out = tmp_path / "bundle.json"
    done = run_invoke("member-add", "alice", "--out", str(out), "--cluster", str(spec),
                      env={"RAYFLEET_HOME": str(tmp_path / "h")})
    assert done.returncode != 0 and "this cluster is not shared" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "h" / "sharing").exists()


@pytest.mark.parametrize(("content", "expected"), [
    ("{not json", "not JSON"),
    (json.dumps({"cluster": "x", "token": "t"}), "not a rayfleet member bundle"),
    (json.dumps({"kind": "rayfleet-member-bundle/1", "cluster": "x", "address": "http://1.2.3.4:8443",
                 "member": "a", "ca_cert": "-----BEGIN CERTIFICATE-----", "token": "t"}),
     "not https://"),
    (json.dumps({"kind": "rayfleet-member-bundle/1", "cluster": "../../etc",
                 "address": "https://1.2.3.4:8443", "member": "a",
                 "ca_cert": "-----BEGIN CERTIFICATE-----", "token": "t"}),
     "is not a rayfleet cluster name"),
    (None, "no such file"),
])
def test_join_refuses_a_malformed_or_foreign_bundle(tmp_path: Path, content: str | None,
                                                   expected: str) -> None:
    bundle = tmp_path / "bundle.json"
    if content is not None:
        bundle.write_text(content)
    home = tmp_path / "member"
    done = run_invoke("join", str(bundle), env={"RAYFLEET_HOME": str(home)})
    assert done.returncode != 0 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (home / "joined").exists()


@pytest.mark.parametrize("address", ["http://localhost:8443", "https://localhost",
                                     "https://localhost:8443/x; rm -rf ~", "localhost:8443"])
def test_join_refuses_an_address_that_is_not_https_host_port(tmp_path: Path, address: str) -> None:
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({
        "kind": "rayfleet-member-bundle/1", "cluster": "x", "address": "https://10.0.0.5:8443",
        "member": "a", "ca_cert": "-----BEGIN CERTIFICATE-----", "token": "t"}))
    home = tmp_path / "member"
    done = run_invoke("join", str(bundle), "--address", address,
                      env={"RAYFLEET_HOME": str(home)})
    assert done.returncode != 0 and "--address" in done.stderr \
        and "give https://HOST:PORT" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (home / "joined").exists()


def test_a_provider_whose_head_gets_no_gateway_refuses_sharing_naming_its_reason() -> None:
    """Every provider runs the gateway now; one that does not (a new provider's default) refuses
    the block before anything is created, with its own reason first."""
    from infra.core.capabilities import Capabilities
    from infra.core.errors import SpecError
    from infra.core.sharing import owner as sharing
    from infra.core.spec import ClusterSpec, Sharing

    class NoGateway(ClusterSpec):
        CAPABILITIES = Capabilities(sharing_refusal="not on {provider}: no head to run it on")

    spec = NoGateway(name="c", provider="nohead", source="c.yaml",
                     sharing=Sharing())
    with pytest.raises(SpecError) as refused:
        sharing.check_spec(spec)
    assert str(refused.value).startswith("c.yaml: sharing: not on nohead: no head to run it on; "
                                         "remove the block")


def test_a_hostname_goes_into_the_certificate_and_the_bundles_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sharing.hostname: what members' bundles name instead of the head's address, so a new head
    needs a new DNS record, not new bundles."""
    from infra.cli.loading import resolve
    from infra.core.head_ssh import SshHead
    from infra.core.sharing import certs as sharing_certs
    from infra.core.sharing import owner as sharing
    from infra.core.ssh import SshTarget

    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "h"))
    base = (ROOT / "clusters" / "lambda.yaml").read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  allowed_source_ranges: [10.0.0.0/16]\n"
                                  "  hostname: Ray.Class.Example.edu\n")
    selected = resolve(None, str(spec))
    assert selected.sharing is not None and selected.sharing.hostname == "ray.class.example.edu"
    access = SshHead(target=SshTarget(host="192.0.2.10", user="ubuntu", key_path=tmp_path / "k"),
                     where="ubuntu@192.0.2.10", dashboard_port=8265)
    config, _ = sharing.gateway_settings(selected, access, None, "192.0.2.10")  # type: ignore[arg-type]
    assert sharing_certs.server_names(Path(config.cert)) == sorted(
        ["192.0.2.10", "ray.class.example.edu"])


def test_every_sharing_rule_of_the_spec_reaches_the_gateways_config_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's rules named like the spec's `sharing` fields are copied by name
    (owner.SPEC_RULES): each is a field on both sides, and a value set in the spec arrives."""
    import dataclasses

    from infra.cli.loading import resolve
    from infra.core.head_ssh import SshHead
    from infra.core.sharing import owner as sharing
    from infra.core.ssh import SshTarget
    from infra.node import gateway_config

    config_fields = {f.name for f in dataclasses.fields(gateway_config.Config)}
    assert set(sharing.SPEC_RULES) <= config_fields
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "h"))
    base = (ROOT / "clusters" / "lambda.yaml").read_text()
    spec = _spec(tmp_path, base + "\nsharing:\n  allowed_source_ranges: [10.0.0.0/16]\n"
                                  "  max_job_hours: 3.5\n  max_member_tails: 7\n"
                                  "  members_may_pip: true\n  member_budget_usd: 12.5\n")
    selected = resolve(None, str(spec))
    access = SshHead(target=SshTarget(host="192.0.2.10", user="ubuntu", key_path=tmp_path / "k"),
                     where="ubuntu@192.0.2.10", dashboard_port=8265)
    config, _ = sharing.gateway_settings(selected, access, None, "192.0.2.10")  # type: ignore[arg-type]
    assert selected.sharing is not None
    for name in sharing.SPEC_RULES:
        assert getattr(config, name) == getattr(selected.sharing, name), name
    assert (config.max_job_hours, config.max_member_tails, config.members_may_pip,
            config.member_budget_usd) == (3.5, 7, True, 12.5)
