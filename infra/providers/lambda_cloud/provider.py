"""The `lambda` provider's verbs: plan, up, status, connect, teardown.

A fixed-size cluster (`workers: {count: N}`): `up` launches the instances itself (fleet.py: ordered
(type, region) fallbacks, one launch per call, every id in state at once, the cluster id as a
launch tag, adoption of tagged instances from interrupted runs), waits until all are active and
accept SSH, renders templates/lambda.yaml.j2 with their addresses and runs `ray up`
(raycluster.py). `teardown` terminates every instance of this cluster (state ids and the cluster-id
tag) first, waits until the API reports them terminated, then deletes the SSH key and the
firewall ruleset and forgets Ray's local state. Nothing without our cluster id is touched.
See NOTES.md.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra import auth, autodown_remote, paths, render, ssh, tracking, tracking_remote, ui
from infra.errors import ClusterNotRunningError, RayfleetError
from infra.head import HeadAccess
from infra.node import identity
from infra.node.files import atomic_write
from infra.node.lambda_cloud import api
from infra.providers.base import (
    CostRange,
    Endpoint,
    Plan,
    PlannedResource,
    ProviderStatus,
    Readiness,
)
from infra.providers.base import Provider as BaseProvider
from infra.providers.lambda_cloud import (
    autodown_setup,
    autoscale,
    costs,
    firewall,
    fleet,
    raycluster,
    tracking_setup,
)
from infra.providers.lambda_cloud.spec import Choice, Spec
from infra.state import Resource, State

__all__ = ["Provider", "Spec"]  # re-exported lazily by __init__.py


def place(spec: Spec, types: dict[str, api.InstanceType]) -> tuple[Choice | None, Choice | None]:
    """Where `up` would put the head and the workers given a capacity view (same region)."""
    def has(choice: Choice) -> bool:
        info = types.get(choice.instance_type)
        return bool(info and choice.region in info.regions_with_capacity)

    for head in spec.head.choices:
        if not has(head):
            continue
        needed = spec.worker_choices(needed_now=True)
        worker = next((c for c in spec.worker_choices() if c.region == head.region and has(c)), None)
        if worker or not needed:
            return head, worker
    return None, None


@dataclass(frozen=True)
class Capacity:
    """What `plan` hands `up` and `cost_range` (`Plan.extra`): Lambda's instance types as listed."""

    #: Instance types by name (prices, regions with capacity); None without a key or on an error.
    types: dict[str, api.InstanceType] | None = None
    #: `time.monotonic()` of the listing: `up` launches from it while it is fresher than the
    #: account's launch interval, instead of asking again.
    fetched_at: float = 0.0

    def fresh(self, max_age_s: float) -> dict[str, api.InstanceType] | None:
        return self.types if time.monotonic() - self.fetched_at < max_age_s else None


