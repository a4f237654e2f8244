"""rayfleet against Lambda's own definition (OpenAPI 1.8.3, tests/reference/lambda/): every documented
error of every call the product makes, names and regions at their limits, and the firewall facts
the reference states (us-south-1, PATCH, 409). The fake checks every request and answer against
the reference; a violation fails the test (tests/conftest.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.cli.loading import load_spec
from infra.core import state
from infra.node.lambda_cloud import api
from infra.providers.lambda_cloud import firewall
from tests.fakes.http import Fault
from tests.lambda_cloud.conftest import API_KEY, SpecFactory, assert_clean, ours, read_state
from tests.lambda_cloud.fake_api import REGIONS, FakeLambda
from tests.lambda_cloud.fake_http import PREFIX, reference
from tests.lambda_cloud.test_faults import _invoke, provision, teardown

RULESET = "/firewall-rulesets/[^/]+"
#: Every call the product makes: (method, path template, path regex for faults, the call).
Call = Callable[[api.LambdaClient, dict[str, str]], object]
CALLS: list[tuple[str, str, str, Call]] = [
    ("GET", "/instance-types", "/instance-types", lambda c, _: c.instance_types()),
    ("GET", "/instances", "/instances", lambda c, _: c.instances()),
    ("GET", "/instances/{id}", "/instances/[^/]+", lambda c, _: c.instance("0" * 32)),
    ("POST", "/instance-operations/launch", "/instance-operations/launch",
     lambda c, ids: c.launch(region="us-east-1", instance_type="gpu_1x_a10",
                             ssh_key_name=ids["key"], name="ref-1")),
    ("POST", "/instance-operations/terminate", "/instance-operations/terminate",
     lambda c, ids: c.terminate([ids["instance"]])),
    ("GET", "/ssh-keys", "/ssh-keys", lambda c, _: c.ssh_keys()),
    ("POST", "/ssh-keys", "/ssh-keys", lambda c, _: c.add_ssh_key("ref-key", "ssh-ed25519 AAAA r")),
    ("DELETE", "/ssh-keys/{id}", "/ssh-keys/[^/]+", lambda c, ids: c.delete_ssh_key(ids["key_id"])),
    ("GET", "/file-systems", "/file-systems", lambda c, _: c.file_systems()),
    ("GET", "/firewall-rulesets", "/firewall-rulesets", lambda c, _: c.firewall_rulesets()),
    ("POST", "/firewall-rulesets", "/firewall-rulesets",
     lambda c, _: c.create_firewall_ruleset("rayfleet-ref", "us-east-1", firewall.rules(None))),
    ("GET", "/firewall-rulesets/{id}", RULESET, lambda c, ids: c.firewall_ruleset(ids["ruleset"])),
    ("PATCH", "/firewall-rulesets/{id}", RULESET,
     lambda c, ids: c.update_firewall_ruleset(ids["ruleset"], firewall.rules(["192.0.2.0/24"]))),
    ("DELETE", "/firewall-rulesets/{id}", RULESET,
     lambda c, ids: c.delete_firewall_ruleset(ids["ruleset"])),
]
#: Documented answers worth the same request again (api.RETRY_STATUSES): 409 "conflict".
TRANSIENT = {409}


def documented() -> list[tuple[str, str, str, int, str, Call]]:
    out = []
    for method, template, regex, call in CALLS:
        for status, code, _ in reference().documented_errors(method, PREFIX + template):
            out.append((method, template, regex, status, code, call))
    return out


def test_every_call_of_the_product_is_in_the_reference_and_every_error_is_listed() -> None:
    errors = documented()
    assert len(CALLS) == 14 and len(errors) >= 40
    used = {(m, t) for m, t, *_ in errors}
    assert used == {(m, t) for m, t, *_ in CALLS}  # each call documents errors (401, 403 at least)
    notes = (Path(__file__).resolve().parents[2] / "infra/providers/lambda_cloud/NOTES.md").read_text()
    for method, template, _, status, code, _ in errors:  # the table of what rayfleet does
        assert re.search(rf"\| {method} `{re.escape(template)}` \| {status} `{re.escape(code)}` \|",
                         notes), f"NOTES.md lacks {method} {template} {status} {code}"


def _ids(fake: FakeLambda, client: api.LambdaClient) -> dict[str, str]:
    key = client.add_ssh_key("ref-existing", "ssh-ed25519 AAAA e")
    ruleset = client.create_firewall_ruleset("rayfleet-ref-existing", "us-east-1", firewall.rules(None))
    instance = client.launch(region="us-east-1", instance_type="gpu_1x_a10", ssh_key_name=key.name,
                             name="ref-existing")
    return {"key": key.name, "key_id": key.id, "ruleset": ruleset.id, "instance": instance}


@pytest.mark.parametrize(("method", "template", "regex", "status", "code", "call"), [
    pytest.param(*e, id=f"{e[0]} {e[1]} {e[3]} {e[4]}") for e in documented()])
def test_every_documented_error(fake: FakeLambda, method: str, template: str, regex: str,
                                status: int, code: str, call: Call) -> None:
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(0.01))
    ids = _ids(fake, client)
    fake.inject(Fault(method, regex, status=status, code=code, times=2))
    if status in TRANSIENT:  # retried within the limits, then it works
        call(client, ids)
        assert [s for _, s in fake.requests(method, regex)][-3:] == [status, status, 200]
        return
    expected = api.ERRORS.get(code, api.LambdaError)
    with pytest.raises(api.LambdaError) as err:
        call(client, ids)
    assert type(err.value) is expected, (type(err.value), expected)
    text = str(err.value)
    # One line naming the call, Lambda's code (the cause) and its suggestion (the fix) when it has
    # one; never the key; sent once (a documented refusal is not retried).
    assert "\n" not in text and f"{method} " in text and code in text, text
    suggestion = error_suggestion(method, template, code)
    if suggestion:
        assert suggestion in text, text
    assert API_KEY not in text and API_KEY not in repr(err.value)
    assert [s for _, s in fake.requests(method, regex)][-1:] == [status]


def error_suggestion(method: str, template: str, code: str) -> str | None:
    for _, documented_code, schema in reference().documented_errors(method, PREFIX + template):
        if documented_code == code:
            return schema["properties"].get("suggestion", {}).get("default")
    return None


def test_provider_errors_are_retried_but_never_a_launch(fake: FakeLambda) -> None:
    """`provider/...` codes (upstream outages, described in the reference's prose with no status):
    as a 5xx they are retried like any 5xx; a launch that got one is reconciled, not resent."""
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(0.01))
    outage = "provider/internal-unavailable"
    fake.inject(Fault("GET", "/instances", status=503, code=outage, times=2))
    client.instances()
    assert [s for _, s in fake.requests("GET", "/instances")] == [503, 503, 200]
    key = client.add_ssh_key("p", "ssh-ed25519 AAAA p").name
    fake.inject(Fault("POST", "/instance-operations/launch", status=503, code=outage))
    with pytest.raises(api.LaunchOutcomeUnknown):
        client.launch(region="us-east-1", instance_type="gpu_1x_a10", ssh_key_name=key, name="p")
    assert len(fake.requests("POST", "/instance-operations/launch")) == 1


@pytest.mark.parametrize(("method", "regex", "status", "code", "words"), [
    ("GET", "/instance-types", 401, "global/invalid-api-key", "Check your API key"),
    ("POST", "/ssh-keys", 403, "global/account-inactive", "valid payment method"),
    ("POST", "/firewall-rulesets", 400, "global/quota-exceeded", "increase your quota"),
    ("POST", "/instance-operations/launch", 403, "global/invalid-address", "billing address"),
    ("POST", "/instance-operations/launch", 404, "global/object-does-not-exist", "not-exist"),
])
def test_a_refused_up_is_one_line_leaks_nothing_and_tears_down(
        fake: FakeLambda, make_spec: SpecFactory, rf_home: Path, method: str, regex: str,
        status: int, code: str, words: str) -> None:
    """What the user gets from `invoke up` when Lambda refuses for good, at each step of `up`."""
    fake.inject(Fault(method, regex, status=status, code=code, times=20))
    path = make_spec()
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and code in last and words in last, last
    assert "Traceback" not in result.stderr and API_KEY not in result.stderr + result.stdout
    fake.faults.clear()
    assert _invoke("teardown", "--cluster", str(path)).returncode == 0
    assert_clean(fake) and fake.ssh_keys == {} and read_state(rf_home) is None


# --- limits ---------------------------------------------------------------------------------------


def test_longest_cluster_name_fits_every_name_lambda_limits(fake: FakeLambda, make_spec: SpecFactory,
                                                            rf_home: Path) -> None:
    name = "c" * 31  # the longest cluster name a spec takes
    path = make_spec(name=name, workers={"count": 1, "choices": [
        {"instance_type": "gpu_1x_a10", "region": "us-east-1"}]})
    provision(path)
    mine = ours(fake, name)
    assert len(mine) == 2 and all(len(i["name"]) <= 64 for i in mine), mine
    assert all(len(k) <= 55 and len(v) <= 128 for i in mine for k, v in i["tags"].items())
    assert [len(k["name"]) for k in fake.ssh_keys.values()] == [58]  # of 64
    assert [len(r["name"]) for r in fake.firewall_rulesets.values() if not r.get("foreign")] == [49]
    teardown(path)
    assert_clean(fake, name)


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_every_region_of_the_reference(fake: FakeLambda, region: str) -> None:
    fake.capacity = {("gpu_1x_a10", region): 1}
    client = api.LambdaClient(API_KEY, fake.url, api.Limits.scaled(0.01))
    assert client.instance_types()["gpu_1x_a10"].regions_with_capacity == (region,)
    key = client.add_ssh_key("regions", "ssh-ed25519 AAAA r").name
    ruleset = client.create_firewall_ruleset("rayfleet-r", region, firewall.rules(None))
    instance = client.launch(region=region, instance_type="gpu_1x_a10", ssh_key_name=key,
                             name="r", firewall_rulesets=[ruleset.id])
    assert client.instance(instance).region == region


# --- firewall facts of the reference ----------------------------------------------------------


def test_narrowed_source_ranges_are_shown_by_plan_and_applied_at_the_next_up(
        fake: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    from infra import providers

    path = make_spec(workers={"count": 0})
    provision(path)
    (mine,) = [r for r in fake.firewall_rulesets.values() if not r.get("foreign")]
    assert [r["source_network"] for r in mine["rules"]] == ["0.0.0.0/0"]
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "ssh_source_ranges": ["203.0.113.0/24", "192.0.2.7/32"]}))
    spec = load_spec(path)
    with state.locked(spec.name, spec.provider, "plan") as current:
        plan = providers.create(spec).plan(current)
    (row,) = [r for r in plan.resources if r.kind == "Lambda firewall ruleset"]
    assert "changes at `up`: SSH from 0.0.0.0/0 -> 203.0.113.0/24, 192.0.2.7/32" in row.detail, row
    provision(path)
    assert sorted(r["source_network"] for r in mine["rules"]) == ["192.0.2.7/32", "203.0.113.0/24"]
    assert len(fake.requests("PATCH", RULESET)) == 1
    with state.locked(spec.name, spec.provider, "plan") as current:
        plan = providers.create(spec).plan(current)
    assert not [r for r in plan.resources if "changes at" in r.detail]
    provision(path)  # nothing changed: no PATCH
    assert len(fake.requests("PATCH", RULESET)) == 1
    teardown(path)
    assert_clean(fake)


def test_ruleset_409_is_retried_and_teardown_finishes(fake: FakeLambda, make_spec: SpecFactory,
                                                      rf_home: Path) -> None:
    path = make_spec(workers={"count": 0})
    fake.inject(Fault("POST", "/firewall-rulesets", status=409, code="global/internal-error"))
    # Lambda's documented 409 on DELETE, as the fake's model produces it: a ruleset whose last
    # change (its creation) is still being applied, for the next two PATCH/DELETE.
    fake.ruleset_conflicts = 2
    provision(path)
    assert [s for _, s in fake.requests("POST", "/firewall-rulesets")] == [409, 200]
    teardown(path)
    answers = [s for _, s in fake.requests("DELETE", RULESET)]
    assert answers == [409, 409, 200], answers
    assert_clean(fake)
    assert read_state(rf_home) is None


@pytest.fixture
def south(fake: FakeLambda) -> FakeLambda:
    fake.capacity[("gpu_1x_a10", "us-south-1")] = 4
    return fake


def test_us_south_1_is_refused_unless_accepted_then_warned_and_shown_open(
        south: FakeLambda, make_spec: SpecFactory, rf_home: Path) -> None:
    choices: dict[str, Any] = {"choices": [{"instance_type": "gpu_1x_a10", "region": "us-south-1"}]}
    path = make_spec(head=choices, workers={"count": 0})
    for command in ("plan", "up"):
        result = _invoke(command, "--cluster", str(path))
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "head.choices: Lambda applies no firewall rules in us-south-1" in line, line
        assert "accept_open_regions: [us-south-1]" in line, line
    assert ours(south) == [] and not south.requests("POST", "/ssh-keys")
    path = make_spec(head=choices, workers={"count": 0}, accept_open_regions=["us-south-1"])
    south.capacity = {}  # `up` warns before anything else, then finds no capacity
    result = _invoke("up", "--cluster", str(path))
    assert result.returncode == 1
    assert "us-south-1: Lambda applies no firewall rules there" in result.stderr, result.stderr
    south.capacity = {("gpu_1x_a10", "us-south-1"): 1}
    provision(path)
    status = _invoke("status", "--cluster", str(path))
    assert "SSH exposure: open: us-south-1" in status.stdout + status.stderr, status
    teardown(path)
    assert_clean(south)


@pytest.mark.parametrize(("extra", "message"), [
    ({"accept_open_regions": ["us-east-1"]}, "accept_open_regions[0]: input should be 'us-south-1'"),
    ({"accept_open_regions": ["us-south-1"]}, "accept_open_regions: no choice uses us-south-1"),
])
def test_accept_open_regions_is_strict(make_spec: SpecFactory, extra: dict[str, Any],
                                       message: str) -> None:
    from infra.core.errors import SpecError

    with pytest.raises(SpecError) as err:
        load_spec(make_spec(**extra))
    assert message in str(err.value) and "\n" not in str(err.value), err.value
