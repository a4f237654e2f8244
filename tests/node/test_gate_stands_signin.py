"""Issue 47, sign-in for a shared NAT, against the real gateway over real TLS (tests/node/gateway_bed.py):
a valid token signs in whatever failed before it from the same address; the browser's cookie is a
session id, never the token, ended at removal, expiry, a new token and sign-out; a browser's write
from another origin is refused, while Ray's CLI form (a header token, no Origin) passes."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from infra.node import gateway_browser as gb
from infra.node import gateway_sessions as gsn
from infra.node import gateway_state as gs
from infra.node.files import atomic_write
from tests.node.gateway_bed import ANN, BO, OWNER, Bed, gateway_bed
from tests.waiting import wait_until

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    with gateway_bed(tmp_path, monkeypatch) as started:
        yield started


def _own(bed: Bed) -> dict[str, str]:
    return {"Origin": f"https://127.0.0.1:{bed.port}"}


def _session_cookie(lines: list[str]) -> tuple[str, str]:
    """The session cookie an answer sets: its value and the whole Set-Cookie line."""
    found = [line for line in lines if line.lower().startswith("set-cookie:")
             and f"{gb.COOKIE}=" in line]
    assert len(found) == 1, lines
    value = found[0].split(f"{gb.COOKIE}=", 1)[1].split(";", 1)[0].strip('"')
    return value, found[0]


def _sign_in(bed: Bed, token: str) -> tuple[int, list[str]]:
    status, lines, _ = bed.exchange("POST", gb.LOGIN_PATH, token=None,
                                    body=f"token={quote(token)}".encode(),
                                    headers={**FORM, **_own(bed)})
    return status, lines


def _signed_in(bed: Bed, token: str = ANN) -> str:
    status, lines = _sign_in(bed, token)
    assert status == 303, lines
    return _session_cookie(lines)[0]


def _jobs_with(bed: Bed, cookie: str) -> int:
    return bed.send("GET", "/api/jobs/", token=None, headers={"Cookie": f"{gb.COOKIE}={cookie}"})[0]


def _registry(bed: Bed) -> Path:
    return Path(bed.gateway.config.data_dir) / gs.MEMBERS_FILE


def _rewrite(bed: Bed, change: object) -> None:
    """The members file changed as `member-remove`/`rotate-token` change it: a new file."""
    data = json.loads(_registry(bed).read_text())
    change(data)  # type: ignore[operator]
    atomic_write(_registry(bed), json.dumps(data))


def test_twelve_bad_sign_ins_from_one_address_then_a_valid_token_signs_in(bed: Bed) -> None:
    answers = [_sign_in(bed, "f" * 64)[0] for _ in range(12)]
    # The address is past the limit: the wrong tokens are turned away...
    assert answers[:gs.MAX_FAILURES] == [403] * gs.MAX_FAILURES and answers[-1] == 429, answers
    # ...and a member behind the same address still signs in at once, with a session cookie.
    status, lines = _sign_in(bed, BO)
    assert status == 303, lines
    cookie, _ = _session_cookie(lines)
    assert _jobs_with(bed, cookie) == 200
    # A header token from that address passes as well, and a wrong one is still turned away.
    assert bed.send("GET", "/api/jobs/", token=ANN)[0] == 200
    assert bed.send("GET", "/api/jobs/", token="e" * 64)[0] == 429


def test_the_cookie_is_a_session_never_the_token(bed: Bed) -> None:
    status, lines = _sign_in(bed, ANN)
    assert status == 303
    cookie, line = _session_cookie(lines)
    assert ANN not in line and cookie != gs.token_hash(ANN) and len(cookie) >= 40
    attributes = {part.strip().split("=")[0].lower() for part in line.split(";")}
    assert {"httponly", "secure", "samesite", "max-age", "path"} <= attributes, line
    assert "samesite=strict" in line.lower()
    max_age = int(line.lower().split("max-age=")[1].split(";")[0])
    assert 0 < max_age <= 12 * 3600
    # The session acts as its member: ann's own job list, not bo's.
    status, text = bed.send("GET", "/api/jobs/", token=None,
                            headers={"Cookie": f"{gb.COOKIE}={cookie}"})
    assert status == 200 and [j["submission_id"] for j in json.loads(text)] == ["raysubmit_ann1"]
    # A raw token in that cookie (what a browser kept from before) is nobody.
    assert _jobs_with(bed, ANN) == 403


def test_the_dashboards_own_login_sets_a_session_not_the_token(bed: Bed) -> None:
    """Ray's page POSTs the pasted token to /api/authenticate (Authorization: Bearer)."""
    status, lines, text = bed.exchange("POST", "/api/authenticate", token=ANN, headers=_own(bed))
    assert status == 200 and json.loads(text)["status"] == "authenticated"
    cookie, line = _session_cookie(lines)
    assert ANN not in line
    assert _jobs_with(bed, cookie) == 200


def test_a_session_ends_when_its_member_is_removed(bed: Bed) -> None:
    cookie = _signed_in(bed, ANN)
    assert _jobs_with(bed, cookie) == 200
    _rewrite(bed, lambda data: data["members"].pop("ann"))
    assert _jobs_with(bed, cookie) == 403
    # Ended in the gateway, not merely refused: the entry put back would not revive it.
    assert len(bed.gateway.sessions) == 0
    page = bed.send("GET", "/", token=None, headers={"Cookie": f"{gb.COOKIE}={cookie}",
                                                      "Accept": "text/html"})
    assert page[0] == 200 and b"session has ended" in page[1]


