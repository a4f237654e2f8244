"""The gateway with `sharing.isolation: cluster`: each member reaches a Ray cluster of their own.

The gateway has already said who is asking (their own member token; `Gateway.handle`). Here a
member's request goes, unfiltered, to their own cluster's dashboard (member_clusters.py starts it
on their first request) with that cluster's token in place of theirs: every tab of Ray's dashboard
and every stock `ray job` command work as on a cluster of their own, because it is one. Nothing of
another member's is reachable through it: the cluster holds only their jobs.

The owner's own requests go to the base cluster as before (`None`: the gateway's usual route).
The owner and admins reach a member's cluster with the header `X-Rayfleet-Member: NAME`
(e.g. `ray job list --headers '{"X-Rayfleet-Member": "alice"}'`); an admin without it reaches
their own. Ray's standard library and aiohttp only (node rule).
"""

from __future__ import annotations

from typing import Any

from infra.node import gateway_browser as gb
from infra.node import gateway_limits as gl
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt
from infra.node import member_clusters as mc
from infra.node import member_usage as mu
from infra.node.gateway_jobs import reply

MEMBER_HEADER = "X-Rayfleet-Member"
#: Headers never sent on to a member cluster (hop-by-hop, and every credential the client sent).
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "authorization",
        "x-ray-authorization", "cookie", MEMBER_HEADER.lower(), "sec-websocket-key",
        "sec-websocket-version", "sec-websocket-extensions"}
_BACK_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "set-cookie",
             "content-encoding"}


#: Serve on a member's cluster would bind the head's Serve port (the owner's, another member's)
#: and be reachable by no one: the gateway routes no Serve HTTP. Reading (the Serve tab) stays.
SERVE_REFUSAL = ("Serve is not per member with sharing.isolation: cluster (a member cluster's "
                 "Serve port is not reachable through the gateway); ask the owner to deploy it "
                 "on the base cluster")


def refused_serve(method: str, path: str) -> bool:
    """A deploy or delete through Ray's Serve REST API on a member's cluster."""
    return ((path == "/api/serve" or path.startswith("/api/serve/"))
            and method.upper() not in ("GET", "HEAD"))


def member_named(gateway: Any, name: str) -> gs.Member | None:
    """The member of that name in the gateway's members file (None: none, expired or removed)."""
    named: gs.Member | None = gateway.members.named(name)
    return named


def whose(gateway: Any, request: Any, who: gs.Member) -> gs.Member | str | None:
    """Whose cluster `who` reaches: a member, None for the base cluster, or a refusal line."""
    named = request.headers.get(MEMBER_HEADER, "").strip()
    if named:
        if not who.sees_all:
            return f"{MEMBER_HEADER} is for the cluster's owner and admins"
        return member_named(gateway, named) or f"no member named {named[:64]!r}"
    return None if who.role == "owner" else who


async def route(gateway: Any, request: Any, who: gs.Member,
                target: gt.Target) -> tuple[Any, str | None] | None:
    """The answer for `who`, or None: the gateway's usual route (the owner's base cluster)."""
    if target.path == "/api/authenticate" and request.method == "POST":
        return None  # the dashboard's login: the cookie holds the member's own token
    member = whose(gateway, request, who)
    socket = request.headers.get("Upgrade", "").lower() == "websocket"
    if member is None:
        if socket:  # the owner's `ray job submit` follows its job's log on the base cluster
            return await relay_socket(gateway, request, gateway.config.upstream,
                                      gateway.cluster_token or "", target), None
        return None
    if isinstance(member, str):
        return reply(403, member), None
    if refused_serve(request.method, target.path):
        return reply(403, SERVE_REFUSAL), None
    clusters = member_clusters(gateway)
    try:
        running = await clusters.reach(member.id)
    except mc.Full as exc:
        return reply(503, str(exc)), None
    except mc.Refused as exc:
        return reply(403, str(exc)), None
    except mc.Starting as exc:
        if gb.wants_page(request):
            return starting_page(), None
        return reply(503, str(exc)), None
    except RuntimeError as exc:
        return reply(503, f"your cluster could not start: {exc}"), None
    token = clusters.token(member.id) or ""
    url = f"http://127.0.0.1:{running.dashboard_port}"
    if socket:  # a log tail: under the member's `max_member_tails`, as on a shared cluster
        return await gateway.caps.run(gl.TAILS, member, lambda: relay_socket(
            gateway, request, url, token, target)), None
    refused = await capped(clusters, member, request, target, url)
    if refused is not None:
        return refused, None
    if request.method == "PUT" and target.path.startswith("/api/packages/"):
        return await gateway.caps.run(gl.UPLOADS, member, lambda: relay(
            gateway, request, url, token, target)), None
    return await relay(gateway, request, url, token, target), None


