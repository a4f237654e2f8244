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
import dataclasses
import uuid
from pathlib import Path

from infra.core import auth, node_start, paths, remote_head, ssh, ui
from infra.core.costs import NodePrices
from infra.core.errors import ClusterNotRunningError, RayfleetError
from infra.core.head import HeadAccess
from infra.core.head_ssh import SshHead
from infra.core.state import Attrs, Resource, State
from infra.core.tracking import client as tracking
from infra.core.tracking import remote as tracking_remote
from infra.node import identity
from infra.node.files import atomic_write
from infra.node.lambda_cloud import api
from infra.providers.base import (
    CostRange,
    Endpoint,
    Plan,
    ProviderStatus,
    Readiness,
    with_autodown,
)
from infra.providers.base import Provider as BaseProvider
from infra.providers.features import HeadServices, Watcher, autodown_report
from infra.providers.lambda_cloud import (
    autoscale,
    costs,
    firewall,
    fleet,
    planning,
    provisioning,
    raycluster,
    services,
    users,
)
from infra.providers.lambda_cloud.planning import Capacity, place
from infra.providers.lambda_cloud.records import Firewall, Instance
from infra.providers.lambda_cloud.spec import Spec

__all__ = ["Capacity", "Provider", "Spec", "place"]  # Provider, Spec: re-exported by __init__.py


