"""Working-dir packages through the gateway: each member's own, never replaced, size-capped.

Ray stores a package under a name that is a hash of its content and overwrites on a second PUT,
and its client skips the upload when the name already exists: a member who PUT a zip under the
name a classmate's starter repo hashes to would run their code in the classmate's job. So every
package name a member sends is mapped to a name of their own (`scoped`): their uploads, their
existence checks and the `gcs://` URIs of their submits all name packages under their id, which
no other member can write to or read. A body streams through with a cap per upload and per
member, never held whole, and its SHA-256 is recorded: a later PUT of the same name by the same
member is answered 200 without an upload when its bytes are the same (Ray's client checks, then
uploads, so two submits at once both upload), and 409 when they differ (a package is never
replaced). Each member's uploads go one at a time under one lock of theirs, under which their
total is read and raised: parallel uploads cannot all pass `max_member_upload_mb`, and the same
bytes count once. Ray and what Ray brings only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from infra.node import gateway_limits as gl
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt

#: A package name as Ray's client makes it: a hash of the content (sha1 or Ray's own, in hex).
#: Wheels, named by their file name, are not taken through the gateway.
_NAME = r"_ray_pkg_[0-9a-f]{16,64}\.(?:zip|tar\.gz|tar\.xz)"
#: `/api/packages/<protocol>/<name>` as Ray's job SDK sends it (protocol `gcs`).
PACKAGE_PATH = re.compile(rf"/api/packages/(gcs)/({_NAME})")
_URI = re.compile(rf"gcs://({_NAME})")
_PREFIX = "_ray_pkg_"


class Gateway(Protocol):
    """What of the gateway (gateway.py) a package request uses; the gateway passes itself."""

    config: Any
    usage: gs.Usage
    session: Any
    locks: dict[str, asyncio.Lock]

    async def forward(self, request: Any, who: gs.Member, target: gt.Target,
                      body: bytes | None = None) -> Any: ...

    async def upstream_raw(self, method: str, path: str, query: str = "") -> tuple[int, bytes]: ...

    def upstream_url(self, target: gt.Target) -> Any: ...

    def upstream_headers(self, request_headers: Any = None) -> dict[str, str]: ...

    def scrub_bytes(self, data: bytes) -> bytes: ...


def reply(status: int, text: str) -> Any:
    from aiohttp import web

    return web.Response(status=status, text=text + "\n")


class Refused(ValueError):
    """A submit names a package in a way the gateway does not forward (400 with this text)."""


class TooLarge(Exception):
    """An upload passed its cap while streaming."""


def scoped(member_id: str, name: str) -> str:
    """The name under which Ray keeps `member_id`'s package `name` (Ray's own prefix kept: its
    working-dir code reads a package's URI by that shape)."""
    return f"{_PREFIX}rf{member_id}_{name.removeprefix(_PREFIX)}"


def scope_runtime_env(runtime_env: dict[str, Any], member_id: str) -> dict[str, Any]:
    """`runtime_env` with every `gcs://` package it names mapped to the member's own; any other
    place a `gcs://` URI appears is refused (a member reaches only packages they uploaded)."""
    out = dict(runtime_env)
    if isinstance(out.get("working_dir"), str):
        out["working_dir"] = _scope_uri(out["working_dir"], member_id)
    if isinstance(out.get("py_modules"), list):
        out["py_modules"] = [_scope_uri(m, member_id) if isinstance(m, str) else m
                             for m in out["py_modules"]]
    rest = {k: v for k, v in out.items() if k not in ("working_dir", "py_modules")}
    if "gcs://" in repr(rest) or any("gcs://" in repr(m) for m in out.get("py_modules") or []
                                     if not isinstance(m, str)):
        raise Refused("runtime_env names a gcs:// package outside working_dir and py_modules; "
                      "upload it as your working_dir or one of your py_modules")
    return out


def _scope_uri(uri: str, member_id: str) -> str:
    if not uri.startswith("gcs://"):
        return uri
    match = _URI.fullmatch(uri)
    if not match:
        raise Refused(f"runtime_env: {uri[:80]!r} is not a package name Ray's client makes "
                      "(gcs://_ray_pkg_<hash>.zip); a wheel goes in runtime_env.pip instead")
    return f"gcs://{scoped(member_id, match.group(1))}"


class Capped:
    """A request body passed on in chunks, never held whole; TooLarge once more than `limit`
    bytes came. `seen` counts what went through."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream, self.limit, self.seen = stream, limit, 0
        self.sha256 = hashlib.sha256()
        self.over = False

    async def chunks(self) -> AsyncIterator[bytes]:
        # A body that sends nothing for a while is cut (gateway_limits.UPLOAD_IDLE_S: 408).
        async for chunk in gl.idle_chunks(self.stream):
            self.seen += len(chunk)
            if self.seen > self.limit:
                self.over = True
                raise TooLarge(self.seen)
            self.sha256.update(chunk)
            yield chunk


async def handle(gateway: Gateway, request: Any, who: gs.Member, protocol: str, name: str) -> Any:
    """A member's working-dir package: under their own name at Ray, never replaced, capped."""
    from aiohttp import web

    own = scoped(who.id, name)
    target = gt.Target(f"/api/packages/{protocol}/{own}")
    if request.method != "PUT":
        return await gateway.forward(request, who, target)
    limit = int(gateway.config.max_upload_mb * 1024 * 1024)
    if (request.content_length or 0) > limit:
        return reply(413, f"the package is larger than sharing.max_upload_mb "
                           f"({gateway.config.max_upload_mb:g} MB)")
    total = int(gateway.config.max_member_upload_mb * 1024 * 1024)
    async with gateway.locks.setdefault(f"uploads:{who.id}", asyncio.Lock()):
        status, _ = await gateway.upstream_raw("GET", target.path)
        if status != 200:
            used = gateway.usage.uploaded(who.id)
            body = Capped(request.content, min(limit, total - used))
            too_large = reply(413, "the package is larger than " + (
                "sharing.max_upload_mb" if total - used >= limit
                else "sharing.max_member_upload_mb, your total,") + " allows")
            if (request.content_length or 0) > body.limit:
                return too_large
            try:
                async with gateway.session.request(
                        "PUT", gateway.upstream_url(target), data=body.chunks(),
                        headers=gateway.upstream_headers(request.headers)) as answer:
                    content = await answer.read()
            except Exception:
                if body.over:  # aiohttp may hand the body's TooLarge on as a connection error
                    return too_large
                raise
            if answer.status == 200:
                gateway.usage.add_package(who.id, own, body.sha256.hexdigest(), body.seen)
            return web.Response(status=answer.status, body=gateway.scrub_bytes(content))
        recorded = gateway.usage.package_digest(who.id, own)
    # There already (the name is never reused, so outside the lock): the same bytes again.
    return await _again(request, name, recorded, limit)


async def _again(request: Any, name: str, recorded: str | None, limit: int) -> Any:
    """A PUT of a package the member has: 200 when its bytes are those recorded (read through,
    counted nowhere), else 409."""
    body = Capped(request.content, limit)
    try:
        async for _ in body.chunks():
            pass
    except TooLarge:
        return reply(413, "the package is larger than sharing.max_upload_mb allows")
    if recorded is not None and hmac.compare_digest(recorded, body.sha256.hexdigest()):
        return reply(200, f"package {name} is there already, with these bytes")
    return reply(409, f"package {name} exists with other bytes and is never replaced (its "
                      "name is its content's hash: submit with it as it is)")
