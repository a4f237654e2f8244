"""Ray Serve applications through Ray's Serve REST API (`/api/serve/applications/`), with the token.

That API takes the whole set of applications at once (a PUT replaces all of them), so `deploy` and
`delete` read what runs now, change one application, and send the set back: other applications are
never lost. A deploy that Serve reports failed is rolled back to the set that ran before.
The current directory travels as the applications' working dir (uploaded once, like a job's).
"""

from __future__ import annotations

import importlib.util
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.core import auth, jobs, ui
from infra.core.errors import RayfleetError, UsageError
from infra.core.tracking import client as tracking
from infra.node import wait

if TYPE_CHECKING:
    from infra.core.endpoint import Endpoint

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_DONE = {"RUNNING", "DEPLOY_FAILED", "UNHEALTHY"}


class ServeError(RayfleetError):
    """Serve refused or failed an application, or did not answer."""


def load(target: str, working_dir: Path) -> dict[str, Any]:
    """The Serve config `target` names (a YAML file or `module:app`), checked before any contact."""
    if target.endswith((".yaml", ".yml")):
        config = _read_yaml(Path(target))
    elif _IMPORT_PATH.fullmatch(target):
        module = target.split(":")[0]
        config = {"applications": [{"name": module.rsplit(".", 1)[-1].replace("_", "-"),
                                    "import_path": target, "route_prefix": "/"}]}
    else:
        raise UsageError(f"TARGET {target}: expected a Serve config file (.yaml) or an import "
                         "path module:app, e.g. examples.serve_model:app")
    _validate(target, config)
    for app in config["applications"]:
        if not (app.get("runtime_env") or {}).get("working_dir"):
            _check_import(target, str(app["import_path"]), working_dir)
    return config


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such Serve config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UsageError(f"{path}{where}: {problem}; fix the YAML syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("applications"), list):
        raise UsageError(f"{path}: expected a Serve config with `applications:` (a list of "
                         "{name, import_path, route_prefix}); see examples/serve.yaml")
    return data


def _validate(target: str, config: dict[str, Any]) -> None:
    """Ray's own schema of a Serve config, so that Serve refuses nothing we sent."""
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(config)
    except Exception as exc:  # pydantic v1/v2 errors alike: the first line names the field
        errors = getattr(exc, "errors", None)
        first = errors()[0] if callable(errors) else None
        if first:
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise UsageError(f"{target}: {where}: {first.get('msg')}; fix the Serve config") from None
        raise UsageError(f"{target}: {str(exc).splitlines()[0]}; fix the Serve config") from None


def _check_import(target: str, import_path: str, working_dir: Path) -> None:
    """The module exists here (and, when it is a file of ours, defines the name): Serve itself
    would take half a minute to report either."""
    module, attribute = import_path.split(":")
    relative = Path(*module.split("."))
    source = working_dir / relative.with_suffix(".py")
    if source.is_file():
        names = _top_level_names(source)
        if names is not None and attribute.split(".")[0] not in names:
            raise UsageError(f"{target}: import_path {import_path}: {source.relative_to(working_dir)} "
                             f"defines no {attribute.split('.')[0]!r}; fix the import path")
        return
    if (working_dir / relative).is_dir():
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"{target}: import_path {import_path}: no module {module!r} in "
                         f"{working_dir} (uploaded as the working dir) nor installed here; "
                         "fix the import path")