async def capped(clusters: mc.MemberClusters, member: gs.Member, request: Any,
                 target: gt.Target, url: str) -> Any:
    """The one-line refusal of a submit past `max_running_jobs_per_member` (counted on the
    member's own cluster: every job there is theirs) or of an upload past the upload caps
    (by its Content-Length, the member's total kept with their cluster's usage); else None."""
    import asyncio

    limits = clusters.usage.limits
    if request.method == "POST" and target.path in ("/api/jobs", "/api/jobs/"):
        token = clusters.token_path(member.id)
        try:
            jobs = await asyncio.to_thread(mu.list_jobs, url, token)
        except Exception:  # counted on their cluster or not at all: then no submit either
            return reply(502, "your cluster's job API did not answer; try again")
        cap = limits.max_running_jobs_per_member
        if mu.active(jobs) >= cap:
            return reply(429, f"member {member.name} has {mu.active(jobs)} pending or running "
                              f"jobs, the cluster's cap (sharing.max_running_jobs_per_member) "
                              f"is {cap}; wait for one to end or stop one")
    if request.method == "PUT" and target.path.startswith("/api/packages/"):
        refused = clusters.usage.upload_refusal(member.id, request.content_length)
        if refused:
            return reply(413, refused)
    return None


def _headers(request: Any, token: str) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    headers["Authorization"] = f"Bearer {token}"
    return headers


async def relay(gateway: Any, request: Any, url: str, token: str, target: gt.Target) -> Any:
    """`request` to the member's cluster at exactly `target`, its body streamed both ways."""
    from aiohttp import ClientTimeout, web
    from yarl import URL

    async with gateway.session.request(
            request.method, URL(url + target.upstream(), encoded=True),
            data=request.content if request.body_exists else None,
            headers=_headers(request, token), allow_redirects=False,
            timeout=ClientTimeout(total=None, sock_read=600)) as answer:
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _BACK_HOP}
        response = web.StreamResponse(status=answer.status, headers=headers)
        await response.prepare(request)
        async for chunk in answer.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def relay_socket(gateway: Any, request: Any, url: str, token: str,
                       target: gt.Target) -> Any:
    """A WebSocket (`ray job logs -f`) relayed message by message both ways."""
    import asyncio

    from aiohttp import WSMsgType, web
    from yarl import URL

    client = web.WebSocketResponse()
    await client.prepare(request)
    async with gateway.session.ws_connect(URL(url + target.upstream(), encoded=True),
                                          headers={"Authorization": f"Bearer {token}"}) as ray:
        async def upstream() -> None:
            async for message in client:
                if message.type == WSMsgType.TEXT:
                    await ray.send_str(message.data)
                elif message.type == WSMsgType.BINARY:
                    await ray.send_bytes(message.data)
        sender = asyncio.create_task(upstream())
        try:
            async for message in ray:
                if client.closed:
                    break
                if message.type == WSMsgType.TEXT:
                    await client.send_str(message.data)
                elif message.type == WSMsgType.BINARY:
                    await client.send_bytes(message.data)
                else:
                    break
        finally:
            sender.cancel()
    await client.close()
    return client


def starting_page() -> Any:
    """The browser's answer while the member's cluster starts: it asks again in 5 s."""
    from aiohttp import web

    return web.Response(status=503, content_type="text/html", headers={"Retry-After": "5"},
                        text="<!doctype html><meta http-equiv=refresh content=5><title>Starting"
                             "</title><p>Your cluster is starting; this page reloads by itself.")


def member_clusters(gateway: Any) -> mc.MemberClusters:
    """The gateway's member clusters, made at its first member request, with their idle watch."""
    clusters: mc.MemberClusters | None = getattr(gateway, "member_clusters", None)
    if clusters is None:
        clusters = mc.MemberClusters(gateway.config.member_clusters_config, limits(gateway),
                                     gateway.config.data_dir)
        clusters.start_watch(gateway.members.ids)
        gateway.member_clusters = clusters
    return clusters


def limits(gateway: Any) -> mu.Limits:
    """What the gateway's config says of members' usage, for their own clusters."""
    config = gateway.config
    price = config.node_prices.get(config.head_type, config.price_per_hour) \
        if config.node_prices else config.price_per_hour
    return mu.Limits(
        head_price_per_hour=float(price), max_job_hours=config.max_job_hours,
        member_budget_hours=config.member_budget_hours, member_budget_usd=config.member_budget_usd,
        max_running_jobs_per_member=config.max_running_jobs_per_member,
        max_upload_mb=config.max_upload_mb, max_member_upload_mb=config.max_member_upload_mb,
        budget_reached=lambda: bool(gateway.usage.cluster.budget_reached_at))


async def shutdown(gateway: Any) -> None:
    clusters = getattr(gateway, "member_clusters", None)
    if clusters is not None:
        await clusters.shutdown()