class Provider(BaseProvider[Spec, Capacity]):
    name = "lambda"
    job_reach = users.JOB_REACH
    #: `tracking: mlflow`: the server runs on the head (infra/core/tracking/remote.py); its store on
    #: the spec's `file_system` when named, else on the head, copied here by `teardown`.

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
        capacity, problems = planning.listing(self.client)
        types, slots = capacity.types, self._slots(state)
        notes: list[str] = []
        instances, hourly = planning.instance_rows(self.spec, state, slots, types)
        keys, others = planning.access_rows(self.spec, state, self._key_path(), notes)
        if types:
            notes += planning.cost_notes(self.spec, types, hourly, len(slots))
        if self.spec.tracking == "mlflow":
            notes.append(services.plan_note(self.spec))
        if self.spec.autoscaling:
            files = {autoscale.RENDERED: self._render_autoscaler(state, None, types)}
        else:
            files = {raycluster.CONFIG_FILE: self._render(state)}
        return Plan(resources=keys + instances + others, files=files, notes=notes,
                    problems=problems, extra=capacity)

    def _render_autoscaler(self, state: State | None, head: api.Instance | None,
                           types: dict[str, api.InstanceType] | None) -> str:
        scale = self._client.limits.scale if self._client else api.Limits.from_env().scale
        return planning.render_autoscaler(self.spec, state, head, types, scale)

    def _render(self, state: State | None, nodes: dict[str, api.Instance] | None = None) -> str:
        return planning.render_fixed(self.spec, state, self._slots(state), self._key_path(), nodes)

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
        """Instances only (provisioning.py); by slot key (`head`, `worker-<i>`)."""
        return provisioning.provision(self.client(), self.spec, state, self._slots(state),
                                      run or uuid.uuid4().hex[:8], capacity, self._target)

    def _start_ray(self, state: State, nodes: dict[str, api.Instance]) -> Endpoint:
        slots = self._slots(state)
        head = nodes[slots[0].key]
        head_at = self._head_at(str(head.ip))
        text = self._render(state, nodes)
        path = raycluster.config_path(self.spec.name)
        atomic_write(path, text)
        # The users folder of Ray's file mounts: the node users' scripts and the nodes' start.
        node_start.stage(path.parent, raycluster.node_conf(self.spec, raycluster.private_address(head)))
        state.set_info(head_ip=head.ip, address=f"{head.ip}:{raycluster.GCS_PORT}",
                       dashboard_url=f"http://127.0.0.1:{raycluster.DASHBOARD_PORT}")
        expected = {name: {str(i.ip), str(i.private_ip)} for name, i in nodes.items()}
        if self.spec.tracking == "mlflow":
            tracking.ensure_credentials(self.spec.name)  # Ray's file_mounts copy it to every node
        if not self._all_alive(head_at, expected, auth.token_file(state)):
            raycluster.ray_up(self.spec, path, auth.client_env(state))
            with ui.step("starting Ray's autoscaler (supervised) on the head"):
                self._start_monitor(head_at.target, replace=True)
            workers = {s.name: str(nodes[s.key].ip) for s in slots[1:]}
            with ui.step("checking that the head can SSH to every worker"):
                problems = raycluster.head_reaches_workers(head_at, self.spec.ssh_user, workers)
            if problems:
                raise raycluster.RayClusterError("; ".join(problems))
            with raycluster.dashboard_tunnel(head_at) as url:
                raycluster.wait_all_alive(url, expected, self.spec.ray_timeout_s,
                                          auth.token_file(state))
        else:
            ui.info(f"cluster {self.spec.name!r} is already running with all {len(nodes)} node(s)")
            self._start_monitor(head_at.target, replace=False)
        return self._announced(head, auth.token_file(state))

    def _start_monitor(self, head_target: ssh.SshTarget, replace: bool) -> None:
        """The v1 monitor that starts the fixed workers (and restarts those that stop), supervised,
        once `ray up` put the node package there: a new Ray (`replace`) gets a new one, a running
        cluster keeps its own, or gets one whatever ended it."""
        remote_head.start_ray_up_monitor(head_target, raycluster.GCS_PORT,
                                         self.spec.auth == "token", raycluster.activate(self.spec),
                                         replace=replace)

    def _start_autoscaler(self, state: State, head: api.Instance) -> Endpoint:
        """Ray and the autoscaler on the head (autoscale.py); wait for min_workers to join."""
        client = self.client()
        types = client.instance_types()
        text = self._render_autoscaler(state, head, types)
        atomic_write(paths.rendered_dir(self.spec.name) / autoscale.RENDERED, text)
        head_at = self._head_at(str(head.ip))
        token = auth.token_file(state)
        state.set_info(head_ip=head.ip, address=f"{head.ip}:{raycluster.GCS_PORT}",
                       dashboard_url=f"http://127.0.0.1:{raycluster.DASHBOARD_PORT}", autoscaling=True)
        running = self._all_alive(head_at, {"head": {str(head.ip), str(head.private_ip)}}, token)
        api_key = api.read_api_key()
        if not api_key:
            raise api.MissingApiKey("no Lambda API key to give the head's autoscaler")
        autoscale.bootstrap(self.spec, state, head_at, head, text, api_key, self._key_path(),
                            start=not running)
        if running:
            ui.info(f"cluster {self.spec.name!r} is already running; its autoscaler config is "
                    "updated in place")
        minimum = sum(k.min_workers for k in (self.spec.worker_types or {}).values())
        with raycluster.dashboard_tunnel(head_at) as url:
            raycluster.wait_workers(url, minimum, self.spec.ray_timeout_s, token)
        return self._announced(head, token)

    def _announced(self, head: api.Instance, token: Path | None) -> Endpoint:
        return remote_head.announced(f"http://127.0.0.1:{raycluster.DASHBOARD_PORT} on the head "
                                     f"{head.ip} (SSH tunnel)", f"{head.ip}:{raycluster.GCS_PORT}",
                                     token, tunneled=True)

    def _all_alive(self, head: HeadAccess, expected: dict[str, set[str]],
                   token_path: Path | None) -> bool:
        try:
            with raycluster.dashboard_tunnel(head) as url:
                ips = {n["ip"] for n in raycluster.alive_nodes(url, token_path)}
        except Exception:  # no Ray yet: that is what `ray up` is for
            return False
        return all(addrs & ips for addrs in expected.values())

    def created(self, state: State, before: frozenset[tuple[str, str]]) -> list[Resource[Attrs]]:
        """The instances this run launched (not those it adopted from an interrupted run: they
        stay in state for teardown), then its rulesets. Not its SSH key: free, and reused by the
        next `up`; teardown deletes it."""
        new = super().created(state, before)
        return ([r for r in new
                 if r.kind == Instance.KIND and r.typed(Instance).attrs.run != "adopted"]
                + [r for r in new if r.kind == Firewall.KIND])

    def remove_created(self, state: State, created: list[Resource[Attrs]]) -> None:
        """Terminate the run's instances; its rulesets go once no instance is left to use them."""
        fleet.terminate(self.client(), state, [r.id for r in created if r.kind == Instance.KIND])
        if state.resources(Instance):
            return
        rulesets = {r.id for r in state.resources(Firewall)}
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
        regions = [r.attrs.region for r in state.resources(Firewall)]
        regions += [i.region for i in tracked.values()]
        warnings += [f"SSH exposure: open: {region} applies no firewall rules (every port of every "
                     "node is reachable from anywhere)" for region in firewall.unfiltered(regions)]
        in_state = len(state.resources(Instance))
        total = in_state + len(scaled) + len(orphans)
        running = bool(in_state) and all(tracked.get(r.id) is not None and
                                         tracked[r.id].status == "active"
                                         for r in state.resources(Instance)) \
            and state.info.head_ip is not None
        summary = (f"{active}/{total} instance(s) active"
                   + (f" ({len(scaled)} autoscaled worker(s))" if self.spec.autoscaling else "")
                   + f", {costs.usd_from_cents(hourly)}/h, accrued {costs.usd_from_cents(accrued)} so far"
                   if total else "no instances")
        paying = [r for r in state.resources(Instance)
                  if r.id in tracked and tracked[r.id].status not in api.GONE]
        billed_now = len(paying) + len(scaled) + len(orphans)
        launched = [r.attrs.launched_at for r in paying]
        launched += [fleet.tag_time(i) for i in scaled + orphans]
        cost = costs.cost(hourly, accrued, billed_now, launched)
        status = ProviderStatus(running, summary, bill.rows, warnings, cost=cost)
        report = autodown_report(self, state, fetch=running,
                                 left=bool(billed_now) if in_state else None)
        return with_autodown(status, report, "all instances of the cluster are terminated")

    def cost_range(self, plan: Plan[Capacity] | None) -> CostRange | None:
        """$/h at min and max size from the plan's listing, each node type at its first
        choice's price; None without a plan or prices."""
        types = plan.extra.types if plan is not None else None
        if types is None:
            return None
        cost = planning.cost_range(self.spec, types)
        if cost is None or cost.min_hourly_usd is None:
            return cost
        by_type: dict[str, float] = {}
        if self.spec.autoscaling:
            wanted = {autoscale.HEAD_TYPE: self.spec.head.choices[0].instance_type,
                      **{name: kind.choices[0].instance_type
                         for name, kind in (self.spec.worker_types or {}).items()}}
            by_type = {name: types[kind].price_cents_per_hour / 100
                       for name, kind in wanted.items() if kind in types}
        return dataclasses.replace(cost, node_prices=NodePrices(autoscale.HEAD_TYPE, by_type,
                                                                cost.min_hourly_usd))

    def listed(self, state: State) -> bool | None:
        """Whether the API lists any instance of the state as not terminated."""
        if not state.resources(Instance):
            return None
        listed = {i.id: i for i in self.client().instances()}
        return any(r.id in listed and listed[r.id].status not in api.GONE
                   for r in state.resources(Instance))


    def readiness(self) -> list[Readiness]:
        found = api.api_key_source()
        if found is None:
            return [Readiness("API key", False, "none found",
                              f"set LAMBDA_API_KEY or put `api_key = ...` in ~/{api.LAMBDA_KEYS_FILE} "
                              "(create a key at https://cloud.lambda.ai/api-keys)")]
        rows = [Readiness("API key", True, found[1])]
        try:
            types = self.client().instance_types()
        except RayfleetError as exc:
            return [*rows, Readiness.failed("Lambda API", exc,
                                            "check the key and this machine's HTTPS access")]
        return [*rows, Readiness("Lambda API", True,
                                 f"{api.base_url()} answers ({len(types)} instance types)")]

    def _head_ip(self, state: State) -> str:
        head_ip = state.info.head_ip
        if not head_ip or not state.resources(Instance):
            raise ClusterNotRunningError(f"Lambda cluster {self.spec.name!r} has no running head; "
                                         "start it with `invoke up`")
        return str(head_ip)

    def head_access(self, state: State) -> HeadAccess:
        return self._head_at(self._head_ip(state), auth.head_env(state, auth.NODE_TOKEN_PATH))

    def _head_at(self, ip: str, env: dict[str, str] | None = None) -> SshHead:
        """The head at `ip` as its daemons run there: Ray's Python, the node env activated."""
        target = self._target(ip)
        return SshHead(target=target, where=str(target), env=env or {},
                       dashboard_port=raycluster.DASHBOARD_PORT,
                       client_port=raycluster.CLIENT_PORT, python=services.HEAD_PYTHON,
                       activate=raycluster.activate(self.spec))

    def head_services(self, state: State) -> HeadServices:
        """The tracking server on the head's private address (its public one where none is
        listed), its store on the spec's file system or the head; the watcher as the
        autoscaler's user, removing the cluster through the API with the key it holds."""
        head = self.head_access(state)
        record = next((r for r in state.resources(Instance)
                       if fleet.slot_key(r.attrs.name, r.attrs) == "head"), None)
        spec = self.spec
        config = None
        if spec.autodown is not None and record is not None:
            config = services.watcher_config(
                spec.name, state.cluster_id, spec.autodown.idle_minutes, record.id,
                raycluster.DASHBOARD_PORT, auth.NODE_TOKEN_PATH if auth.token_file(state) else None,
                None, self.client().limits.scale)
        listen = (record.attrs.private_ip or record.attrs.ip) if record else None
        return HeadServices(head=head, listen_host=str(listen or head.address),
                            store=lambda: services.store(spec, self.client()),
                            alive=lambda: self._head_listed(state),
                            watcher=Watcher(head, services.WATCHER_USER, config,
                                            services.watcher_secrets))

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
        heads = self._heads(state)
        if self.spec.autoscaling and heads:
            fleet.terminate(client, state, heads)
        fleet.terminate_until_quiet(client, state, self.spec.autoscaling)
        fleet.delete_ssh_keys(client, self.spec, state)
        firewall.delete(client, state)
        if not self.spec.ssh_key_name:
            tracking_remote.remove_keys(state, paths.keys_dir(self.spec.name))
        self._forget_launcher_state(state)
        state.clear_info()

    def _heads(self, state: State) -> list[str]:
        return [r.id for r in state.resources(Instance)
                if fleet.slot_key(r.attrs.name, r.attrs) == "head"]

    def _head_listed(self, state: State) -> bool:
        """Whether the API lists the head's instance as not terminated."""
        heads = self._heads(state)
        return any(i.id in heads and i.status not in api.GONE for i in self.client().instances())

    def _forget_launcher_state(self, state: State) -> None:
        """Ray's on-prem launcher keeps node state on this machine; a later cluster of the same
        name must not inherit it."""
        import tempfile

        for suffix in ("state", "lock"):
            with contextlib.suppress(OSError):
                name = raycluster.ray_cluster_name(self.spec, state.cluster_id)
                (Path(tempfile.gettempdir()) / "ray" / f"cluster-{name}.{suffix}").unlink()
