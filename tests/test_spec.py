"""Spec validation: every bad spec gives one line naming the file, the field and the fix (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import loading
from infra.core.errors import SpecError, UsageError
from tests.forked_cli import run_invoke

# (file name, YAML text, text the one-line error must contain)
BAD_SPECS = [
    ("c.yaml", "", "the file is empty"),
    ("c.yaml", "- a\n- b\n", "expected a mapping"),
    ("c.yaml", "provider: [local\n", "fix the YAML syntax"),
    ("c.yaml", "provider: local\n  num_cpus: 2\n", "fix the YAML syntax"),
    ("c.yaml", "num_cpus: 2\n", "provider: required key is missing; add one of local"),
    ("c.yaml", "provider: locl\n", "did you mean 'local'?"),
    ("c.yaml", "provider: aws\n", "unknown provider 'aws'"),
    ("c.yaml", "provider: 7\n", "unknown provider 7"),
    ("c.yaml", "provider: local\nnum_cpu: 2\n", "num_cpu: unknown key; did you mean 'num_cpus'?"),
    ("c.yaml", "provider: local\nobject_store_mb: 2\n", "did you mean 'object_store_memory_mb'?"),
    ("c.yaml", "provider: local\nport_bas: 2000\n", "did you mean 'port_base'?"),
    ("c.yaml", "provider: local\nzzz: 1\n", "zzz: unknown key; valid keys here: provider, auth, autodown, tracking, sharing, metrics, metrics_history, num_cpus"),
    ("c.yaml", "provider: local\nnum_cpus: abc\n", "num_cpus: input should be a valid integer"),
    ("c.yaml", "provider: local\nnum_cpus: 0\n", "num_cpus: input should be greater than or equal to 1"),
    ("c.yaml", "provider: local\nnum_cpus: -3\n", "got -3"),
    ("c.yaml", "provider: local\nnum_cpus: 2.5\n", "num_cpus: input should be a valid integer"),
    ("c.yaml", "provider: local\nnum_gpus: -1\n", "num_gpus: input should be greater than or equal to 0"),
    ("c.yaml", "provider: local\nobject_store_memory_mb: 10\n", "greater than or equal to 75"),
    ("c.yaml", "provider: local\nport_base: 80\n", "port_base: input should be greater than or equal to 1024"),
    ("c.yaml", "provider: local\nport_base: 99999\n", "port_base: input should be less than or equal to"),
    ("c.yaml", "provider: local\nresources: [1, 2]\n", "resources: input should be a valid dictionary"),
    ("c.yaml", "provider: local\nresources: {gpu_slot: many}\n", "resources.gpu_slot: input should be a valid number"),
    ("c.yaml", "provider: local\nready_timeout_s: 1\n", "ready_timeout_s: input should be greater than or equal to 5"),
    ("c.yaml", "provider: local\nname: other\n", "name: the cluster name is the file name; remove this key"),
    ("c.yaml", "provider: local\nsource: x\n", "source: the cluster name is the file name"),
    ("Bad_Name.yaml", "provider: local\n", "cluster name 'Bad_Name' must be 1-31 lowercase"),
    ("a-very-long-cluster-name-that-is-too-long.yaml", "provider: local\n", "rename the file"),
    ("9lives.yaml", "provider: local\n", "starting with a letter"),
    ("c.yaml", "provider: local\nnum_cpus: true\n", "num_cpus: input should be a valid integer"),
    # A misspelt REQUIRED key: the typo is named, not only "required key is missing".
    ("c.yaml", "provider: local\nautodown: {idle_minute: 30}\n",
     "autodown.idle_minute: unknown key; did you mean 'idle_minutes'? (a required key)"),
    ("c.yaml", "provider: lambda\nhead: {choices: [{instance_type: gpu_1x_a10, regon: us-east-1}]}\n",
     "head.choices[0].regon: unknown key; did you mean 'region'? (a required key)"),
]


@pytest.mark.parametrize(("file_name", "text", "expected"), BAD_SPECS)
def test_bad_spec_gives_one_line_naming_file_field_and_fix(
    tmp_path: Path, file_name: str, text: str, expected: str
) -> None:
    path = tmp_path / file_name
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    message = str(caught.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith(str(path)), "the error must name the file"


def test_at_least_25_bad_specs() -> None:
    assert len(BAD_SPECS) >= 25


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such spec"):
        loading.load_spec(tmp_path / "nope.yaml")


def test_good_spec_loads(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("provider: local\nnum_cpus: 2\nresources: {special: 1}\n")
    loaded = loading.load_spec(path)
    assert loaded.name == "lab"
    assert loaded.provider == "local"
    assert loaded.num_cpus == 2  # type: ignore[attr-defined]


def test_provider_and_cluster_must_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("provider: local\n")
    with pytest.raises(UsageError, match="disagrees"):
        loading.resolve("slurm", str(path))
    assert loading.resolve("local", str(path)).name == "lab"


def test_provider_picks_its_default_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYFLEET_CLUSTERS", str(tmp_path))
    (tmp_path / "local.yaml").write_text("provider: local\n")
    assert loading.resolve(None, None).name == "local"
    with pytest.raises(UsageError, match="no default spec"):
        loading.resolve("slurm", None)
    with pytest.raises(UsageError, match="unknown provider 'gpc'"):
        loading.resolve("gpc", None)
    (tmp_path / "local.yaml").unlink()
    # An owner who forgot --cluster (`member-bundles --dir folders`) is not told "--provider None".
    with pytest.raises(UsageError, match=r"^no --cluster or --provider given: no default spec "):
        loading.resolve(None, None)


def test_example_specs_in_clusters_are_valid() -> None:
    specs = sorted((Path(__file__).parent.parent / "clusters").glob("*.yaml"))
    assert specs, "clusters/ must hold example specs"
    for path in specs:
        assert loading.load_spec(path).name == path.stem


def test_cli_bad_spec_exits_2_with_one_line_and_creates_nothing(tmp_path: Path, rf_home: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("provider: local\nnum_cpu: 2\n")
    result = run_invoke("up", "--cluster", str(path))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "num_cpu: unknown key; did you mean 'num_cpus'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (rf_home / "state" / "lab.json").exists()


def test_cli_cluster_naming_a_directory_is_one_line(tmp_path: Path, rf_home: Path) -> None:
    for command in ("up", "status", "teardown"):
        result = run_invoke(command, "--cluster", str(tmp_path))
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert "is a directory; --cluster takes a spec file" in result.stderr
    assert not (rf_home / "state").exists()


def test_cli_lock_held_by_another_run_is_one_line(tmp_path: Path, rf_home: Path) -> None:
    from infra.core import state

    path = tmp_path / "busy.yaml"
    path.write_text("provider: local\n")
    with state.locked("busy", "local", "up"):
        result = run_invoke("teardown", "--cluster", str(path))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "cluster 'busy' is busy: `invoke up`" in result.stderr and "wait for it" in result.stderr
