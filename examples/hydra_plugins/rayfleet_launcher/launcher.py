"""Hydra launcher `ray`: each job of a `--multirun` sweep runs on the current rayfleet cluster.

    python examples/train_model.py --multirun hydra/launcher=ray optimizer.lr=1e-4,1e-3

Options (set as `hydra.launcher.<name>=<value>`):
- `remote` (default true): submit every job to the rayfleet cluster as a Ray job. The cluster is
  found exactly as `invoke` finds it (`cluster`/`provider` below; by default clusters/local.yaml)
  and its address comes from its state through the provider's `connect`, so no IP is copied
  anywhere and remote clusters work through their tunnel. `remote=false` instead starts a Ray
  inside this process and runs the jobs there: the same sweep, no cluster needed.
- `cluster`, `provider`: like `invoke --cluster/--provider`.
- `num_cpus`, `num_gpus`: what each job reserves (fractions allowed).
- `runtime_env`: a Ray runtime env YAML for the jobs, like `invoke submit --runtime-env`.
- `timeout_s`: how long to wait for the whole sweep.

Each job's logs are printed as it finishes, then a summary and one `RESULT {...}` line. Files a job
writes on a cluster stay on the node that ran it (in the job's working dir).
"""

# No `from __future__ import annotations` here: OmegaConf reads the config dataclass's real
# annotations (and Hydra imports this module in a way that breaks postponed ones).
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)

#: The package a sweep's jobs are shipped in (a Ray `py_modules` entry).
PACKAGE = "rayfleet_hydra_sweep"
#: Hydra's output folders: never uploaded with the working dir.
_HYDRA_OUTPUTS = ["outputs/", "multirun/"]
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class RayfleetLauncherConf:
    _target_: str = "hydra_plugins.rayfleet_launcher.launcher.RayfleetLauncher"
    #: true: each job is a Ray job on the rayfleet cluster; false: a Ray inside this process.
    remote: bool = True
    #: A spec name in clusters/ or a path to one (null: clusters/<provider or local>.yaml).
    cluster: Optional[str] = None  # noqa: UP045  (OmegaConf does not read `str | None`)
    provider: Optional[str] = None  # noqa: UP045
    #: Resources each job reserves.
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    #: A Ray runtime env YAML for the jobs (remote only), e.g. setup/runtime/cpu.yaml.
    runtime_env: Optional[str] = None  # noqa: UP045
    #: Seconds to wait for the whole sweep before stopping what still runs.
    timeout_s: float = 3600.0
    #: Object store of the in-process Ray (remote=false), in MiB.
    object_store_memory_mb: int = 200


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayfleetLauncherConf,
                             provider="rayfleet")


