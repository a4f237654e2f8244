"""Checking a spec against a cluster's partitions, from Slurm 22.05's own output format.

The test bed has one partition without GPUs or time limits; the sites users run on have several.
`Recorded` replays what `scontrol show partition --oneliner` and `sinfo -N` print on such a site
(the format of the real commands run by test_e2e_local.py), passed in as the runner.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.cli import loading
from infra.core.errors import SpecError
from infra.core.ssh import Result
from infra.providers.slurm import cluster
from infra.providers.slurm.remote import LocalRunner, Runner, SlurmError
from infra.providers.slurm.spec import Spec, time_limit_seconds

SCONTROL = (
    "PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL Default=YES DefaultTime=01:00:00 "
    "MaxNodes=8 MaxTime=2-00:00:00 MinNodes=0 Nodes=c[01-10] State=UP TotalCPUs=640 "
    "TotalNodes=10 TRES=cpu=640,mem=2500G,node=10\n"
    "PartitionName=gpu AllowGroups=ALL Default=NO MaxNodes=UNLIMITED MaxTime=12:00:00 "
    "Nodes=g[01-03] State=UP TotalCPUs=96 TotalNodes=3\n"
    "PartitionName=old AllowGroups=ALL Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED "
    "Nodes=o01 State=DOWN TotalCPUs=8 TotalNodes=1\n"
)
SINFO = (
    "".join(f"cpu|c{i:02d}|64|256000|(null)|idle\n" for i in range(1, 11))
    + "gpu|g01|32|512000|gpu:a100:4(S:0-1)|mix\n"
    + "gpu|g02|32|512000|gpu:a100:4(S:0-1)|idle\n"
    + "gpu|g03|32|512000|gpu:v100:2,shard:8|drain\n"
    + "old|o01|8|16000|(null)|down*\n"
)


class Recorded(Runner):
    """Answers the one command `cluster.partitions` sends with a site's recorded output."""

    where = "login.example"

    def run(self, command: str, input: str | None = None, timeout: float = 60) -> Result:
        assert "scontrol show partition --oneliner" in command and "sinfo -h -N" in command
        return Result(0, SCONTROL + "@@rayfleet@@\n" + SINFO, "")

    @contextlib.contextmanager
    def tunnels(self, node: str, remotes: list[tuple[str, int]]) -> Iterator[list[str]]:
        raise AssertionError("validation never tunnels")
        yield []

    def node_target(self, node: str) -> None:
        raise AssertionError("validation never logs into a compute node")

    def close(self) -> None:
        pass


def _spec(tmp_path: Path, text: str) -> Spec:
    path = tmp_path / "site.yaml"
    path.write_text("provider: slurm\n" + text)
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    return loaded


def test_partitions_are_parsed_with_limits_and_gpus() -> None:
    found = cluster.partitions(Recorded())
    assert sorted(found) == ["cpu", "gpu", "old"]
    assert found["cpu"].default and found["cpu"].max_nodes == 8
    assert found["cpu"].max_time_s == 2 * 86400 and found["gpu"].max_time_s == 12 * 3600
    assert [n.gpus for n in found["gpu"].nodes] == [4, 4, 2]
    assert found["old"].state == "DOWN" and found["gpu"].max_nodes is None


GOOD = [
    "cpus_per_node: 64\nnodes: 8\n",
    "partition: gpu\ncpus_per_node: 32\ngpus_per_node: 4\nnodes: 2\ntime_limit: '12:00:00'\n",
    "cpus_per_node: 8\ngpu_workers: {partition: gpu, nodes: 3, cpus_per_node: 16, "
    "gpus_per_node: 2}\n",
]


@pytest.mark.parametrize("text", GOOD)
def test_specs_the_site_can_run_pass(tmp_path: Path, text: str) -> None:
    notes = cluster.check_spec(_spec(tmp_path, text), cluster.partitions(Recorded()), "login")
    assert not [n for n in notes if "DOWN" in n]


BAD = [
    ("cpus_per_node: 2\npartition: gpus\n", "partition: unknown partition 'gpus' on login; did "
                                            "you mean 'gpu'? choose one of cpu, gpu, old"),
    ("cpus_per_node: 2\nnodes: 11\n", "nodes: 11 nodes requested but partition 'cpu' has 10"),
    ("cpus_per_node: 2\nnodes: 9\n", "nodes: 9 nodes requested but partition 'cpu' allows 8 per"),
    ("cpus_per_node: 65\n", "cpus_per_node: 65 CPUs per node requested but no node of partition "
                            "'cpu' has that many (the largest has 64)"),
    ("partition: gpu\ncpus_per_node: 2\ngpus_per_node: 4\nnodes: 3\n",
     "gpus_per_node: 3 nodes with 4 GPUs each requested but only 2 node(s) of partition 'gpu'"),
    ("cpus_per_node: 2\nmemory_per_node_mb: 300000\n", "memory_per_node_mb: 300000 MB of memory"),
    ("partition: gpu\ncpus_per_node: 2\ntime_limit: 1-00:00:00\n",
     "time_limit: 1-00:00:00 exceeds the MaxTime 12:00:00 of partition 'gpu'; shorten it"),
    ("cpus_per_node: 2\nnodes: 8\ngpu_workers: {partition: cpu, nodes: 3, cpus_per_node: 2}\n",
     "gpu_workers.nodes: 11 nodes in all requested but partition 'cpu' has 10"),
    ("cpus_per_node: 2\ngpu_workers: {partition: gpu, cpus_per_node: 64}\n",
     "gpu_workers.cpus_per_node: 64 CPUs per node requested but no node of partition 'gpu'"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_specs_the_site_cannot_run_fail_in_one_line(tmp_path: Path, text: str,
                                                    expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        cluster.check_spec(_spec(tmp_path, text), cluster.partitions(Recorded()), "login")
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert message.startswith(str(tmp_path / "site.yaml"))
    assert caught.value.exit_code == 2


def test_a_down_partition_is_a_note_not_an_error(tmp_path: Path) -> None:
    notes = cluster.check_spec(_spec(tmp_path, "partition: old\ncpus_per_node: 8\n"),
                               cluster.partitions(Recorded()), "login")
    assert any("partition 'old' is DOWN" in n for n in notes)
    assert any("0 usable nodes now" in n for n in notes)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("30:15", 1815), ("1:00:00", 3600), ("2-0", 172800), ("2-03:04", 183840),
    ("1-00:00:01", 86401), ("UNLIMITED", 2**31),
])
def test_slurm_time_formats(text: str, seconds: int) -> None:
    assert time_limit_seconds(text) == seconds



@pytest.mark.ci_may_skip
def test_machine_without_slurm_gets_the_fix_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SlurmError, match="client commands are not installed on this machine"):
        LocalRunner(slurm_conf=None).check("rf-no-such-slurm-command --version")
    if shutil.which("scontrol") is None or Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("needs scontrol installed and no machine-wide /etc/slurm/slurm.conf")
    with pytest.raises(SlurmError) as caught:
        LocalRunner(slurm_conf=None).check("scontrol show partition", timeout=20)
    assert "set submit.slurm_conf or submit.host" in str(caught.value)
    assert "\n" not in str(caught.value)
