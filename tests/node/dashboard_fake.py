"""Ray's dashboard's own views as the gateway bed's upstream answers them: the shapes of Ray 2.60's
`rest_response` envelope (`{"result", "msg", "data"}`), its state API lists and summaries, its
node, actor and event tables, its log list and log files, with one item of each for ann's job
(Ray job 01000000), bo's (02000000), a driver started inside the cluster (03000000) and Ray's own
processes. Only GET; the filters of the state API's `=` predicate are honoured as Ray does."""

from __future__ import annotations

from typing import Any

#: The cluster's Ray token (tests/node/gateway_bed.py): ann's worker printed it.
CLUSTER_TOKEN = "the-cluster-ray-token"
#: Ray's job ids of the bed's jobs (tests/node/gateway_bed.py JOBS).
ANN_JOB, BO_JOB, INSIDE_JOB = "01000000", "02000000", "03000000"
NODE = "ab" * 28
ANN_ACTOR, BO_ACTOR, INSIDE_ACTOR = "a1" * 16, "b2" * 16, "c3" * 16
ANN_TASK, BO_TASK = "a1" * 24, "b2" * 24
ANN_LOGS = ["job-driver-raysubmit_ann1.log", f"worker-{'aa' * 28}-{ANN_JOB}-101.out",
            f"runtime_env_setup-{ANN_JOB}.log"]
OTHER_LOGS = ["job-driver-raysubmit_bo1.log", f"worker-{'bb' * 28}-{BO_JOB}-102.err",
              f"worker-{'cc' * 28}-ffffffff-103.out", "gcs_server.out", "raylet.out"]


def envelope(msg: str = "", **data: Any) -> dict[str, Any]:
    return {"result": True, "msg": msg, "data": data}


def _worker(pid: int, job: str, name: str) -> dict[str, Any]:
    return {"pid": pid, "cmdline": [name], "jobId": job, "language": "PYTHON",
            "coreWorkerStats": [{"pid": pid, "jobId": job, "actorId": "ff" * 16}]}


def _actor(actor: str, job: str, name: str) -> dict[str, Any]:
    return {"actorId": actor, "jobId": job, "className": name, "state": "ALIVE",
            "address": {"nodeId": NODE, "workerId": "dd" * 28}}


ACTORS = {ANN_ACTOR: _actor(ANN_ACTOR, ANN_JOB, "AnnModel"),
          BO_ACTOR: _actor(BO_ACTOR, BO_JOB, "BoModel"),
          INSIDE_ACTOR: _actor(INSIDE_ACTOR, INSIDE_JOB, "Inside")}
TASKS = [{"task_id": ANN_TASK, "job_id": ANN_JOB, "name": "ann_task", "state": "FINISHED"},
         {"task_id": BO_TASK, "job_id": BO_JOB, "name": "bo_task", "state": "FINISHED"}]
PLACEMENT_GROUPS = [{"placement_group_id": "a1" * 18, "creator_job_id": ANN_JOB},
                    {"placement_group_id": "b2" * 18, "creator_job_id": BO_JOB}]


def _listed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return envelope(result={"total": len(rows), "num_after_truncation": len(rows),
                            "num_filtered": len(rows), "result": rows,
                            "partial_failure_warning": "", "warnings": None})


def _filtered(rows: list[dict[str, Any]], query: Any) -> list[dict[str, Any]]:
    filters = zip(query.getall("filter_keys", []), query.getall("filter_predicates", []),
                  query.getall("filter_values", []), strict=False)
    for key, predicate, value in filters:
        # The dashboard's page sends `=`; the gateway's survey of leftovers `!=`.
        assert predicate in ("=", "!="), predicate
        rows = [r for r in rows if (str(r.get(key)) == value) == (predicate == "=")]
    return rows