def _top_level_names(source: Path) -> set[str] | None:
    """Names a module binds at top level; None when it may bind more than can be seen."""
    import ast

    try:
        tree = ast.parse(source.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return None  # Serve will report it, with the line
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif not isinstance(node, ast.Expr):
            return None  # if/try/for blocks may bind names conditionally
    return None if "__getattr__" in names else names


def _client(endpoint: Endpoint) -> Any:
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    try:
        return ServeSubmissionClient(endpoint.dashboard_url,
                                     headers=auth.headers(endpoint.token_path))
    except Exception as exc:
        message = auth.scrub(str(exc), endpoint.token_path).splitlines()[0]
        raise ServeError(f"cannot reach Serve's API at {endpoint.dashboard_url}: {message}") from None


def _apps(client: Any) -> dict[str, Any]:
    try:
        details = client.get_serve_details()
    except Exception as exc:
        raise ServeError(f"Serve's API did not answer: {str(exc).splitlines()[0]}") from None
    return dict(details.get("applications") or {})


def _put(client: Any, endpoint: Endpoint, apps: list[dict[str, Any]]) -> None:
    config: dict[str, Any] = {"applications": apps}
    if endpoint.serve_bind:
        # Serve's proxy binds once, when Serve starts: our port, never Ray's default 8000 that
        # another cluster on the same machine may hold.
        config["http_options"] = {"host": endpoint.serve_bind[0], "port": endpoint.serve_bind[1]}
    def send() -> None:
        if apps:
            client.deploy_applications(config)
        else:
            client.delete_applications()

    def reason(exc: BaseException) -> str:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return auth.scrub(lines[-1] if lines else type(exc).__name__, endpoint.token_path)

    try:
        # A PUT is declarative (the whole wanted set), so sending it again is safe; a 500 is
        # what the dashboard answers when Serve's controller is slow to start on a busy head.
        wait.retry(send, (Exception,), attempts=3, backoff=lambda attempt: 2.0 + 3.0 * attempt,
                   passing=lambda exc: "status code 500" in str(exc),
                   on_retry=lambda exc: ui.warn(f"Serve's API failed ({reason(exc)[:200]}); "
                                                "trying again"))
    except Exception as exc:
        raise ServeError(f"Serve refused the applications: {reason(exc)[:300]}") from None


def _upload(client: Any, config: dict[str, Any], working_dir: Path) -> None:
    """Ship the current directory once and point every application without one at it."""
    uri = None
    for app in config["applications"]:
        env = dict(app.get("runtime_env") or {})
        if env.get("working_dir"):
            continue
        if uri is None:
            shipped = {"working_dir": str(working_dir), "excludes": jobs.ALWAYS_EXCLUDED}
            # Ray's packaging logs every skipped file at INFO: quiet output, as everywhere.
            ray_logger = logging.getLogger("ray")
            level = ray_logger.level
            ray_logger.setLevel(logging.ERROR)
            try:
                client._upload_working_dir_if_needed(shipped)
            finally:
                ray_logger.setLevel(level)
            uri = shipped["working_dir"]
        env["working_dir"] = uri
        app["runtime_env"] = env


#: How often `deploy` asks whether Serve runs the applications yet.
SETTLE_POLL_S = 0.05


def deploy(endpoint: Endpoint, config: dict[str, Any], working_dir: Path,
           timeout: float = 600) -> list[str]:
    """Add or replace the config's applications; wait until Serve runs them; return their URLs."""
    from concurrent.futures import ThreadPoolExecutor

    client = _client(endpoint)
    names = [str(a["name"]) for a in config["applications"]]
    with ui.step(f"uploading {working_dir.name}/ for {', '.join(names)}"), \
            ThreadPoolExecutor(max_workers=1) as pool:
        # What runs now, asked while the working dir is hashed (and uploaded if new): both wait
        # on the head, and each costs a round trip to it (bench/serve_deploy.py).
        running = pool.submit(_apps, client)
        _upload(client, config, working_dir)
        before = running.result()
    kept = [dict(d["deployed_app_config"]) for n, d in before.items()
            if n not in names and d.get("deployed_app_config")]
    previous = [dict(d["deployed_app_config"]) for d in before.values()
                if d.get("deployed_app_config")]
    _put(client, endpoint, kept + list(config["applications"]))
    started = time.monotonic()

    def settled(step: ui.Step) -> dict[str, Any] | None:
        apps = _apps(client)
        states = {n: str(apps.get(n, {}).get("status", "NOT_STARTED")) for n in names}
        step.detail(", ".join(f"{n} {s}" for n, s in states.items()))
        fresh = all(float(apps.get(n, {}).get("last_deployed_time_s") or 0) >= started - 5
                    for n in names)
        return apps if fresh and all(s in _DONE for s in states.values()) else None

    # Polled often: each look is one local request to the dashboard, and the first answer of the
    # application waits for this loop to see it RUNNING (bench/serve_deploy.py).
    apps = ui.wait_for(settled, f"Serve to run {', '.join(names)}", timeout=timeout,
                       interval=SETTLE_POLL_S)
    failed = [n for n in names if apps[n]["status"] != "RUNNING"]
    if failed:
        message = str(apps[failed[0]].get("message") or "").strip().splitlines()
        reason = message[-1] if message else apps[failed[0]]["status"]
        # Nothing lost: the applications that ran before run on as they were.
        _put(client, endpoint, previous)
        raise ServeError(f"application {failed[0]!r} failed to deploy ({reason[:300]}); "
                         "the previous applications were restored")
    return [url(endpoint, apps[n]) for n in names]


def url(endpoint: Endpoint, app: dict[str, Any]) -> str:
    base = endpoint.serve_url or "(no HTTP endpoint from here)"
    return f"{base}{app.get('route_prefix') or '/'}".replace("//", "/").replace(":/", "://")


def status(endpoint: Endpoint) -> list[dict[str, str]]:
    rows = []
    for name, app in sorted(_apps(_client(endpoint)).items()):
        deployments = app.get("deployments") or {}
        replicas = sum(len(d.get("replicas") or []) for d in deployments.values())
        message = str(app.get("message") or "").strip().splitlines()
        rows.append({"app": name, "status": str(app.get("status")),
                     "url": url(endpoint, app), "replicas": str(replicas),
                     "message": message[-1][:80] if message else ""})
    return rows


def delete(endpoint: Endpoint, name: str, timeout: float = 120) -> None:
    client = _client(endpoint)
    before = _apps(client)
    if name not in before:
        running = ", ".join(sorted(before)) or "none"
        raise UsageError(f"NAME {name}: no such Serve application (running: {running})")
    kept = [dict(d["deployed_app_config"]) for n, d in before.items()
            if n != name and d.get("deployed_app_config")]
    _put(client, endpoint, kept)
    ui.wait_for(lambda _: True if name not in _apps(client) else None,
                f"Serve to remove {name}", timeout=timeout)


def status_extras(endpoint: Endpoint) -> dict[str, Any]:
    """Tracking URL and runs, and Serve applications, for `invoke status` (never raises)."""
    extras: dict[str, Any] = {}
    if endpoint.tracking_url and endpoint.tracking_password:
        try:
            runs: int | None = tracking.count_runs(endpoint.tracking_url, endpoint.tracking_password)
            error = None
        except tracking.TrackingError as exc:
            runs, error = None, str(exc)
        extras["tracking"] = {"url": endpoint.tracking_url, "runs": runs, "error": error}
    try:
        extras["serve"] = status(endpoint)
    except ServeError as exc:
        extras["serve"], extras["serve_error"] = [], str(exc)
    return extras


def print_status_extras(extras: dict[str, Any]) -> None:
    view = extras.get("tracking")
    if view and view["error"]:
        ui.warn(view["error"].replace("did not answer", "did not answer (starting, or died)"))
    elif view:
        ui.out(f"tracking: {view['url']} ({view['runs']} runs; `invoke mlflow` to log in)",
               markup=False)
    apps = extras.get("serve") or []
    if apps:
        names = ", ".join(f"{a['app']} ({a['status']})" for a in apps)
        ui.out(f"serving: {names} — busy for autodown while any app is deployed", markup=False)
