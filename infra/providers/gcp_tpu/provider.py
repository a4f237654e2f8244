"""The `gcp-tpu` provider: Ray's own GCP cluster launcher, fenced in by rayfleet.

`ray up` creates the head and its autoscaler creates the workers, so rayfleet cannot list them in
advance. Instead every node carries this cluster's labels, state records the Ray cluster (project,
zone, config) *before* `ray up` runs, and teardown ends with a sweep of the Compute and TPU APIs
for those labels until nothing is left. The dashboard is reached through an SSH tunnel unless the
spec names source ranges, which get a firewall rule of their own (recorded, removed at teardown).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import Any

from infra.core import auth, jobs, node_start, paths, privilege, remote_head, ssh, ui
from infra.core.errors import ClusterNotRunningError, UsageError
from infra.core.head import HeadAccess
from infra.core.head_ssh import SshHead
from infra.core.state import Attrs, Resource, State
from infra.core.tracking import client as tracking
from infra.node.files import atomic_write
from infra.node.gcp_tpu.api import ApiOptions, Gcp, GcpError
from infra.providers.base import (
    CostRange,
    Endpoint,
    Plan,
    ProviderStatus,
    Readiness,
    with_autodown,
)
from infra.providers.base import Provider as BaseProvider
from infra.providers.features import HeadServices, autodown_report
from infra.providers.gcp_tpu import (
    capacity,
    config,
    firewall,
    heads,
    launcher,
    planning,
    preflight,
    removal,
    services,
    slices,
    users,
    view,
)
from infra.providers.gcp_tpu.launcher import MonitorStarter, RayRunner
from infra.providers.gcp_tpu.planning import Preflight
from infra.providers.gcp_tpu.records import Cluster, Firewall, Queued, SshKey
from infra.providers.gcp_tpu.spec import Spec

GCS_PORT = 6379
#: How long teardown waits for the APIs to show no node of the cluster.
SWEEP_TIMEOUT_S = removal.SWEEP_TIMEOUT_S


def data_dir(cluster: str) -> Path:
    """The config `ray up` got; teardown uses this copy, not a re-render of a changed spec."""
    return paths.home() / "gcp-tpu" / cluster


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Provider(BaseProvider[Spec, Preflight]):
    name = "gcp-tpu"
    job_reach = users.JOB_REACH
    #: `tracking: mlflow`: the server runs on the head (infra/core/tracking/remote.py); its store goes
    #: with the head, and `teardown` copies it here first.

    def __init__(self, spec: Spec, *, ray: RayRunner | None = None,
                 api_options: ApiOptions | None = None, ssh_port: int = 22,
                 head_monitor: MonitorStarter | None = None) -> None:
        """`ray` runs Ray's CLI (tests pass a fake), `api_options` say how to reach Google
        (default: RAYFLEET_GCP_API_ENDPOINT or Google itself), `ssh_port` is the head's sshd.
        `head_monitor` starts Ray's autoscaler on the head once `ray up` ran (the start commands
        of a real `ray up` leave that to us): tests whose `ray` is a stand-in and whose head is
        this machine's sshd pass the stand-in's, since ours would make the node's users here."""
        super().__init__(spec)
        self._ray: RayRunner = ray or launcher.run_ray
        self._head_monitor: MonitorStarter = head_monitor or self._start_monitor
        self._options = api_options or ApiOptions.from_env()
        self._ssh_port = ssh_port

    # --- helpers ----------------------------------------------------------------------------

    def _api(self, project: str, credentials_file: str | None) -> tuple[Gcp, str | None]:
        """A client for `project` and the key file `ray` must be told about; raises if no creds."""
        from infra.node.gcp_tpu.api import find_credentials

        found = find_credentials(credentials_file, self.spec.source)
        return Gcp(project, found, self._options), found.file

    def _label_id(self, state: State | None) -> str:
        """The cluster id our labels carry: the recorded one for a running cluster (the name, for
        clusters from before ids), else the state's id once the state exists."""
        if state is None:
            return config.ID_PLACEHOLDER
        recorded = state.find(Cluster, self.spec.name)
        if recorded is not None:
            return (recorded.attrs.label_id or recorded.id)
        return state.cluster_id if state.path.exists() else config.ID_PLACEHOLDER

    def _render(self, spec: Spec, public_key: str, private_key: Path, state: State | None) -> str:
        text = config.render_cluster_yaml(
            spec, public_key, str(private_key), cluster_id=self._label_id(state),
            owner=state.owner if state is not None else "")
        config.check_with_ray(text, f"{spec.source} -> {config.FILE_NAME}")
        return text

    def _preflight(self, api: Gcp, ours: bool) -> preflight.Report:
        zones = ", ".join(self.spec.candidate_zones)
        with ui.step(f"pre-flight checks for project {self.spec.project}, zone(s) {zones}"):
            return preflight.run(self.spec, api, ours)

    def _in_zone(self, zone: str) -> Spec:
        """The spec with `zone` (one of `zones:`) as its zone, for rendering and lookups there; a
        copy: the provider's own spec never changes."""
        return self.spec if zone == self.spec.zone else self.spec.model_copy(update={"zone": zone})

    def _zone_for(self, state: State | None, report: preflight.Report | None) -> str:
        """A running cluster stays in its recorded zone; else pre-flight's choice, else `zone`."""
        recorded = state.find(Cluster, self.spec.name) if state is not None else None
        if recorded is not None and recorded.attrs.zone in self.spec.candidate_zones:
            return recorded.attrs.zone
        return planning.zone_order(self.spec, report)[0]

    # --- plan ---------------------------------------------------------------------------------

    def plan(self, state: State | None) -> Plan[Preflight]:
        key_dir = paths.keys_dir(self.spec.name)
        public = key_dir / f"{ssh.KEY_NAME}.pub"
        public_key = (public.read_text().strip() if public.exists()
                      else f"ssh-ed25519 <generated-by-invoke-up> rayfleet-{self.spec.name}")
        report, checks = self._plan_preflight(state)
        spec = self._in_zone(self._zone_for(state, report))
        text = self._render(spec, public_key, key_dir / ssh.KEY_NAME, state)
        resources, notes = planning.rows(spec, state, report)
        failed, passed = planning.split_checks(checks)
        notes += passed
        # node.conf: how the nodes start Ray (the YAML's start lines name node.sh, which reads it).
        files = {config.FILE_NAME: text, node_start.CONF_NAME: config.node_conf(spec)}
        return Plan(resources=resources, files=files, notes=notes,
                    problems=failed, extra=Preflight(report, planning.zone_order(self.spec, report)))

    def _plan_preflight(self, state: State | None) -> tuple[preflight.Report | None, list[str]]:
        """Pre-flight and its notes: `invoke plan` reports problems, `up` refuses to start on them."""
        try:
            api, _ = self._api(self.spec.project, self.spec.credentials_file)
            report = preflight.run(self.spec, api, bool(state and state.resources(Cluster)))
        except GcpError as exc:
            return None, [f"{planning.FAILED}{exc}"]
        return report, [f"pre-flight ✓ {line}" for line in report.passed] + [
            f"pre-flight warning: {line}" for line in report.warnings]

    # --- up -----------------------------------------------------------------------------------

    def create(self, state: State, plan: Plan[Preflight]) -> Endpoint:
        spec = self.spec
        api, key_file = self._api(spec.project, spec.credentials_file)  # first: creates nothing
        existing = state.resources(Cluster)
        for r in existing:
            if r.attrs.project != spec.project or r.attrs.zone not in spec.candidate_zones:
                raise UsageError(
                    f"{spec.source}: the cluster runs in {r.attrs.project}/{r.attrs.zone}; "
                    "run `invoke teardown` before moving it to another project or zone")
        report = plan.extra.report
        zones = list(plan.extra.zones)
        if report is None:  # pre-flight failed in `plan`: again, to stop on its error
            report = self._preflight(api, bool(existing))
            zones = list(planning.zone_order(spec, report))
        # A running cluster stays where it is; a new one tries the usable zones in order.
        if existing:
            zones = [existing[0].attrs.zone]
        for line in report.passed:
            ui.info(f"✓ {line}")
        for warning in report.warnings:
            ui.warn(warning)
        keypair = ssh.ensure_keypair(spec.name)
        state.add(str(keypair.private_path.parent), SshKey())
        if spec.tracking == "mlflow":
            tracking.ensure_credentials(spec.name)  # Ray's file_mounts copy it to every node
        firewall.reconcile(api, state, self._in_zone(zones[0]), self._wait)
        for index, zone in enumerate(zones):
            spec = self._in_zone(zone)
            text, config_path = self._write_config(spec, keypair, state)
            # Recorded before `ray up`: from here on, anything Ray creates is teardown's to
            # find, in this zone.
            label_id = self._label_id(state)
            state.add(spec.name, Cluster(project=spec.project, zone=zone,
                                         config=str(config_path), credentials_file=key_file,
                                         ssh_user=spec.ssh_user,
                                         dashboard_port=spec.dashboard.port, label_id=label_id))
            try:
                endpoint = self._launch(spec, api, state, text, config_path, key_file)
                if not existing and len(zones) > 1:
                    # min_workers refused for capacity move `up` on like the head does.
                    self._wait_min_workers(spec, api, state, zone, label_id)
                self._queue_slices(spec, api, state, keypair)
                return endpoint
            except GcpError as exc:
                if existing or not launcher.is_capacity(exc) or len(zones) == 1:
                    raise
                self._leave_zone(api, state, key_file)
                if index + 1 == len(zones):
                    raise GcpError(
                        f"gcp-tpu: no zone had capacity for the head (tried "
                        f"{', '.join(zones)}: {exc.reason}); nothing is left in them; try "
                        f"again later or add zones to zones: in {spec.source}",
                        reason=exc.reason) from None
                ui.warn(f"zone {zone} has no capacity for the head or its min_workers "
                        f"({exc.reason}); removed "
                        f"what it left there; trying zone {zones[index + 1]}")
        raise AssertionError("unreachable: the zone loop returns or raises")

    def remove_created(self, state: State, created: list[Resource[Attrs]]) -> None:
        """All of the state: teardown. Else (`up` of a running cluster) its new firewall rule."""
        mine = {(r.kind, r.id) for r in created}
        if all((r.kind, r.id) in mine for r in state.resources()):
            self.teardown(state)
            return
        if any(r.kind != Firewall.KIND for r in created):
            super().remove_created(state, created)  # refuses: these stay for `invoke teardown`
        rules = [r.typed(Firewall) for r in created]
        api, _ = self._api(rules[0].attrs.project, self.spec.credentials_file)
        for rule in rules:
            firewall.delete(api, state, rule, self._wait)

    def _write_config(self, spec: Spec, keypair: ssh.KeyPair, state: State) -> tuple[str, Path]:
        """Render the Ray config for `spec`'s zone; write the rendered and the launch copy."""
        text = self._render(spec, keypair.public_key, keypair.private_path, state)
        atomic_write(paths.rendered_dir(spec.name) / config.FILE_NAME, text)
        # The users folder of Ray's file mounts: the node users' scripts and the nodes' start.
        node_start.stage(paths.rendered_dir(spec.name), config.node_conf(spec))
        config_path = data_dir(spec.name) / config.FILE_NAME
        atomic_write(config_path, text)
        return text, config_path

    def _leave_zone(self, api: Gcp, state: State, key_file: str | None) -> None:
        """Remove whatever a zone that refused the head left (ray down, then the label sweep,
        which forgets the cluster's record only once the APIs list nothing there)."""
        cluster = state.find(Cluster, self.spec.name)
        assert cluster is not None
        self._ray_down(state, cluster, key_file)
        self._sweep(api, state, cluster)

    def _launch(self, spec: Spec, api: Gcp, state: State, text: str, config_path: Path,
                key_file: str | None) -> Endpoint:
        cluster = state.find(Cluster, spec.name)
        assert cluster is not None
        head = view.head(api, spec.zone, self._label_id(state), spec.name)
        ran_ray_up = False
        if (head is not None and head.get("status") == "RUNNING"
                and cluster.attrs.config_sha256 == _sha(text) and self._answers(state)):
            ui.info(f"cluster {spec.name!r} is already running with this config")
        else:
            ran_ray_up = True
            log = paths.home() / "logs" / spec.name / "ray-up.log"
            with ui.step(f"ray up (head, then min_workers; log: {log})") as step:
                code = self._ray(launcher.up_args(config_path),
                                 launcher.ray_env(key_file, auth.client_env(state)), log,
                                 step.detail)
                if code != 0:
                    raise launcher.failure("up", code, log)
            state.update(Cluster, spec.name, config_sha256=_sha(text))
            head = view.head(api, spec.zone, self._label_id(state), spec.name)
        if head is None:
            raise GcpError(f"gcp-tpu: `ray up` succeeded but no head VM labelled "
                           f"{config.CLUSTER_LABEL}={self._label_id(state)} is in {spec.zone}; see "
                           f"`invoke status` and run `invoke up` again")
        external, internal, direct = heads.record(spec, state, head, GCS_PORT)
        ui.wait_for(lambda step: True if self._answers(state, step) else None,
                    f"Ray dashboard on {external} to answer through an SSH tunnel",
                    timeout=spec.ready_timeout_s, interval=2,
                    hint=f"see the head's logs: ray attach {config_path}, /tmp/ray/session_latest, "
                         f"{privilege.MONITOR_LOGS} (as root)")
        recorded = state.find(Cluster, spec.name)
        assert recorded is not None
        # Ray's autoscaler, supervised (the node package is on the head only now): a new Ray
        # gets a new monitor; a running cluster keeps its own, or gets one if it had none.
        with ui.step("starting Ray's autoscaler (supervised) on the head"):
            self._head_monitor(self._head_target(recorded), ran_ray_up)
        return remote_head.announced(direct or f"SSH tunnel to {spec.ssh_user}@{external}",
                                     f"{internal}:{GCS_PORT}", None)

    def _start_monitor(self, target: ssh.SshTarget, replace: bool) -> None:
        remote_head.start_ray_up_monitor(target, GCS_PORT, self.spec.auth == "token",
                                         users.ACTIVATE, replace=replace)

    def _wait_min_workers(self, spec: Spec, api: Gcp, state: State, zone: str,
                          label_id: str) -> None:
        cluster = state.find(Cluster, spec.name)
        assert cluster is not None
        capacity.wait_min_workers(api, spec, zone, config.sweep_labels(label_id, spec.name),
                                  self._head(state, cluster))

    def _queue_slices(self, spec: Spec, api: Gcp, state: State, keypair: ssh.KeyPair) -> None:
        """Queue the spec's TPU slices (each recorded first) and start the head's joiner."""
        if not spec.queued_slices:
            return
        cluster = state.find(Cluster, spec.name)
        assert cluster is not None
        requests = slices.slice_requests(spec, state.cluster_id, state.owner, keypair.public_key)
        slices.queue_all(api, state, requests, api.options.poll_interval)
        slices.install_joiner(self._daemon_head(cluster), spec, state, requests,
                              f"{cluster.attrs.head_internal_ip}:{GCS_PORT}")

    def _head_target(self, cluster: Resource[Cluster]) -> ssh.SshTarget:
        return heads.target(self.spec, cluster, self._ssh_port)

    def _answers(self, state: State, step: ui.Step | None = None) -> bool:
        try:
            with self.connect(state) as endpoint:
                return jobs.dashboard_ready(endpoint.dashboard_url, endpoint.token_path, timeout=5)
        except (ssh.SshError, ClusterNotRunningError) as exc:
            if step is not None:
                step.detail(str(exc))
            return False

    def _wait(self, operations: list[dict[str, Any]], what: str, api: Gcp,
              timeout: float = 300) -> None:
        view.wait_operations(operations, what, api, timeout)

    # --- status and connect --------------------------------------------------------------------

    def status(self, state: State) -> ProviderStatus:
        clusters, rules = state.resources(Cluster), state.resources(Firewall)
        if not clusters and not rules:
            return ProviderStatus(False, "not up")
        api, _ = self._api(self._project(clusters, rules), self._credentials(clusters))
        status = view.status(self.spec, state, api, self._daemon_head)
        if not clusters:
            return status
        listed = [r for r in status.rows if r.get("kind") != "firewall rule"]
        report = autodown_report(self, state, fetch=status.running, left=bool(listed))
        where = f"{clusters[0].attrs.project}/{clusters[0].attrs.zone}"
        return with_autodown(status, report, f"no VM or TPU of the cluster is left in {where}")

    def listed(self, state: State) -> bool | None:
        """Whether the APIs list any VM or TPU node with the recorded clusters' labels."""
        clusters = state.resources(Cluster)
        if not clusters:
            return None
        api = self._api(clusters[0].attrs.project, clusters[0].attrs.credentials_file
                        or self.spec.credentials_file)[0]
        return any(services.nodes_left(api, cluster) for cluster in clusters)


    def readiness(self) -> list[Readiness]:
        return view.readiness(self.spec, self._options)

    def _project(self, clusters: list[Resource[Cluster]], rules: list[Resource[Firewall]],
                 requests: list[Resource[Queued]] = []) -> str:  # noqa: B006 (never changed)
        """The project the cluster's first recorded resource is in (the spec's when none says)."""
        found = [r.attrs.project for r in clusters] + [r.attrs.project for r in rules] + [
            r.attrs.project for r in requests]
        return next((p for p in found if p), self.spec.project)

    def _credentials(self, clusters: list[Resource[Cluster]]) -> str | None:
        recorded = clusters[0].attrs.credentials_file if clusters else None
        return recorded or self.spec.credentials_file

    def head_access(self, state: State) -> HeadAccess:
        return self._head(state, heads.reachable(self.spec, state))

    def _head(self, state: State | None, cluster: Resource[Cluster]) -> SshHead:
        return heads.head(self.spec, state, cluster, self._ssh_port)

    def _daemon_head(self, cluster: Resource[Cluster]) -> SshHead:
        return heads.daemon_head(self.spec, cluster, self._ssh_port)

    def head_services(self, state: State) -> HeadServices:
        cluster = heads.reachable(self.spec, state)
        spec = self._in_zone(str(cluster.attrs.zone)) if cluster.attrs.zone else self.spec
        return services.head_services(spec, state, cluster, self._head(state, cluster),
                                      self._daemon_head(cluster),
                                      alive=lambda: self._nodes_left(cluster) > 0)

    def _nodes_left(self, cluster: Resource[Cluster]) -> int:
        api, _ = self._api(self._project([cluster], []), self._credentials([cluster]))
        return services.nodes_left(api, cluster)

    # --- teardown -----------------------------------------------------------------------------

    def teardown(self, state: State) -> None:
        clusters, rules = state.resources(Cluster), state.resources(Firewall)
        requests = state.resources(Queued)
        if clusters or rules or requests:
            api, key_file = self._api(self._project(clusters, rules, requests),
                                      self._credentials(clusters))
            head = next((c for c in clusters if c.attrs.head_ip), None)
            if head is not None and (requests or self.spec.queued_slices):
                # First the joiner, so it queues nothing new while its requests go.
                slices.stop_joiner(self._daemon_head(head))
            if requests or self.spec.queued_slices:
                slices.teardown(api, self.spec, state)
            for cluster in clusters:
                if services.nodes_left(api, cluster):
                    self._ray_down(state, cluster, key_file)
                else:  # e.g. the cluster removed itself: nothing for `ray down` to stop
                    launcher.remove_config_caches(self.spec.name, str(cluster.attrs.project))
                self._sweep(api, state, cluster)
            for rule in rules:
                firewall.delete(api, state, rule, self._wait)
        for key in state.resources(SshKey):
            shutil.rmtree(key.id, ignore_errors=True)
            state.remove(SshKey, key.id)
        shutil.rmtree(data_dir(self.spec.name), ignore_errors=True)
        state.clear_info()

    def _ray_down(self, state: State, cluster: Resource[Cluster], key_file: str | None) -> None:
        removal.ray_down(self._ray, self.spec.name, state, cluster, key_file)

    def _sweep(self, api: Gcp, state: State, cluster: Resource[Cluster]) -> None:
        removal.sweep(api, state, cluster)

    # --- cost (issue 15) -------------------------------------------------------------------

    def cost_range(self, plan: Plan[Preflight] | None) -> CostRange | None:
        """$/h at min and max size and of each node type (None when one is not in the table),
        estimated from the dated price table in prices.py."""
        from infra.providers.gcp_tpu import prices

        return dataclasses.replace(prices.cost_range(self.spec),
                                   node_prices=prices.node_prices(self.spec))