class RayfleetLauncher(Launcher):
    def __init__(self, remote: bool = True, cluster: str | None = None, provider: str | None = None,
                 num_cpus: float = 1.0, num_gpus: float = 0.0, runtime_env: str | None = None,
                 timeout_s: float = 3600.0, object_store_memory_mb: int = 200) -> None:
        self.remote = remote
        self.cluster = cluster
        self.provider = provider
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.runtime_env = runtime_env
        self.timeout_s = timeout_s
        self.object_store_memory_mb = object_store_memory_mb
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra.core.singleton import Singleton

        assert self.config is not None and self.hydra_context is not None
        assert self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        where = "in-process Ray" if not self.remote else f"rayfleet cluster {self._cluster_label()}"
        log.info(f"rayfleet launcher: {len(job_overrides)} job(s) on the {where}; "
                 f"sweep output dir: {sweep_dir}")
        specs = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"rayfleet_{idx}"
                sweep_config.hydra.job.num = idx
            specs.append((idx, list(overrides), {
                "hydra_context": self.hydra_context,
                "task_function": self.task_function,
                "sweep_config": sweep_config,
                "singleton_state": Singleton.get_state(),
            }))
        if self.remote:
            returns, jobs = self._on_cluster(specs)
        else:
            returns, jobs = self._in_process(specs), [""] * len(specs)
        _summarise(returns, jobs, [idx for idx, _, _ in specs], where)
        return returns

    def _cluster_label(self) -> str:
        return self.cluster or f"clusters/{self.provider or 'local'}.yaml"

    # ------------------------------------------------------------------ remote: rayfleet cluster

    def _on_cluster(self, specs: list[tuple[int, list[str], dict[str, Any]]]
                    ) -> tuple[list[JobReturn], list[str]]:
        _make_infra_importable()
        import ray.cloudpickle as cloudpickle
        from ray.job_submission import JobSubmissionClient

        from infra.cli import commands
        from infra.core import auth, jobs

        staging = Path(tempfile.mkdtemp(prefix="rayfleet-hydra-"))
        try:
            package = staging / PACKAGE
            package.mkdir()
            (package / "__init__.py").write_text("")
            shutil.copy(Path(__file__).with_name("_remote.py"), package / "run.py")
            self._ship_beside()
            for idx, _, spec in specs:
                (package / f"job_{idx}.pkl").write_bytes(cloudpickle.dumps(spec))
            env = jobs.runtime_env(self.runtime_env, Path.cwd())
            env["excludes"] = [*env["excludes"], *_HYDRA_OUTPUTS]
            # The jobs' pickles name this plugin's classes (Hydra's config store holds them), so
            # the plugin travels too, as does the package with the runner and the pickles.
            plugins = Path(__file__).resolve().parents[1]
            env["py_modules"] = [*env.get("py_modules", []), str(plugins), str(package)]
            tag = uuid.uuid4().hex[:6]
            with commands.quiet_connect(self.provider, self.cluster) as endpoint:
                client = JobSubmissionClient(endpoint.dashboard_url,
                                             headers=auth.headers(endpoint.token_path))
                ids = []
                for idx, _, _ in specs:
                    ids.append(client.submit_job(
                        entrypoint=f"python -m {PACKAGE}.run job_{idx}.pkl",
                        runtime_env=env,
                        submission_id=f"hydra-{tag}-{idx}",
                        entrypoint_num_cpus=self.num_cpus,
                        entrypoint_num_gpus=self.num_gpus,
                    ))
                    log.info(f"\t#{idx} : submitted as job {ids[-1]}")
                returns = self._collect(client, specs, ids)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return returns, ids

    def _collect(self, client: Any, specs: list[tuple[int, list[str], dict[str, Any]]],
                 ids: list[str]) -> list[JobReturn]:
        """Wait for every job; print each one's logs as it ends; read its JobReturn back."""
        from hydra_plugins.rayfleet_launcher._remote import RETURN_MARK, decode_return

        returns: dict[int, JobReturn] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(returns) < len(specs):
            for position, (idx, overrides, spec) in enumerate(specs):
                if position in returns:
                    continue
                status = str(client.get_job_status(ids[position]).value)
                if status not in _TERMINAL:
                    continue
                logs = client.get_job_logs(ids[position])
                lines = logs.rstrip().splitlines()
                marked = [line for line in lines if line.startswith(RETURN_MARK)]
                print(f"----- #{idx} ({' '.join(overrides)}), job {ids[position]}: {status}")
                shown = [line for line in lines if not line.startswith(RETURN_MARK)]
                while shown and not shown[-1].strip():
                    shown.pop()
                for line in shown:
                    print(f"[#{idx}] {line}")
                if marked:
                    returns[position] = decode_return(marked[-1])
                else:
                    tail = " | ".join(line for line in lines[-3:] if line.strip())
                    returns[position] = _failed(overrides, spec["sweep_config"], RuntimeError(
                        f"job {ids[position]} ended {status} without a result: {tail or 'no logs'}"))
            if len(returns) < len(specs):
                if time.monotonic() > deadline:
                    for position, job_id in enumerate(ids):
                        if position not in returns:
                            client.stop_job(job_id)
                    raise TimeoutError(f"the sweep did not finish within {self.timeout_s:g}s; "
                                       "stopped the jobs still running")
                time.sleep(1.0)
        return [returns[position] for position in range(len(specs))]

    def _ship_beside(self) -> None:
        """The app's own modules beside its script (examples/digits.py beside train_model.py) are
        not on a Ray job's or worker's import path: Ray pickles their functions by value, like
        the script's own."""
        import ray.cloudpickle

        assert self.task_function is not None
        script = getattr(sys.modules.get(self.task_function.__module__), "__file__", None)
        if not script:
            return
        folder = Path(script).resolve().parent
        for name, module in list(sys.modules.items()):
            found = getattr(module, "__file__", None)
            if name != "__main__" and found and Path(found).resolve().parent == folder:
                ray.cloudpickle.register_pickle_by_value(module)

    # ------------------------------------------------------------------ local: in-process Ray

    def _in_process(self, specs: list[tuple[int, list[str], dict[str, Any]]]) -> list[JobReturn]:
        saved = dict(os.environ)
        # rayfleet never reports usage statistics unless the user opted in explicitly.
        if os.environ.get("RAY_USAGE_STATS_ENABLED") != "1":
            os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        if "RAY_AUTH_MODE" not in os.environ:
            # A new local Ray turns on token auth and, without a token at hand, writes one to
            # ~/.ray/auth_token, after which every `ray start --head` of this user on this machine
            # requires tokens too. A token in the environment protects this Ray alone.
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        # Imported only now: Ray reads the auth settings once, when it is first imported.
        import ray
        from hydra_plugins.rayfleet_launcher._remote import run_one

        started = not ray.is_initialized()
        self._ship_beside()
        try:
            if started:
                # address="local": a new Ray of our own, never another Ray found on this machine.
                ray.init(address="local", include_dashboard=False,
                         object_store_memory=self.object_store_memory_mb * 2**20)
            task = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0)(run_one)
            return list(ray.get([task.remote(spec) for _, _, spec in specs]))
        finally:
            if started:
                ray.shutdown()
            os.environ.clear()
            os.environ.update(saved)


def _failed(overrides: list[str], config: DictConfig, error: Exception) -> JobReturn:
    result = JobReturn(overrides=overrides, cfg=config, status=JobStatus.FAILED)
    result._return_value = error
    return result


def _make_infra_importable() -> None:
    """rayfleet's own package lives at the project root, three folders above this file."""
    try:
        import infra  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def _summarise(returns: Sequence[JobReturn], jobs: Sequence[str], indexes: Sequence[int],
               where: str) -> None:
    runs = []
    for idx, job_id, result in zip(indexes, jobs, returns, strict=True):
        value = result._return_value
        if result.status != JobStatus.COMPLETED:
            value = f"{type(value).__name__}: {value}"
        try:
            json.dumps(value)
        except TypeError:
            value = repr(value)
        runs.append({"idx": idx, "overrides": list(result.overrides or []), "job": job_id,
                     "status": result.status.name, "return": value})
        print(f"#{idx} {' '.join(result.overrides or [])}: {result.status.name}, returned {value!r}")
    print("RESULT " + json.dumps({"launcher": "rayfleet", "where": where, "runs": runs}), flush=True)