def answer(path: str, query: Any) -> tuple[int, Any] | None:
    """Ray's answer (status, JSON or text) to a dashboard view, or None for any other path."""
    if path == "/nodes":
        workers = [_worker(101, ANN_JOB, "ray::AnnModel"), _worker(102, BO_JOB, "ray::BoModel")]
        stats = [w["coreWorkerStats"][0] for w in workers]
        return 200, envelope("Node summary fetched.", summary=[
            {"hostname": "head", "ip": "192.0.2.2", "raylet": {"nodeId": NODE, "state": "ALIVE",
                                                               "coreWorkersStats": stats}}],
            nodeLogicalResources={NODE: "0.0/2.0 CPU"})
    if path == f"/nodes/{NODE}":
        return 200, envelope("Node details fetched.", detail={
            "hostname": "head", "ip": "192.0.2.2", "raylet": {"nodeId": NODE, "state": "ALIVE"},
            "workers": [_worker(101, ANN_JOB, "ray::AnnModel"),
                        _worker(102, BO_JOB, "ray::BoModel"),
                        _worker(103, INSIDE_JOB, "ray::Inside"),
                        _worker(100, "", "ray::DashboardAgent")],
            "actors": dict(ACTORS)})
    if path == "/logical/actors":
        return 200, envelope("All actors fetched.", actors=dict(ACTORS))
    if path.startswith("/logical/actors/"):
        return 200, envelope("Actor details fetched.", detail=ACTORS.get(path.rsplit("/", 1)[1]))
    if path == "/api/v0/tasks":
        return 200, _listed(_filtered(TASKS, query))
    if path == "/api/v0/actors":
        return 200, _listed(_filtered([{"actor_id": a, "job_id": v["jobId"]}
                                       for a, v in ACTORS.items()], query))
    if path == "/api/v0/placement_groups":
        return 200, _listed(_filtered(PLACEMENT_GROUPS, query))
    if path == "/api/v0/tasks/summarize":
        names = [t["name"] for t in _filtered(TASKS, query)]
        summary = {"summary": {n: {"func_or_class_name": n, "type": "NORMAL_TASK",
                                   "state_counts": {"FINISHED": 1}} for n in names},
                   "total_tasks": len(names), "total_actor_tasks": 0,
                   "total_actor_scheduled": 0, "summary_by": query.get("summary_by", "func_name")}
        return 200, envelope(result={"total": len(names), "num_after_truncation": len(names),
                                     "num_filtered": len(names), "partial_failure_warning": "",
                                     "warnings": None,
                                     "result": {"node_id_to_summary": {"cluster": summary}}})
    if path == "/events":
        events = {ANN_JOB: [{"message": "ann's event"}], BO_JOB: [{"message": "bo's event"}]}
        job = query.get("job_id")
        if job is None:
            return 200, envelope("All events fetched.", events=events)
        return 200, envelope("Job events fetched.", jobId=job, events=events.get(job, []))
    if path.startswith("/api/data/datasets/"):
        job = path.rsplit("/", 1)[1]
        return 200, {"datasets": [{"dataset": f"{job}'s dataset"}]}
    if path == "/api/v0/tasks/timeline":
        return 200, [{"name": f"{query.get('job_id')}'s timeline"}]
    if path == "/api/v0/logs":
        every = ANN_LOGS + OTHER_LOGS
        return 200, envelope(result={
            "driver": [f for f in every if f.startswith("job-driver")],
            "worker_out": [f for f in every if f.startswith("worker")],
            "runtime_env": [f for f in every if f.startswith("runtime_env")],
            "gcs_server": ["gcs_server.out"], "raylet": ["raylet.out"]})
    if path == "/api/v0/logs/file":
        named = query.get("filename") or query.get("actor_id") or query.get("task_id")
        printed = f"RAY_AUTH_TOKEN={CLUSTER_TOKEN}\n" if named == ANN_LOGS[1] else ""
        return 200, f"the log {named}\n{printed}"
    if path == "/api/serve/applications/":
        return 200, {"controller_info": {"node_id": NODE}, "proxies": {},
                     "applications": {"bo_app": {"route_prefix": "/bo"}}, "target_capacity": None}
    if path == "/api/profiling_enabled":
        return 200, envelope(profilingEnabled=True)
    if path in ("/api/grafana_health", "/api/prometheus_health"):
        return 500, {"result": False, "msg": "prometheus healthcheck failed.", "data": {}}
    if path == "/api/v0/platform_events":
        return 404, "404: Not Found"
    return None