class Provider(BaseProvider[Spec, Capacity]):
    name = "lambda"
    #: `tracking: mlflow`: the server runs on the head (infra/tracking_remote.py); its store on
    #: the spec's `file_system` when named, else on the head, copied here by `teardown`.
    supports_tracking = True
    supports_metrics = True

    def __init__(self, spec: Spec, client: api.LambdaClient | None = None) -> None:
        super().__init__(spec)
        self._client = client

    def client(self) -> api.LambdaClient:
        if self._client is None:
            # An autoscaling head spends half the account's request budget; we take the other.
            self._client = api.LambdaClient.from_env(share=0.5 if self.spec.autoscaling else 1.0)
        return self._client

    def _key_path(self) -> Path:
        return self.spec.private_key_path() or paths.keys_dir(self.spec.name) / ssh.KEY_NAME

    def _target(self, ip: str) -> ssh.SshTarget:
        # Fresh instances: their host key is pinned on first contact in the cluster's own file.
        return ssh.SshTarget(ip, self.spec.ssh_user, self._key_path(),
                             proxy_command=self.spec.ssh_proxy_command,
                             known_hosts=ssh.cluster_known_hosts(self.spec.name),
                             host_key_policy="accept-new")

    def _slots(self, state: State | None) -> list[fleet.Slot]:
        # Before the first `up` there is no id yet: plan shows where it goes.
        cluster_id = state.cluster_id if state is not None else identity.ID_PLACEHOLDER
        return fleet.slots(self.spec.name, self.spec.fixed_workers, cluster_id)

    # --- plan -----------------------------------------------------------------------------------

    def plan(self, state: State | None) -> Plan[Capacity]:
        types: dict[str, api.InstanceType] | None = None
        notes: list[str] = []
        problems: list[str] = []
        fetched_at = 0.0
        # `up` cannot start without the API: a plan that could not reach it has failed.
        if api.read_api_key() is None:
            problems.append("capacity and prices unknown: no Lambda API key (set LAMBDA_API_KEY "
                            f"or put `api_key = ...` in ~/{api.KEY_FILE})")
        else:
            try:
                types = self.client().instance_types()
                fetched_at = time.monotonic()
            except RayfleetError as exc:
                problems.append(f"capacity and prices unknown: {exc}")
        existing = {fleet.slot_key(str(r.attrs.get("name")), r.attrs): r
                    for r in (state.resources(fleet.INSTANCE) if state else [])}
        head_choice, worker_choice = place(self.spec, types) if types else (None, None)
        resources, hourly = [], 0
        for slot in self._slots(state):
            if slot.key in existing:
                attrs = existing[slot.key].attrs
                resources.append(PlannedResource(
                    "Lambda instance", slot.name, f"{existing[slot.key].id}: {attrs.get('instance_type')} "
                    f"in {attrs.get('region')}, {attrs.get('ip') or 'no IP yet'}", exists=True))
                hourly += int(attrs.get("price_cents_per_hour") or 0)
                continue
            choice = head_choice if slot.role == "head" else worker_choice
            if choice is not None and types:
                price = types[choice.instance_type].price_cents_per_hour
                hourly += price
                detail = f"{choice.instance_type} in {choice.region}, {costs.dollars(price)}/h (capacity now)"
            else:
                pool = self.spec.head.choices if slot.role == "head" else self.spec.worker_choices()
                detail = "first with capacity of " + ", ".join(str(c) for c in pool)
                if types:
                    detail = "NO CAPACITY NOW in any of " + ", ".join(str(c) for c in pool)
            resources.append(PlannedResource("Lambda instance", slot.name, detail))
        if self.spec.ssh_key_name:
            notes.append(f"instances use the account's SSH key {self.spec.ssh_key_name!r}; `ray up` "
                         f"copies {self.spec.ssh_private_key} to the head as ~/ray_bootstrap_key.pem")
        else:
            resources.insert(0, PlannedResource(
                "Lambda SSH key", f"rayfleet-{self.spec.name}-{identity.ID_PLACEHOLDER}-<fingerprint>",
                f"public half of {self._key_path()} (generated here, 0600; the private key stays "
                "here and on the head)", exists=bool(state and state.resources(fleet.SSH_KEY))))
        ruleset = firewall.ruleset_name(self.spec.name,
                                        state.cluster_id if state else identity.ID_PLACEHOLDER)
        sources = ", ".join(self.spec.ssh_source_ranges or ["anywhere"])
        change = firewall.pending_change(state, self.spec.ssh_source_ranges)
        resources.append(PlannedResource(
            "Lambda firewall ruleset", ruleset, f"SSH from {sources}; no Ray port"
            + (f" (changes at `up`: {change})" if change else ""),
            exists=bool(state and state.resources(firewall.FIREWALL))))
        for region in firewall.unfiltered([c.region for _, c in self.spec.all_choices()]):
            notes.append(f"{region} (accepted by accept_open_regions): Lambda applies no firewall "
                         f"rules there; nodes placed in {region} are open on every port")
        if self.spec.autoscaling:
            for name, kind in (self.spec.worker_types or {}).items():
                resources.append(PlannedResource(
                    "Lambda instances (autoscaled)", f"{self.spec.name}-<id>-{name}-*",
                    f"{kind.min_workers}..{kind.max_workers} x first with capacity of "
                    + ", ".join(str(c) for c in kind.choices) + "; launched by Ray's autoscaler "
                    f"on demand, terminated after {self.spec.idle_timeout_minutes:g} idle min"))
        if types:
            notes += self._capacity_notes(types)
            cost = autoscale.hourly_range(self.spec, types)
            if self.spec.autoscaling and cost:
                notes.append(f"estimated cost: {costs.dollars(cost[0])}/h at minimum size, "
                             f"{costs.dollars(cost[1])}/h at maximum size (first choices' prices)")
            else:
                notes.append(f"estimated cost: {costs.dollars(hourly)}/h for {len(self._slots(state))} "
                             "instance(s)")
        if self.spec.tracking == "mlflow":
            notes.append(tracking_setup.plan_note(self.spec))
        if self.spec.autoscaling:
            files = {autoscale.RENDERED: self._render_autoscaler(state, None, types)}
        else:
            files = {raycluster.CONFIG_FILE: self._render(state)}
        return Plan(resources=resources, files=files, notes=notes, problems=problems,
                    extra=Capacity(types, fetched_at))

    def _render_autoscaler(self, state: State | None, head: api.Instance | None,
                           types: dict[str, api.InstanceType] | None) -> str:
        """The autoscaler config; before the head exists, with the first head choice's region."""
        key = next((str(r.attrs["name"]) for r in (state.resources(fleet.SSH_KEY) if state else [])),
                   f"rayfleet-{self.spec.name}-{identity.ID_PLACEHOLDER}-<fingerprint>")
        region = head.region if head else self.spec.head.choices[0].region
        rulesets = [r.id for r in (state.resources(firewall.FIREWALL) if state else [])
                    if r.attrs.get("region") == region] or ["<ruleset id>"]
        scale = self._client.limits.scale if self._client else api.Limits.from_env().scale
        data = autoscale.config(self.spec, state.cluster_id if state else identity.ID_PLACEHOLDER,
                                state.owner if state else "<owner>", region, key, rulesets, types,
                                scale, raycluster.private_address(head) if head else None)
        text = autoscale.render(data)
        # Ray's defaults for external providers bring empty legacy keys it then warns about.
        logging.getLogger("ray.autoscaler._private.util").setLevel(logging.ERROR)
        render.validate_ray_cluster_config(text, f"autoscaler config for {self.spec.name}")
        return text

    def _capacity_notes(self, types: dict[str, api.InstanceType]) -> list[str]:
        lines = []
        for role, choices in (("head", self.spec.head.choices), ("workers", self.spec.worker_choices())):
            parts = []
            for choice in choices:
                info = types.get(choice.instance_type)
                if info is None:
                    parts.append(f"{choice} (unknown type)")
                    continue
                mark = "capacity" if choice.region in info.regions_with_capacity else "none"
                parts.append(f"{choice} {costs.dollars(info.price_cents_per_hour)}/h: {mark}")
            if parts:
                lines.append(f"{role} choices now: " + "; ".join(parts))
        return lines

    def _render(self, state: State | None, nodes: dict[str, api.Instance] | None = None) -> str:
        """The Ray config: real addresses when known, else placeholders that say so."""
        ips: dict[str, str] = {}
        private: dict[str, str] = {}
        for r in state.resources(fleet.INSTANCE) if state else []:
            key = fleet.slot_key(str(r.attrs.get("name")), r.attrs)
            if r.attrs.get("ip") and key:
                ips[key] = str(r.attrs["ip"])
                private[key] = str(r.attrs.get("private_ip") or r.attrs["ip"])
        for key, inst in (nodes or {}).items():
            ips[key] = str(inst.ip)
            private[key] = raycluster.private_address(inst)
        slots = self._slots(state)
        head = ips.get(slots[0].key, "HEAD_IP_AFTER_LAUNCH")
        workers = [ips.get(s.key, f"WORKER_{s.index}_IP_AFTER_LAUNCH") for s in slots[1:]]
        text = raycluster.render_config(self.spec, head, workers, self._key_path(),
                                        state.cluster_id if state is not None else identity.ID_PLACEHOLDER,
                                        private.get(slots[0].key))
        render.validate_ray_cluster_config(text, f"templates/lambda.yaml.j2 for {self.spec.name}")
        return text

    # --- up -------------------------------------------------------------------------------------

    def create(self, state: State, plan: Plan[Capacity]) -> Endpoint:
        firewall.warn_if_open(self.spec.ssh_source_ranges, self.spec.source,
                              [c.region for _, c in self.spec.all_choices()])
        nodes = self.provision(state, capacity=plan.extra)
        if self.spec.autoscaling:
            return self._start_autoscaler(state, nodes["head"])
        return self._start_ray(state, nodes)

    def provision(self, state: State, run: str | None = None,
                  capacity: Capacity | None = None) -> dict[str, api.Instance]:
        """Instances only: key, reconcile, launch what is missing, wait for active + SSH.

        `capacity` is the plan's listing, used for the first launch while it is fresh.
        Returns the instances by slot key (`head`, `worker-<i>`)."""
        run = run or uuid.uuid4().hex[:8]
        client = self.client()
        state.save()  # the cluster id is on disk before anything carries it
        key_name, _ = fleet.ensure_ssh_key(client, self.spec, state)
        firewall.sync_recorded(client, state, self.spec.ssh_source_ranges)
        listed = fleet.adopt_orphans(client, state, run, skip_autoscaled=self.spec.autoscaling)
        wanted = {s.key for s in self._slots(state)}
        attrs = {r.id: r.attrs for r in state.resources(fleet.INSTANCE)}
        live: dict[str, api.Instance] = {}
        drop = []
        for inst in sorted(listed, key=lambda i: i.status != "active"):
            if inst.status in api.GONE:
                continue
            key = fleet.slot_key(inst.name, attrs.get(inst.id)) or ""
            if key not in wanted or key in live or inst.status in api.FAILED:
                why = ("not in the spec any more" if key not in wanted else
                       "a duplicate" if key in live else inst.status)
                ui.info(f"terminating {inst.name} ({inst.id}): {why}")
                drop.append(inst.id)
            else:
                live[key] = inst
        fleet.terminate(client, state, drop)
        regions = {i.region for i in live.values()}
        if self.spec.file_system and not regions:
            regions = {self._file_system_region(client)}
        missing = [s for s in self._slots(state) if s.key not in live]
        if missing:
            types = capacity.fresh(client.limits.launch_interval) if capacity else None
            launcher = fleet.Launcher(
                client, self.spec, state, key_name, run, types,
                rulesets=lambda region: [self._ruleset(state, region)],
                extra_tags=(lambda slot: autoscale.head_tags(self.spec)) if self.spec.autoscaling
                else None)
            launcher.launch(missing, next(iter(regions)) if regions else None)
        nodes = fleet.wait_ready(client, state, lambda i: self._target(str(i.ip)),
                                 self.spec.boot_timeout_s)
        by_key = {}
        for inst in nodes.values():
            resource = state.update(fleet.INSTANCE, inst.id, ip=inst.ip, private_ip=inst.private_ip,
                                    status=inst.status)
            by_key[fleet.slot_key(inst.name, resource.attrs) or inst.name] = inst
        return by_key

    def _ruleset(self, state: State, region: str) -> str:
        return firewall.ensure(self.client(), state, region, self.spec.ssh_source_ranges)

    def _file_system_region(self, client: api.LambdaClient) -> str:
        """A file system lives in one region, which then is the cluster's."""
        name = self.spec.file_system
        found = next((f for f in client.file_systems() if f.name == name), None)
        if found is None:
            raise fleet.LambdaProvisionError(
                f"{self.spec.source}: file_system: no file system named {name!r} in the account; "
                "create it in the Lambda console or remove the key")
        if not any(c.region == found.region for c in self.spec.head.choices):
            raise fleet.LambdaProvisionError(
                f"{self.spec.source}: file_system: {name!r} is in {found.region} but no head "
                f"choice is; add a choice in {found.region}")
        return found.region

    def _start_ray(self, state: State, nodes: dict[str, api.Instance]) -> Endpoint:
        slots = self._slots(state)
        head = nodes[slots[0].key]
        head_target = self._target(str(head.ip))
        text = self._render(state, nodes)
        path = raycluster.config_path(self.spec.name)
        atomic_write(path, text)
        state.set_info(head_ip=head.ip, address=f"{head.ip}:{raycluster.GCS_PORT}",
                       dashboard_url=f"http://127.0.0.1:{raycluster.DASHBOARD_PORT}")
        expected = {name: {str(i.ip), str(i.private_ip)} for name, i in nodes.items()}
        if self.spec.tracking == "mlflow":
            tracking.ensure_credentials(self.spec.name)  # Ray's file_mounts copy it to every node
        if not self._all_alive(head_target, expected, auth.token_file(state)):
            raycluster.ray_up(self.spec, path, auth.client_env(state))
            workers = {s.name: str(nodes[s.key].ip) for s in slots[1:]}
            with ui.step("checking that the head can SSH to every worker"):
                problems = raycluster.head_reaches_workers(head_target, self.spec.ssh_user, workers)
            if problems:
                raise raycluster.RayClusterError("; ".join(problems))
            with raycluster.dashboard_tunnel(head_target) as url:
                raycluster.wait_all_alive(url, expected, self.spec.ray_timeout_s,
                                          auth.token_file(state))
        else:
            ui.info(f"cluster {self.spec.name!r} is already running with all {len(nodes)} node(s)")
        tracking_setup.start(self.spec, state, self.client(), head_target, head)
        autodown_setup.install(self.spec, state, head_target, head.id, self.client())
        return Endpoint(f"http://127.0.0.1:{raycluster.DASHBOARD_PORT} on the head {head.ip} "
                        "(SSH tunnel)", f"{head.ip}:{raycluster.GCS_PORT}", tunneled=True,
                        token_path=auth.token_file(state))

    def _start_autoscaler(self, state: State, head: api.Instance) -> Endpoint:
        """Ray and the autoscaler on the head (autoscale.py); wait for min_workers to join."""
        client = self.client()
        types = client.instance_types()
        text = self._render_autoscaler(state, head, types)
        atomic_write(paths.rendered_dir(self.spec.name) / autoscale.RENDERED, text)
        target = self._target(str(head.ip))
        token = auth.token_file(state)
        state.set_info(head_ip=head.ip, address=f"{head.ip}:{raycluster.GCS_PORT}",
                       dashboard_url=f"http://127.0.0.1:{raycluster.DASHBOARD_PORT}", autoscaling=True)
        running = self._all_alive(target, {"head": {str(head.ip), str(head.private_ip)}}, token)
        api_key = api.read_api_key()
        if not api_key:
            raise api.MissingApiKey("no Lambda API key to give the head's autoscaler")
        autoscale.bootstrap(self.spec, state, target, head, text, api_key, self._key_path(),
                            start=not running)
        if running:
            ui.info(f"cluster {self.spec.name!r} is already running; its autoscaler config is "
                    "updated in place")
        minimum = sum(k.min_workers for k in (self.spec.worker_types or {}).values())
        with raycluster.dashboard_tunnel(target) as url:
            raycluster.wait_workers(url, minimum, self.spec.ray_timeout_s, token)
        tracking_setup.start(self.spec, state, client, target, head)
        autodown_setup.install(self.spec, state, target, head.id, client)
        return Endpoint(f"http://127.0.0.1:{raycluster.DASHBOARD_PORT} on the head {head.ip} "
                        "(SSH tunnel)", f"{head.ip}:{raycluster.GCS_PORT}", tunneled=True,
                        token_path=token)

    def _all_alive(self, head: ssh.SshTarget, expected: dict[str, set[str]],
                   token_path: Path | None) -> bool:
        try:
            with raycluster.dashboard_tunnel(head) as url:
                ips = {n["ip"] for n in raycluster.alive_nodes(url, token_path)}
        except Exception:  # no Ray yet: that is what `ray up` is for
            return False
        return all(addrs & ips for addrs in expected.values())

    def created(self, state: State, before: frozenset[tuple[str, str]]) -> list[Resource]:
        """The instances this run launched (not those it adopted from an interrupted run: they
        stay in state for teardown), then its rulesets. Not its SSH key: free, and reused by the
        next `up`; teardown deletes it."""
        new = super().created(state, before)
        return ([r for r in new if r.kind == fleet.INSTANCE and r.attrs.get("run") != "adopted"]
                + [r for r in new if r.kind == firewall.FIREWALL])

    def remove_created(self, state: State, created: list[Resource]) -> None:
        """Terminate the run's instances; its rulesets go once no instance is left to use them."""
        fleet.terminate(self.client(), state, [r.id for r in created if r.kind == fleet.INSTANCE])
        if state.resources(fleet.INSTANCE):
            return
        rulesets = {r.id for r in state.resources(firewall.FIREWALL)}
        if rulesets and rulesets <= {r.id for r in created}:
            with contextlib.suppress(RayfleetError):  # else teardown deletes it
                firewall.delete(self.client(), state)
        state.clear_info()

    # --- status / connect -----------------------------------------------------------------------

    def status(self, state: State) -> ProviderStatus:
        bill = costs.tally(state, self.client().instances())
        scaled, orphans = bill.scaled, bill.orphans
        hourly, accrued, active, tracked = bill.hourly_cents, bill.accrued_cents, bill.active, bill.tracked
        warnings = [f"orphan {i.name} ({i.id}, {i.status}) carries this cluster's id but is not "
                    "in its state (an interrupted run?); `invoke teardown` terminates it, "
                    "`invoke up` adopts it" for i in orphans]
        warnings += [f"{i.name} ({i.id}) is named like this cluster but is not ours (no tag with "
                     "its id): left alone" for i in bill.lookalikes]
        regions = [str(r.attrs.get("region")) for r in state.resources(firewall.FIREWALL)]
        regions += [i.region for i in tracked.values()]
        warnings += [f"SSH exposure: open: {region} applies no firewall rules (every port of every "
                     "node is reachable from anywhere)" for region in firewall.unfiltered(regions)]
        in_state = len(state.resources(fleet.INSTANCE))
        total = in_state + len(scaled) + len(orphans)
        running = bool(in_state) and all(tracked.get(r.id) is not None and
                                         tracked[r.id].status == "active"
                                         for r in state.resources(fleet.INSTANCE)) \
            and "head_ip" in state.info
        summary = (f"{active}/{total} instance(s) active"
                   + (f" ({len(scaled)} autoscaled worker(s))" if self.spec.autoscaling else "")
                   + f", {costs.dollars(hourly)}/h, accrued {costs.dollars(accrued)} so far"
                   if total else "no instances")
        paying = [r for r in state.resources(fleet.INSTANCE)
                  if r.id in tracked and tracked[r.id].status not in api.GONE]
        billed_now = len(paying) + len(scaled) + len(orphans)
        launched = [r.attrs.get("launched_at") for r in paying]
        launched += [fleet.tag_time(i) for i in scaled + orphans]
        cost = costs.cost(hourly, accrued, billed_now, launched)
        status = ProviderStatus(running, summary, bill.rows, warnings, cost=cost)
        report = self.autodown_report(state, fetch=running,
                                      left=bool(billed_now) if in_state else None)
        return self.with_autodown(status, report, "all instances of the cluster are terminated")

    def cost_range(self, plan: Plan[Capacity] | None) -> CostRange | None:
        """$/h at min and max size from Lambda's prices (the head's and each type's first choice)
        in the plan's listing; None without a plan, an API key or prices."""
        types = plan.extra.types if plan is not None else None
        if types is None:
            return None
        workers = list((self.spec.worker_types or {}).values())
        if self.spec.autoscaling:
            cents = autoscale.hourly_range(self.spec, types)
            low_nodes = 1 + sum(k.min_workers for k in workers)
            high_nodes = 1 + sum(k.max_workers for k in workers)
        else:
            head = types.get(self.spec.head.choices[0].instance_type)
            worker = (types.get(self.spec.workers.choices[0].instance_type)
                      if self.spec.workers.choices else None)
            count = self.spec.workers.count
            cents = None if head is None else (
                head.price_cents_per_hour + count * (worker.price_cents_per_hour if worker else 0),) * 2
            low_nodes = high_nodes = 1 + count
        if cents is None:
            return None
        return CostRange(low_nodes, high_nodes, cents[0] / 100, cents[1] / 100, costs.SOURCE)

    # The head terminates its own instance: its last marker may never reach this machine.
    autodown_last_word_may_be_lost = True

    def autodown_fetch(self, state: State, left: bool | None) -> str | None:
        head_ip = state.info.get("head_ip")
        if left is False or not head_ip:
            return None  # a terminated head leaves nothing to read
        return autodown_remote.head_marker(self._target(str(head_ip)))

    def autodown_left(self, state: State) -> bool | None:
        """Whether the API lists any instance of the state as not terminated."""
        if not state.resources(fleet.INSTANCE):
            return None
        listed = {i.id: i for i in self.client().instances()}
        return any(r.id in listed and listed[r.id].status not in api.GONE
                   for r in state.resources(fleet.INSTANCE))

    uses_ssh = True

    def readiness(self) -> list[Readiness]:
        import os

        if api.read_api_key() is None:
            return [Readiness("API key", False, "none found",
                              f"set LAMBDA_API_KEY or put `api_key = ...` in ~/{api.KEY_FILE} "
                              "(create a key at https://cloud.lambda.ai/api-keys)")]
        source = "LAMBDA_API_KEY" if os.environ.get("LAMBDA_API_KEY", "").strip() else \
            f"~/{api.KEY_FILE}"
        rows = [Readiness("API key", True, source)]
        try:
            types = self.client().instance_types()
        except RayfleetError as exc:
            return [*rows, Readiness.failed("Lambda API", exc,
                                            "check the key and this machine's HTTPS access")]
        return [*rows, Readiness("Lambda API", True,
                                 f"{api.base_url()} answers ({len(types)} instance types)")]

    def _head_ip(self, state: State) -> str:
        head_ip = state.info.get("head_ip")
        if not head_ip or not state.resources(fleet.INSTANCE):
            raise ClusterNotRunningError(f"Lambda cluster {self.spec.name!r} has no running head; "
                                         "start it with `invoke up`")
        return str(head_ip)

    def copy_tracking(self, state: State) -> Path:
        if not state.info.get("tracking_head_store"):
            return super().copy_tracking(state)
        return tracking_setup.copy_now(self.spec, state, self._target(self._head_ip(state)))

    def head_access(self, state: State) -> HeadAccess:
        target = self._target(self._head_ip(state))
        return HeadAccess(target, str(target), auth.head_env(state, auth.NODE_TOKEN_PATH),
                          dashboard_port=raycluster.DASHBOARD_PORT,
                          client_port=raycluster.CLIENT_PORT)

    @contextlib.contextmanager
    def connect(self, state: State) -> Iterator[Endpoint]:
        """Tunnels to the head: dashboard, tracking server, Serve (tracking_remote.connect)."""
        head_ip = self._head_ip(state)
        with tracking_remote.connect(state, self._target(head_ip), raycluster.DASHBOARD_PORT,
                                     f"{head_ip}:{raycluster.GCS_PORT}",
                                     auth.token_file(state)) as endpoint:
            yield endpoint

    # --- teardown -------------------------------------------------------------------------------

    def teardown(self, state: State) -> None:
        """Terminate first (no GPU billed while Ray is cleaned up), then key, ruleset, local files.

        Every instance of this cluster is found through the API by its cluster-id tag (plus the
        ids in state, for clusters from before tags), not through the head. The head goes first:
        its autoscaler stops launching with it; then whatever carries our id, again and again
        until a listing a launch interval later shows none (a launch in flight when the head
        died may still appear)."""
        client = self.client()
        fleet.adopt_orphans(client, state, "teardown")
        heads = [r.id for r in state.resources(fleet.INSTANCE)
                 if fleet.slot_key(str(r.attrs.get("name")), r.attrs) == "head"]
        head_ip = state.info.get("head_ip")
        tracking_setup.save(self.spec, state, client, heads,
                            self._target(str(head_ip)) if head_ip else None)
        if self.spec.autoscaling and heads:
            fleet.terminate(client, state, heads)
        quiet_since = None
        while True:
            fleet.adopt_orphans(client, state, "teardown")
            left = [r.id for r in state.resources(fleet.INSTANCE)]
            if left:
                fleet.terminate(client, state, left)
                quiet_since = None
                continue
            if not self.spec.autoscaling:
                break
            if quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= client.limits.launch_interval * 1.5:
                break
            time.sleep(client.limits.request_interval)
        fleet.delete_ssh_keys(client, self.spec, state)
        firewall.delete(client, state)
        if not self.spec.ssh_key_name:
            tracking_remote.remove_keys(state, paths.keys_dir(self.spec.name))
        self._forget_launcher_state(state)
        state.clear_info()

    def _forget_launcher_state(self, state: State) -> None:
        """Ray's on-prem launcher keeps node state on this machine; a later cluster of the same
        name must not inherit it."""
        import tempfile

        for suffix in ("state", "lock"):
            with contextlib.suppress(OSError):
                name = raycluster.ray_cluster_name(self.spec, state.cluster_id)
                (Path(tempfile.gettempdir()) / "ray" / f"cluster-{name}.{suffix}").unlink()
