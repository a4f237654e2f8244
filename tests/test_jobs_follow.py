"""`jobs.follow` survives a dropped log stream (Ray's 1006 "closed unexpectedly") while the job runs:
it attaches again and prints each line once; a stream lost for good is one line, not a traceback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from infra.core import jobs
from infra.core.errors import JobError


class _Status:
    def __init__(self, value: str) -> None:
        self.value = value


class FlakyStream:
    """A job whose log stream drops `drops` times after the first chunk, then ends normally."""

    def __init__(self, drops: int, final: str = "SUCCEEDED") -> None:
        self.drops = drops
        self.final = final
        self.attached = 0

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        self.attached += 1
        yield "line 1\n"
        if self.attached <= self.drops:
            raise RuntimeError("WebSocket connection closed unexpectedly with close code 1006")
        yield "line 2\n"

    def get_job_status(self, job_id: str) -> Any:
        return _Status("RUNNING" if self.attached <= self.drops else self.final)


def test_a_dropped_stream_is_attached_again_without_repeating_lines(
        capsys: pytest.CaptureFixture[str]) -> None:
    client = FlakyStream(drops=2)
    assert jobs.follow(client, "raysubmit_x") == 0
    out, err = capsys.readouterr()
    assert out == "line 1\nline 2\n" and client.attached == 3
    assert "dropped" in err


def test_a_stream_lost_for_good_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(JobError) as caught:
        jobs.follow(FlakyStream(drops=99), "raysubmit_x")
    assert "lost the log stream of job raysubmit_x" in str(caught.value)
    assert "\n" not in str(caught.value)
