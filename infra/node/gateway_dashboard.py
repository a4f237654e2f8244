"""A member's answers to the dashboard's own background calls: their jobs' data, or a quiet empty.

Ray's dashboard page calls a dozen views on its own (task summaries, actors, events, a node's
workers, log files, Serve, Grafana's health); any answer but 200 leaves an error on the page, and
401/403 raise its token dialog. For a member each such call is answered here, in the shape the
page expects: filtered to their own jobs where Ray's answer names a job for each item (tasks,
actors, workers, placement groups, events, per-job log files, datasets), else a well-formed empty
answer (Serve, Grafana and Prometheus, profiling, another member's job). Platform events are
answered 404, as Ray answers them when none are configured: the page then hides that tab. Which
jobs are a member's comes only from the gateway's own record (`JobRoutes.mine`, by submission id,
then Ray's job list for their Ray job ids); an item Ray names no job for is nobody's, so it is
left out. What goes to Ray is a query the gateway rebuilt from the few parameters it reads, ids
checked, never the member's own string. Ray and what Ray brings only: it ships to heads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from infra.node import gateway_state as gs
from infra.node import gateway_target as gt
from infra.node.gateway_upstream import Upstream

#: Ray's ids in hex, as the dashboard sends them: a job 4 bytes, an actor 16, a task 24, a node 28.
_JOB_HEX = re.compile(r"[0-9a-f]{8}")
_ACTOR = re.compile(r"[0-9a-f]{32}")
_TASK = re.compile(r"[0-9a-f]{48}")
_NODE = re.compile(r"[0-9a-f]{56}")
#: Log files that belong to one job: its driver's (by submission id), its workers' (by Ray job
#: id: a worker serves one job only), its runtime env's setup and its core driver's.
_DRIVER_LOG = re.compile(r"job-driver-([A-Za-z0-9_-]{1,64})\.log")
_JOB_LOGS = (re.compile(r"worker-[0-9a-f]+-([0-9a-f]{8})-\d+\.(?:out|err)"),
             re.compile(r"runtime_env_setup-([0-9a-f]{8})\.log"),
             re.compile(r"python-core-driver-([0-9a-f]{8})_\d+\.log"))
#: The state API's list views the page reads, and the field naming each row's job.
_STATE_LISTS = {"/api/v0/tasks": "job_id", "/api/v0/actors": "job_id",
                "/api/v0/placement_groups": "creator_job_id"}
#: Of a state list's query, what is passed on (filters only narrow what Ray lists; the rows are
#: filtered by job here in any case).
_LIST_PARAMS = ("detail", "limit", "exclude_driver", "filter_keys", "filter_predicates",
                "filter_values")
_CLOSED = "not open to members of a shared cluster (rayfleet; docs/concepts/sharing.md)"
_EMPTY_LIST = {"total": 0, "num_after_truncation": 0, "num_filtered": 0, "result": [],
               "partial_failure_warning": "", "warnings": None}
#: Ray's own answer when no Serve instance runs.
EMPTY_SERVE: dict[str, Any] = {"controller_info": {}, "proxies": {}, "applications": {},
                               "target_capacity": None}


@dataclass
class Viewer:
    """Whose dashboard this is: their Ray job ids and submission ids (or every job's)."""

    sees_all: bool
    job_ids: set[str] = field(default_factory=set)
    submission_ids: set[str] = field(default_factory=set)

    def owns_job(self, job_id: Any) -> bool:
        return self.sees_all or (isinstance(job_id, str) and job_id in self.job_ids)

    def owns_log(self, filename: str) -> bool:
        """`filename` (no folder) is a log file of one of the viewer's jobs."""
        driver = _DRIVER_LOG.fullmatch(filename)
        if driver:
            return self.sees_all or driver.group(1) in self.submission_ids
        return any((m := p.fullmatch(filename)) and self.owns_job(m.group(1)) for p in _JOB_LOGS)


def envelope(msg: str = "", ok: bool = True, **data: Any) -> dict[str, Any]:
    """The dashboard's own answer shape (Ray's `rest_response`): `data` is Ray's `data`."""
    return {"result": ok, "msg": msg, "data": data}


def keep_own(value: Any, viewer: Viewer) -> Any:
    """`value` without any item that names a job not the viewer's (`jobId`, Ray's camel case):
    a node's workers and actors, a worker's stats, the actor table."""
    def others(item: Any) -> bool:
        return isinstance(item, dict) and "jobId" in item and not viewer.owns_job(item["jobId"])

    if isinstance(value, dict):
        return {k: keep_own(v, viewer) for k, v in value.items() if not others(v)}
    if isinstance(value, list):
        return [keep_own(v, viewer) for v in value if not others(v)]
    return value


class DashboardViews(Upstream):
    """Mixed into the gateway, after JobRoutes: what these answers read of it is declared here."""

    config: Any

    def mine(self, who: gs.Member, job_id: str) -> bool:
        raise NotImplementedError

    def scrub_bytes(self, data: bytes) -> bytes:
        raise NotImplementedError

    async def viewer(self, who: gs.Member) -> Viewer:
        if who.sees_all:
            return Viewer(sees_all=True)
        viewer = Viewer(sees_all=False)
        try:
            _, jobs = await self.ray_jobs()
        except Exception:  # Ray not answering: no job is known to be theirs, so nothing shows
            return viewer
        for job in jobs:
            submission = job.get("submission_id")
            if isinstance(submission, str) and self.mine(who, submission):
                viewer.submission_ids.add(submission)
                if isinstance(job.get("job_id"), str):
                    viewer.job_ids.add(job["job_id"])
        return viewer

    async def ray_json(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        """Ray's JSON answer at `path` with the query the gateway built, or None (Ray answered
        otherwise: the caller then answers empty)."""
        try:
            status, raw = await self.upstream_raw("GET", path, urlencode(query or []))
        except Exception:  # any failure to reach Ray: the page gets the empty answer
            return None
        if status != 200:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def dashboard_view(self, request: Any, who: gs.Member, target: gt.Target) -> Any:
        """The member's answer to one of the dashboard's calls, or None for a path not answered
        here (the gateway's other rules then apply)."""
        from aiohttp import web

        path = target.path
        handler = _EXACT.get(path)
        if handler is None:
            for prefix, prefixed in _PREFIXED:
                if path.startswith(prefix) and len(path) > len(prefix):
                    handler = prefixed
                    break
        if handler is None:
            return None
        query = dict(parse_qsl(target.query, keep_blank_values=True))
        multi = parse_qsl(target.query, keep_blank_values=True)
        answer = await handler(self, who, path, query, multi)
        if request.method == "HEAD":
            return web.Response(status=200, content_type="application/json")
        if isinstance(answer, str):  # a log file: what a job printed may hold a secret
            return web.Response(status=200, body=self.scrub_bytes(answer.encode()),
                                content_type="text/plain", charset="utf-8")
        return web.Response(status=200, content_type="application/json",
                            body=self.scrub_bytes(json.dumps(answer).encode()))

    # --- cluster-wide, filtered ----------------------------------------------------------------

    async def _nodes(self, who: gs.Member, path: str, query: dict[str, str],
                     multi: list[tuple[str, str]]) -> Any:
        view = query.get("view", "summary")
        if view.lower() not in ("summary", "hostnamelist"):
            return envelope(f"view {view!r} is {_CLOSED}", ok=False)
        answer = await self.ray_json("/nodes", [("view", view)])
        if answer is None:
            return envelope("Node summary fetched.", summary=[], nodeLogicalResources={})
        return keep_own(answer, await self.viewer(who))

    async def _node(self, who: gs.Member, path: str, query: dict[str, str],
                    multi: list[tuple[str, str]]) -> Any:
        node = path.removeprefix("/nodes/")
        answer = await self.ray_json(f"/nodes/{node}") if _NODE.fullmatch(node) else None
        if answer is None:
            return envelope("Node details fetched.", detail={})
        return keep_own(answer, await self.viewer(who))

    async def _actors(self, who: gs.Member, path: str, query: dict[str, str],
                      multi: list[tuple[str, str]]) -> Any:
        ids = query.get("ids")
        if ids is not None and not all(_ACTOR.fullmatch(i) for i in ids.split(",")):
            return envelope("All actors fetched.", actors={})
        answer = await self.ray_json("/logical/actors", None if ids is None else [("ids", ids)])
        if answer is None:
            return envelope("All actors fetched.", actors={})
        return keep_own(answer, await self.viewer(who))

    async def _actor(self, who: gs.Member, path: str, query: dict[str, str],
                     multi: list[tuple[str, str]]) -> Any:
        # Another member's actor is answered as Ray answers an actor it does not know.
        nobody = envelope("Actor details fetched.", detail=None)
        actor = path.removeprefix("/logical/actors/")
        answer = await self.ray_json(f"/logical/actors/{actor}") if _ACTOR.fullmatch(actor) else None
        detail = (answer.get("data") or {}).get("detail") if isinstance(answer, dict) else None
        if not isinstance(detail, dict) or not (await self.viewer(who)).owns_job(detail.get("jobId")):
            return nobody
        return answer

    async def _state_list(self, who: gs.Member, path: str, query: dict[str, str],
                          multi: list[tuple[str, str]]) -> Any:
        answer = await self.ray_json(path, [(k, v) for k, v in multi if k in _LIST_PARAMS])
        listed = answer.get("data", {}).get("result") if isinstance(answer, dict) else None
        if not isinstance(listed, dict) or not isinstance(listed.get("result"), list):
            return envelope(result=dict(_EMPTY_LIST))
        viewer, key = await self.viewer(who), _STATE_LISTS[path]
        rows = [r for r in listed["result"] if isinstance(r, dict) and viewer.owns_job(r.get(key))]
        listed = {**listed, "result": rows}
        if not viewer.sees_all:
            listed.update(total=len(rows), num_after_truncation=len(rows), num_filtered=len(rows))
        return {**answer, "data": {**answer["data"], "result": listed}}

    # --- one job's views: theirs forwarded, another's empty ------------------------------------

    async def _job_filter(self, who: gs.Member, multi: list[tuple[str, str]]) -> str | None:
        """The Ray job id of a query filtering on exactly one job (`job_id` `=` id) when that job
        is the viewer's, else None."""
        keys = [v for k, v in multi if k == "filter_keys"]
        predicates = [v for k, v in multi if k == "filter_predicates"]
        values = [v for k, v in multi if k == "filter_values"]
        if keys != ["job_id"] or predicates != ["="] or len(values) != 1:
            return None
        job = values[0]
        return job if _JOB_HEX.fullmatch(job) and (await self.viewer(who)).owns_job(job) else None

    async def _summary(self, who: gs.Member, path: str, query: dict[str, str],
                       multi: list[tuple[str, str]]) -> Any:
        by = "lineage" if query.get("summary_by") == "lineage" else "func_name"
        job = await self._job_filter(who, multi)
        if job is not None:
            answer = await self.ray_json(path, [("filter_keys", "job_id"),
                                                ("filter_predicates", "="),
                                                ("filter_values", job), ("summary_by", by)])
            if answer is not None:
                return answer
        summary = {"summary": [] if by == "lineage" else {}, "total_tasks": 0,
                   "total_actor_tasks": 0, "total_actor_scheduled": 0, "summary_by": by}
        return envelope(result={**_EMPTY_LIST, "result": {"node_id_to_summary":
                                                          {"cluster": summary}}})

    async def _events(self, who: gs.Member, path: str, query: dict[str, str],
                      multi: list[tuple[str, str]]) -> Any:
        job = query.get("job_id")
        viewer = await self.viewer(who)
        if job is not None:
            if _JOB_HEX.fullmatch(job) and viewer.owns_job(job):
                asked = [("job_id", job)] + ([("view", "pipeline")]
                                             if query.get("view") == "pipeline" else [])
                answer = await self.ray_json("/events", asked)
                if answer is not None:
                    return answer
            return envelope("Job events fetched.", jobId=job, events=[])
        answer = await self.ray_json("/events")
        events = answer.get("data", {}).get("events") if isinstance(answer, dict) else None
        if not isinstance(events, dict):
            return envelope("All events fetched.", events={})
        return envelope("All events fetched.",
                        events={k: v for k, v in events.items() if viewer.owns_job(k)})

    async def _datasets(self, who: gs.Member, path: str, query: dict[str, str],
                        multi: list[tuple[str, str]]) -> Any:
        job = path.removeprefix("/api/data/datasets/")
        if _JOB_HEX.fullmatch(job) and (await self.viewer(who)).owns_job(job):
            answer = await self.ray_json(f"/api/data/datasets/{job}")
            if answer is not None:
                return answer
        return {"datasets": []}

    async def _timeline(self, who: gs.Member, path: str, query: dict[str, str],
                        multi: list[tuple[str, str]]) -> Any:
        job = query.get("job_id", "")
        if _JOB_HEX.fullmatch(job) and (await self.viewer(who)).owns_job(job):
            answer = await self.ray_json(path, [("download", "1"), ("job_id", job)])
            if answer is not None:
                return answer
        return []

    # --- log files: the viewer's jobs' own --------------------------------------------------------

    async def _log_list(self, who: gs.Member, path: str, query: dict[str, str],
                        multi: list[tuple[str, str]]) -> Any:
        node = query.get("node_id", "")
        answer = None
        if _NODE.fullmatch(node):
            asked = [("node_id", node)] + ([("glob", query["glob"])] if "glob" in query else [])
            answer = await self.ray_json(path, asked)
        files = answer.get("data", {}).get("result") if isinstance(answer, dict) else None
        if not isinstance(files, dict):
            return envelope(result={})
        viewer = await self.viewer(who)
        kept = {category: [f for f in names if isinstance(f, str) and viewer.owns_log(f)]
                for category, names in files.items() if isinstance(names, list)}
        return envelope(result={k: v for k, v in kept.items() if v})

    async def _log_file(self, who: gs.Member, path: str, query: dict[str, str],
                        multi: list[tuple[str, str]]) -> Any:
        """A log file's text (the page shows it as it is): a file of the viewer's job by name,
        or the logs of one of their actors or tasks; anything else one line saying so."""
        viewer = await self.viewer(who)
        shown: list[tuple[str, str]] = [
            (k, query[k]) for k in ("lines", "filter_ansi_code", "suffix", "attempt_number")
            if k in query and re.fullmatch(r"[A-Za-z0-9_-]{1,16}", query[k])]
        asked: list[tuple[str, str]] | None = None
        node, name = query.get("node_id", ""), query.get("filename")
        if name is not None:
            if _NODE.fullmatch(node) and viewer.owns_log(name):
                asked = [("node_id", node), ("filename", name)]
        elif "actor_id" in query and _ACTOR.fullmatch(query["actor_id"]):
            actor = await self.ray_json(f"/logical/actors/{query['actor_id']}")
            detail = (actor.get("data") or {}).get("detail") if isinstance(actor, dict) else None
            if isinstance(detail, dict) and viewer.owns_job(detail.get("jobId")):
                asked = [("actor_id", query["actor_id"])]
        elif "task_id" in query and _TASK.fullmatch(query["task_id"]):
            task = await self.ray_json("/api/v0/tasks", [
                ("detail", "1"), ("limit", "1"), ("filter_keys", "task_id"),
                ("filter_predicates", "="), ("filter_values", query["task_id"])])
            rows = ((task.get("data") or {}).get("result") or {}).get("result") \
                if isinstance(task, dict) else None
            if isinstance(rows, list) and rows and all(
                    isinstance(r, dict) and viewer.owns_job(r.get("job_id")) for r in rows):
                asked = [("task_id", query["task_id"])]
        if asked is None:
            return f"This log is {_CLOSED}: members read the logs of their own jobs only.\n"
        try:
            status, raw = await self.upstream_raw("GET", path, urlencode(asked + shown))
        except Exception:  # any failure to reach Ray, said in place of the log
            return "Ray did not answer for this log; try again.\n"
        if status != 200:
            return f"Ray answered {status} for this log.\n"
        return raw.decode("utf-8", "replace")

    # --- views that cannot be filtered by member: empty ------------------------------------------

    async def _serve(self, *_: Any) -> Any:
        return dict(EMPTY_SERVE)

    async def _metrics_health(self, *_: Any) -> Any:
        return envelope(f"Grafana and Prometheus are {_CLOSED}", ok=False)

    async def _profiling(self, *_: Any) -> Any:
        return envelope(f"profiling is {_CLOSED}", profilingEnabled=False)



_Handler = Callable[[DashboardViews, gs.Member, str, dict[str, str], list[tuple[str, str]]],
                    Awaitable[Any]]
_V = DashboardViews
#: The dashboard's calls answered here, by path; then by a path's start (an id follows).
_EXACT: dict[str, _Handler] = {
    "/nodes": _V._nodes, "/logical/actors": _V._actors, "/events": _V._events,
    "/api/v0/tasks/summarize": _V._summary, "/api/v0/tasks/timeline": _V._timeline,
    "/api/v0/tasks": _V._state_list, "/api/v0/actors": _V._state_list,
    "/api/v0/placement_groups": _V._state_list,
    "/api/v0/logs": _V._log_list, "/api/v0/logs/file": _V._log_file,
    "/api/serve/applications/": _V._serve, "/api/serve/applications": _V._serve,
    "/api/grafana_health": _V._metrics_health, "/api/prometheus_health": _V._metrics_health,
    "/api/profiling_enabled": _V._profiling,
}
_PREFIXED: tuple[tuple[str, _Handler], ...] = (
    ("/nodes/", _V._node), ("/logical/actors/", _V._actor),
    ("/api/data/datasets/", _V._datasets))