def test_a_session_ends_when_its_token_is_replaced(bed: Bed) -> None:
    """The owner's gateway token rotated (member-remove, rotate-token): its session ends too."""
    cookie = _signed_in(bed, OWNER)
    assert _jobs_with(bed, cookie) == 200
    _rewrite(bed, lambda data: data.__setitem__("owner", {"token_sha256": gs.token_hash("n" * 64)}))
    assert _jobs_with(bed, cookie) == 403
    assert bed.send("GET", "/api/jobs/", token=OWNER)[0] == 403
    page = bed.send("GET", "/", token=None, headers={"Cookie": f"{gb.COOKIE}={cookie}",
                                                      "Accept": "text/html"})
    assert page[0] == 200 and b"session has ended" in page[1]
    # A member's entry given a new token under the same id (no verb does it; the rule holds).
    ann = _signed_in(bed, ANN)
    _rewrite(bed, lambda data: data["members"]["ann"].__setitem__("token_sha256",
                                                                   gs.token_hash("m" * 64)))
    assert _jobs_with(bed, ann) == 403


def test_a_session_ends_at_expiry_of_its_member_and_of_itself(bed: Bed) -> None:
    cookie = _signed_in(bed, ANN)
    past = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)).isoformat(timespec="seconds")
    _rewrite(bed, lambda data: data["members"]["ann"].__setitem__("expires", past))
    assert _jobs_with(bed, cookie) == 403
    # The session's own end: a short lifetime here, SESSION_S (12 h) in service.
    assert gsn.SESSION_S <= 12 * 3600
    bed.gateway.sessions.lifetime = 1.0
    bo = _signed_in(bed, BO)
    assert _jobs_with(bed, bo) == 200
    wait_until(lambda: _jobs_with(bed, bo) == 403, "bo's 1-second session to end", timeout=20,
               interval=0.2)


def test_sign_out_ends_the_session_and_clears_the_cookie(bed: Bed) -> None:
    cookie = _signed_in(bed, ANN)
    page = bed.send("GET", "/", token=None, headers={"Cookie": f"{gb.COOKIE}={cookie}",
                                                      "Accept": "text/html"})
    assert page[0] == 200 and gb.LOGOUT_PATH.encode() in page[1] and b"Sign out" in page[1]
    status, lines, _ = bed.exchange("POST", gb.LOGOUT_PATH, token=None,
                                    headers={"Cookie": f"{gb.COOKIE}={cookie}", **_own(bed)})
    assert status == 303
    cleared, line = _session_cookie(lines)
    assert cleared == "" and ("max-age=0" in line.lower() or "expires=" in line.lower()), line
    # The old cookie, kept by a browser or copied elsewhere, is refused from now on.
    assert _jobs_with(bed, cookie) == 403


def test_a_browsers_write_from_another_origin_is_refused(bed: Bed) -> None:
    cookie = _signed_in(bed, ANN)
    jar = {"Cookie": f"{gb.COOKIE}={cookie}"}
    before = len(bed.upstream.seen)
    stop = "/api/jobs/raysubmit_ann1/stop"
    submit = json.dumps({"entrypoint": "python -c 1"}).encode()
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Origin": f"https://127.0.0.1:{bed.port + 1}"},  # the same host, another port
                    {"Referer": "https://evil.example/page"}, {}):
        for method, target, body in (("POST", stop, b""), ("POST", "/api/jobs/", submit),
                                     ("DELETE", "/api/jobs/raysubmit_ann1", b"")):
            status, text = bed.send(method, target, token=None, body=body,
                                    headers={**jar, "Content-Type": "text/plain", **headers})
            assert status == 403 and text.count(b"\n") == 1 and b"own pages" in text, \
                (headers, method, target, text)
    assert len(bed.upstream.seen) == before  # nothing reached Ray
    # From the gateway's own pages the same write goes on.
    assert bed.send("POST", stop, token=None, headers={**jar, **_own(bed)})[0] == 200
    # Ray's CLI and SDK: a header token, no Origin, no cookie: they pass as before.
    assert bed.send("POST", stop, token=ANN)[0] == 200
    assert bed.send("GET", "/api/jobs/", token=None, headers={"X-Ray-Authorization": ANN})[0] == 200
    assert bed.send("POST", stop, token=None, headers={"X-Ray-Authorization": f"Bearer {ANN}"})[0] \
        == 200
    # A sign-in form posted from another page is refused too (nobody is signed in by another site).
    status, _, _ = bed.exchange("POST", gb.LOGIN_PATH, token=None, body=f"token={ANN}".encode(),
                                headers={**FORM, "Origin": "https://evil.example"})
    assert status == 403


def test_a_members_file_replaced_within_one_timestamp_step_is_read_again(tmp_path: Path) -> None:
    """A removal or a renewed token rewrites the file to the same size within a coarse timestamp
    (1 s on some file systems): the gateway must still see the new file, not the old token."""
    path = tmp_path / gs.MEMBERS_FILE

    def write(token: str) -> None:
        atomic_write(path, json.dumps({"members": {}, "owner": {
            "token_sha256": gs.token_hash(token)}}), mode=0o600)
        os.utime(path, ns=(10**18, 10**18))  # the same stamp for both writes

    write("a" * 64)
    members = gs.Members(path)
    assert members.lookup("a" * 64) is not None
    write("b" * 64)
    assert members.lookup("a" * 64) is None and members.lookup("b" * 64) is not None
