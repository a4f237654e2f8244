"""With `isolation: cluster`, Serve is not per member: the gateway refuses a member's deploy or
delete through Ray's Serve REST API in one line, before their cluster is asked (issue 48)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from infra.node import gateway_isolated as gi
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt

ALICE = gs.Member("alice", "member", id="0123456789abcdef")


class NoCluster:
    """A gateway whose member clusters must not be reached for a refused request."""

    @property
    def member_clusters(self) -> Any:
        raise AssertionError("a refused Serve request reached the member's cluster")


def answer(method: str, path: str) -> Any:
    request = SimpleNamespace(method=method, headers={})
    return asyncio.run(gi.route(NoCluster(), request, ALICE, gt.read(path)))


@pytest.mark.parametrize(("method", "path"), [
    ("PUT", "/api/serve/applications/"), ("DELETE", "/api/serve/applications/"),
    ("POST", "/api/serve/applications"), ("PUT", "/api/serve")])
def test_a_members_serve_deploy_is_refused_in_one_line(method: str, path: str) -> None:
    response, _ = answer(method, path)
    assert response.status == 403
    text = response.text.strip()
    assert "\n" not in text and "sharing.isolation: cluster" in text and "owner" in text


def test_reading_serve_and_other_paths_are_not_refused() -> None:
    for method, path in (("GET", "/api/serve/applications/"), ("PUT", "/api/packages/gcs/x.zip"),
                         ("POST", "/api/jobs/")):
        assert not gi.refused_serve(method, path), (method, path)
