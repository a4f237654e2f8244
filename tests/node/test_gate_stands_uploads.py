"""Working-dir uploads through the real gateway (over real TLS, a recording upstream behind it):
idempotent for the same member and the same bytes, however often and however concurrently, and
counted once against `max_member_upload_mb`, which parallel uploads cannot pass together."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from infra.node import gateway_packages as gk
from infra.node import gateway_state as gs
from tests.node.gateway_bed import ANN, IDS, Bed, gateway_bed

MB = 1024 * 1024


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:  # 1 MB an upload, 2 MB a member
        yield started


def _at_once(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Every call started together (a barrier), from as many threads; their answers in order."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def test_parallel_uploads_of_one_member_pass_their_cap_no_more_than_serial_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six different 0.9 MB packages at once under a 1 MB member cap: one fits, and no more
    than that reaches Ray or the member's total (the total was read under a lock per package:
    all six passed). The others are refused whole (413), or told to wait while others stream."""
    with gateway_bed(tmp_path, monkeypatch, max_member_upload_mb=1) as bed:
        names = [f"_ray_pkg_{n:016x}.zip" for n in range(6)]
        answers = _at_once([partial(bed.send, "PUT", f"/api/packages/gcs/{name}",
                                    body=name.encode() * (int(0.9 * MB) // 30))
                            for name in names])
        statuses = sorted(status for status, _ in answers)
        assert statuses.count(200) == 1 and set(statuses) <= {200, 413, 429}, answers
        assert 413 in statuses  # one came through while the first was counted, and was refused
        stored = sum(len(body) for body in bed.upstream.packages.values())
        assert stored <= MB and bed.gateway.usage.uploaded(IDS["ann"]) == stored


def _class_of(bed: Bed, size: int) -> dict[str, str]:
    """`size` more members in the gateway's members file (ann and bo stay): token -> id."""
    path = Path(bed.gateway.config.data_dir) / gs.MEMBERS_FILE
    data = json.loads(path.read_text())
    tokens = {f"t-stu{n}": f"{n:016x}" for n in range(size)}
    for n, (token, member_id) in enumerate(tokens.items()):
        data["members"][f"stu{n}"] = {"role": "member", "id": member_id,
                                      "token_sha256": gs.token_hash(token)}
    path.write_text(json.dumps(data))
    return tokens


def test_thirty_members_each_uploading_one_folder_twice_at_once_all_succeed(bed: Bed) -> None:
    """A class submitting the same starter folder at once, each with two submits racing (Ray's
    client asks whether the package exists, then uploads: both upload): every PUT answers 200,
    each member has one package of those bytes, counted once."""
    tokens = _class_of(bed, 30)
    name, body = "_ray_pkg_ffc146a66fb9a575.zip", b"the starter repo" * 4096
    calls = [partial(bed.send, "PUT", f"/api/packages/gcs/{name}", token=token, body=body)
             for token in tokens for _ in range(2)]
    answers = _at_once(calls)
    assert [status for status, _ in answers] == [200] * 60, [a for a in answers if a[0] != 200]
    assert bed.upstream.packages == {gk.scoped(member_id, name): body
                                     for member_id in tokens.values()}
    assert {member_id: bed.gateway.usage.uploaded(member_id) for member_id in tokens.values()} \
        == dict.fromkeys(tokens.values(), len(body))


def test_the_same_bytes_again_succeed_and_count_once_other_bytes_are_refused(bed: Bed) -> None:
    name, body = "_ray_pkg_0123456789abcdef.zip", b"ann's code" * 1000
    for _ in range(3):
        assert bed.send("PUT", f"/api/packages/gcs/{name}", token=ANN, body=body)[0] == 200
    assert bed.gateway.usage.uploaded(IDS["ann"]) == len(body)
    puts = [p for m, p, _ in bed.upstream.seen if m == "PUT"]
    assert len(puts) == 1  # the later ones never reached Ray
    status, text = bed.send("PUT", f"/api/packages/gcs/{name}", token=ANN, body=b"other bytes")
    assert status == 409 and b"never replaced" in text
    assert bed.upstream.packages == {gk.scoped(IDS["ann"], name): body}
    assert bed.gateway.usage.uploaded(IDS["ann"]) == len(body)
