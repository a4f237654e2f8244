"""Working-dir packages through the gateway: each member's own, never replaced, size-capped.

Ray stores a package under a name that is a hash of its content and overwrites on a second PUT,
and its client skips the upload when the name already exists: a member who PUT a zip under the
name a classmate's starter repo hashes to would run their code in the classmate's job. So every
package name a member sends is mapped to a name of their own (`scoped`): their uploads, their
existence checks and the `gcs://` URIs of their submits all name packages under their id, which
no other member can write to or read. A PUT over an existing package is refused; a body streams
through with a cap per upload and per member, never held whole. Ray and what Ray brings only.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

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

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream.iter_chunked(1 << 16):
            self.seen += len(chunk)
            if self.seen > self.limit:
                raise TooLarge(self.seen)
            yield chunk


async def handle(gateway: Gateway, request: Any, who: gs.Member, protocol: str, name: str) -> Any:
    """A member's working-dir package: under their own name at Ray, never replaced, capped."""
    from aiohttp import web

    target = gt.Target(f"/api/packages/{protocol}/{scoped(who.id, name)}")
    if request.method != "PUT":
        return await gateway.forward(request, who, target)
    limit = int(gateway.config.max_upload_mb * 1024 * 1024)
    if (request.content_length or 0) > limit:
        return reply(413, f"the package is larger than sharing.max_upload_mb "
                           f"({gateway.config.max_upload_mb:g} MB)")
    used = gateway.usage.uploaded(who.id)
    total = int(gateway.config.max_member_upload_mb * 1024 * 1024)
    lock = gateway.locks.setdefault(f"package:{target.path}", asyncio.Lock())
    async with lock:  # two PUTs of one new name: the second finds the first's
        status, _ = await gateway.upstream_raw("GET", target.path)
        if status == 200:
            return reply(409, f"package {name} exists and is never replaced (its name is "
                               "its content's hash: submit with it as it is)")
        body = Capped(request.content, min(limit, total - used))
        try:
            async with gateway.session.request(
                    "PUT", gateway.upstream_url(target), data=body.chunks(),
                    headers=gateway.upstream_headers(request.headers)) as answer:
                content = await answer.read()
        except TooLarge:
            what = ("sharing.max_upload_mb" if total - used >= limit
                    else "sharing.max_member_upload_mb, your total")
            return reply(413, f"the package is larger than {what} allows")
        if answer.status == 200:
            gateway.usage.add_upload(who.id, body.seen)
    return web.Response(status=answer.status, body=gateway.scrub_bytes(content))
