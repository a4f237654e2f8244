"""squeue's answers as queue.py reads them: rows, gone, or failed (never "gone" on failure)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from infra.node.slurm import queue
from infra.node.slurm.queue import QueueUnavailable

ROW = "42|RUNNING|None|n1|1:02|1:00:00|debug|58:58|rf-c-0a1b2c3d-h123456|{comment}"


def answer(body: str, code: int) -> str:
    return f"{body}\n@@rayfleet-rc={code}\n"


def test_rows_and_ownership_come_from_the_comment() -> None:
    ours = queue.comment("0a1b2c3d", "abcdefabcdef", "c", "worker", type="cpu", request="r-1")
    theirs = queue.comment("ffffffff", "abcdefabcdef", "c", "head")
    rows = queue.parse(answer("\n".join([ROW.format(comment=ours),
                                         ROW.format(comment=theirs).replace("42|", "43|"),
                                         ROW.format(comment="(null)").replace("42|", "44|")]),
                              0), "jobs")
    assert [r.job_id for r in rows] == ["42", "43", "44"]
    assert [r.ours("0a1b2c3d") for r in rows] == [True, False, False]
    assert rows[0].tags == {"rayfleet-cluster": "0a1b2c3d", "rayfleet-owner": "abcdefabcdef",
                            "rayfleet-name": "c", "role": "worker", "type": "cpu",
                            "request": "r-1"}
    assert rows[0].seconds_left == 58 * 60 + 58


def test_gone_is_an_empty_answer_or_a_purged_job() -> None:
    assert queue.parse(answer("", 0), "job 42") == []
    assert queue.parse(answer("slurm_load_jobs error: Invalid job id specified", 1), "j") == []


@pytest.mark.parametrize("body", [
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "slurm_load_jobs error: Socket timed out on send/recv operation",
])
def test_a_failed_squeue_is_unavailable_never_empty(body: str) -> None:
    with pytest.raises(QueueUnavailable, match=r"controller|timed out"):
        queue.parse(answer(body, 1), "job 42")
    # The connection dropped before squeue answered at all.
    with pytest.raises(QueueUnavailable, match="no answer"):
        queue.parse("", "job 42")


@pytest.mark.parametrize(("text", "seconds"), [
    ("5", 300), ("5:30", 330), ("1:00:00", 3600), ("2-03", 2 * 86400 + 3 * 3600),
    ("1-00:00:10", 86410), ("UNLIMITED", 2**31)])
def test_slurm_times(text: str, seconds: int) -> None:
    assert queue.time_limit_seconds(text) == seconds
    if seconds < 2**31:
        assert queue.time_limit_seconds(queue.slurm_time(seconds)) == seconds


def test_a_tunnel_into_a_compute_node_nests_the_login_hosts_proxy(tmp_path: Path) -> None:
    from infra.core import ssh
    from infra.providers.slurm import remote

    key = tmp_path / "id"
    key.write_text("not a key")
    login = ssh.SshTarget(host="10.200.1.11", user="alice", key_path=key,
                          proxy_command="nsenter --net=/run/netns/x -- nc %h %p",
                          known_hosts=tmp_path / "known", host_key_policy="strict")
    argv = shlex.split(remote.via(login))
    # The outer ssh expands %h:%p to the compute node; the login host's own proxy keeps its %h/%p
    # (doubled) for the inner ssh, which expands them to the login host.
    assert argv[:3] == ["ssh", "-W", "%h:%p"] and argv[-1] == "alice@10.200.1.11"
    assert "ProxyCommand=nsenter --net=/run/netns/x -- nc %%h %%p" in argv
    assert "StrictHostKeyChecking=yes" in argv and f"UserKnownHostsFile={tmp_path / 'known'}" in argv
    assert ssh.expand_proxy(remote.via(login), "10.200.1.12", 22).count("%h") == 1


def test_patiently_is_the_one_retry_policy_for_an_unanswering_controller() -> None:
    answers: list[Exception | str] = [queue.QueueUnavailable("squeue (x) failed: timed out"),
                                      queue.SlurmError("sbatch: error: Socket timed out"), "rows"]
    started = time.monotonic()

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert queue.patiently(call, "reading the queue") == "rows" and answers == []
    # Backoff: 0.5 s, then twice that.
    assert time.monotonic() - started >= queue.FIRST_DELAY_S * 3 * 0.99
    # A failure that is not the controller's is not retried.
    answers[:] = [queue.SlurmError("sbatch: error: invalid partition"), "rows"]
    with pytest.raises(queue.SlurmError, match="invalid partition"):
        queue.patiently(call, "submitting")
    assert answers == ["rows"]
    # Past its patience: QueueUnavailable naming what was being done, never an empty answer.
    answers[:] = [queue.QueueUnavailable("squeue (x) failed: timed out")] * 3
    with pytest.raises(queue.QueueUnavailable, match=r"\(for 0s while listing jobs\); is "
                                                     r"slurmctld answering"):
        queue.patiently(call, "listing jobs", patience=0.1)
    assert len(answers) == 2
