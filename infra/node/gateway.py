"""The sharing gateway: members reach Ray's job API and dashboard through it, each with their own token.

`python -m infra.node.gateway --config FILE` runs an aiohttp server on TLS 1.2+ in front of the
head's dashboard (plain HTTP on the head's loopback). It takes Ray's own ways of presenting a token
(`Authorization: Bearer`, `X-Ray-Authorization`), so the stock `ray job` CLI and
`JobSubmissionClient` work unchanged, and a browser's session cookie (gateway_sessions.py: a
session id, never a token); it strips whatever was presented and forwards with the cluster token.
The cluster's Ray token is accepted from nobody: every node holds it, so any member's job can read
it. The owner has a gateway token of their own (its hash in the members file), kept on the
owner's machine, which `member-remove` and `rotate-token` replace (where jobs run as the owner's
account, `local`, a job can read it: infra/core/sharing/owner.py says so at `plan` and `up`).

Every request's target is read once (gateway_target.py): the rules check the decoded, normal path
and exactly that path goes upstream. A member submits, lists, reads the logs of, stops and deletes
only their own jobs: those the gateway's own record says they submitted (by member id, made at
submit; Ray's job metadata is not evidence, as code inside the cluster can set it); another's job
is answered as Ray answers a job that does not exist. An admin member and the owner act on all.
Working-dir packages are each member's own (gateway_packages.py). Every stop the cluster makes is
followed until the job has ended, with its actors (gateway_stops.py). Everything else that changes
the cluster is refused to members; of the dashboard they get its pages and the cluster-wide views
listed in DASHBOARD_VIEWS, and the page's own calls get their jobs' data or a quiet empty answer
(gateway_dashboard.py). Nothing a member receives carries the cluster token or another secret
the config names. The state it keeps (members, usage, audit) is in gateway_state.py. Ray and what
Ray brings (aiohttp, yarl) only: it ships to heads in the node package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from infra.node import gateway_browser as gb
from infra.node import gateway_dashboard as gd
from infra.node import gateway_isolated as gi
from infra.node import gateway_limits as gl
from infra.node import gateway_packages as gk
from infra.node import gateway_removed as gr
from infra.node import gateway_sessions as gsn
from infra.node import gateway_state as gs
from infra.node import gateway_target as gt
from infra.node import gateway_usage_view as uv
from infra.node.gateway_config import Config, read_config
from infra.node.gateway_jobs import JobRoutes, reply
from infra.node.gateway_tick import Ticks

#: Read-only views of the dashboard a member may open as Ray answers them (cluster-wide, the same
#: for every member); the dashboard's other calls are answered in gateway_dashboard.py.
DASHBOARD_VIEWS = ("/", "/index.html", "/favicon.ico", "/logo.svg", "/timezone",
                   "/api/cluster_status", "/api/v0/cluster_metadata", "/usage_stats_enabled",
                   "/api/v0/runtime_env_redaction")
#: Answered for every member, like the job SDK's connection check.
OPEN_VIEWS = ("/api/version", "/api/authentication_mode")
_JOB = re.compile(r"/api/jobs/([^/]+)(/logs|/logs/tail|/stop)?/?")
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "content-encoding",
        "authorization", "x-ray-authorization", "cookie", "set-cookie"}
#: No call to Ray that the gateway relays takes longer (gateway_limits: its own take less).
UPSTREAM_TIMEOUT_S = gl.UPSTREAM_TIMEOUT_S


class Gateway(JobRoutes, gd.DashboardViews, Ticks):
    def __init__(self, config: Config) -> None:
        self.config = config
        data = Path(config.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.members = gs.Members(data / gs.MEMBERS_FILE)
        self.usage = gs.Usage(data / gs.USAGE_FILE)
        self.audit = gs.Audit(data / gs.AUDIT_FILE)
        self.failures = gs.FailedLogins()
        self.sessions = gsn.Sessions()  # browsers signed in: in memory, a restart signs them out
        self.rate = gs.RequestRate()
        self._token_file = gs.SecretFile(config.token_path)
        self._secret_files = [gs.SecretFile(p) for p in config.secret_paths]
        self.locks: dict[str, asyncio.Lock] = {}
        #: Members' calls to Ray, and the gateway's own (its tick), each in its own pool.
        self.session: Any = None
        self.own_session: Any = None
        self.caps = gl.Caps(config)  # per member: connections, uploads, log tails
        self.doorman = gl.Doorman(self.caps)
        #: Open log streams per member id: a removed member's are closed (`close_removed`).
        self.tails: dict[str, set[Any]] = {}
        # Ray's job list as last answered, parsed once per distinct answer, and each viewer's
        # filtered rendering of it: a class's job history grows to thousands of entries, and
        # decoding and re-encoding them was most of a list request's time (bench/gateway.py).
        self._jobs_raw: bytes | None = None
        self._jobs: list[dict[str, Any]] = []
        self._rendered: dict[str, str] = {}
        self._rendered_for: tuple[bytes | None, int] = (None, -1)
        #: True once a tick has recorded every member job Ray lists (see `over_cap`).
        self.ticked = False
        self._last_tick = time.monotonic()
        self._watcher: asyncio.Task[None] | None = None

    @property
    def cluster_token(self) -> str | None:
        """The cluster's Ray token as its file holds it now (`rotate-token` replaces it)."""
        return self._token_file.read()

    @property
    def secrets(self) -> list[str]:
        return [s for s in (self.cluster_token, *(f.read() for f in self._secret_files)) if s]

    # --- who is asking -------------------------------------------------------------------------

    def presented(self, request: Any) -> str | None:
        """Ray's header forms, else a browser's session cookie ("": one that has ended)."""
        return gsn.presented(request, self.sessions, self.members)

    def identify(self, token: str) -> gs.Member | None:
        """Only from the members file: a member's token, or the owner's own gateway token. The
        cluster's Ray token is nobody here (every node, so every job, holds it)."""
        return self.members.lookup(token)

    async def handle(self, request: Any) -> Any:
        source = request.remote or "?"
        seen = {"source": source, "method": request.method}
        try:
            target = gt.read(request.raw_path)
        except gt.BadTarget as exc:
            self.audit.write(**seen, path=request.raw_path[:300], status=400)
            return reply(400, f"{exc} (rayfleet's gateway)")
        seen["path"] = target.path
        refused = gsn.foreign_origin(request)  # a browser's write from another page
        if refused:
            self.audit.write(**seen, status=403)
            return reply(403, refused)
        if target.path == gb.LOGIN_PATH and request.method == "POST":
            return await self.login(request, seen)
        if target.path == gb.LOGOUT_PATH and request.method == "POST":
            return gsn.logout(self, request, seen)
        token = self.presented(request)
        who = None if token is None else self.identify(token)
        if who is None and target.path in gb.ENTRY_PAGES and gb.wants_page(request):
            # A browser without a valid token: our login page, not Ray's token dialog.
            self.audit.write(**seen, status=200, page="login")
            return gb.login_page(self.config.cluster, gsn.login_note(token))
        # Only requests without a valid token are turned away: behind a campus NAT one address is
        # the whole class, and one stale script must not lock every member out. An ended
        # session's cookie ("") guesses nothing: neither counted nor turned away.
        wait = 0.0 if who is not None or not token else self.failures.blocked(source)
        if wait:
            await gsn.pause()
            self.audit.write(**seen, status=429)
            return reply(429, f"too many failed logins from {source}; try again in {wait:.0f} s")
        if who is None:
            return self.stranger(token, source, seen)
        seen.update(who=who.name, member_id=who.id, role=who.role)
        refused = self.doorman.sign_in(request, who)  # one connection more than their cap
        if refused is not None:
            self.audit.write(**seen, status=429)
            return refused
        if gs.expired(who):
            self.audit.write(**seen, status=403)
            return reply(403, f"member {who.name}'s access expired on "
                              f"{gr.shown(who.expires)}; ask the cluster's owner to add you again")
        if who.role != "owner":
            wait = self.rate.take(who.id)
            if wait:
                self.audit.write(**seen, status=429)
                return reply(429, f"member {who.name} sent more than {self.rate.RATE:g} "
                                   f"requests a second; try again in {wait:.1f} s")
            self.usage.seen(who.name)
        answer, job = await self.route(request, who, target)
        self.audit.write(**seen, job=job, status=getattr(answer, "status", None))
        return answer

    def stranger(self, token: str | None, source: str, seen: dict[str, Any]) -> Any:
        """The answer to a request whose token names nobody: none at all, a removed member's
        (named, no failed guess), or an unknown one (a failed guess from `source`)."""
        if token is None:
            self.audit.write(**seen, status=401)
            return reply(401, "no token: present your member token (RAY_AUTH_MODE=token and "
                              "RAY_AUTH_TOKEN_PATH, see docs/concepts/sharing.md)")
        gone = self.members.gone().by_digest(gs.token_hash(token)) if token else None
        if gone is not None:
            self.audit.write(**seen, who=gone.name, member_id=gone.id, status=403)
            return reply(403, gr.refusal(gone))
        if token:
            self.failures.failed(source)
        self.audit.write(**seen, status=403)
        return reply(403, "unknown or revoked token; ask the cluster's owner for a bundle")

    # --- what they may do ----------------------------------------------------------------------

    async def route(self, request: Any, who: gs.Member,
                    target: gt.Target) -> tuple[Any, str | None]:
        if target.path == uv.ROUTE:  # a member's own usage and budget (gateway_usage_view.py)
            return uv.answer(self, request, who), None
        if self.config.isolation == "cluster":  # each member's own cluster (gateway_isolated.py)
            routed = await gi.route(self, request, who, target)
            if routed is not None:
                return routed
        path, method = target.path, request.method
        if path == "/api/authenticate" and method == "POST":
            return self.authenticate(request), None
        match = _JOB.fullmatch(path)
        if match and gt.job_id_or_none(match.group(1)) is None:
            return reply(400, "a job's submission id is 1 to 64 letters, digits, '_' or '-'"), None
        if who.role == "owner":
            if match and match.group(2) == "/stop" and method == "POST":
                return await self.stop_action(who, match.group(1)), match.group(1)
            return await self.forward(request, who, target), None
        if method == "GET" and path in OPEN_VIEWS:
            return await self.forward(request, who, target), None
        package = gk.PACKAGE_PATH.fullmatch(path)
        if package and method in ("GET", "PUT", "HEAD"):
            return await self.caps.run(gl.UPLOADS if method == "PUT" else None, who, lambda: gk.handle(
                self, request, who, package.group(1), package.group(2))), None
        if path in ("/api/jobs", "/api/jobs/"):
            if method == "POST":
                return await self.submit(request, who)
            if method == "GET":
                return await self.list_jobs(request, who), None
        if match:
            return await self.job_action(request, who, match.group(1), match.group(2) or ""), \
                match.group(1)
        if method in ("GET", "HEAD") and self.config.members_see_dashboard:
            answer = await self.dashboard_view(request, who, target)
            if answer is not None:
                return answer, None
        if (method == "GET" and self.config.members_see_dashboard
                and (path in DASHBOARD_VIEWS or path.startswith("/static/"))):
            answer = await self.forward(request, who, target)
            if path in gb.ENTRY_PAGES and answer.status == 200:
                answer.body = gb.with_banner(answer.body, who.name, who.sees_all,
                                             uv.banner_line(self, who))
            return answer, None
        return gb.closed_view(method, path), None

    async def login(self, request: Any, seen: dict[str, Any]) -> Any:
        """The login form: a valid token signs in whatever failed before it (gateway_sessions)."""
        return await gsn.login(self, request, seen)

    def authenticate(self, request: Any) -> Any:
        """The dashboard's login: a session cookie, never the token (gateway_sessions)."""
        return gsn.authenticate(self, request)

    # --- talking to Ray ------------------------------------------------------------------------

    def upstream_headers(self, request_headers: Any = None) -> dict[str, str]:
        headers = {k: v for k, v in (request_headers or {}).items() if k.lower() not in _HOP}
        if self.cluster_token:
            headers["Authorization"] = f"Bearer {self.cluster_token}"
        return headers

    def upstream_url(self, target: gt.Target) -> Any:
        """Ray's URL for an authorized target, sent as it is (yarl must not parse it again)."""
        from yarl import URL

        return URL(self.config.upstream + target.upstream(), encoded=True)

    async def upstream_json(self, method: str, path: str) -> tuple[int, Any]:
        status, raw = await self.upstream_raw(method, path)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None

    async def upstream_raw(self, method: str, path: str, query: str = "") -> tuple[int, bytes]:
        """`path` is one the gateway built itself (ids checked and quoted), with its query after
        a `?` or in `query`."""
        path, _, inline = path.partition("?")
        query = query or inline
        session, timeout = gl.pick(self)  # in the tick: the gateway's own session
        async with session.request(method, self.upstream_url(gt.Target(path, query)),
                                   headers=self.upstream_headers(), timeout=timeout) as answer:
            return answer.status, await answer.read()

    async def upstream_post_json(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """POST `body` as JSON to `path`, one the gateway built itself (the reaper's submit)."""
        session, timeout = gl.pick(self)
        async with session.post(self.upstream_url(gt.Target(path)), json=body,
                                headers=self.upstream_headers(), timeout=timeout) as answer:
            return answer.status, await answer.read()

    async def ray_jobs(self) -> tuple[int, list[dict[str, Any]]]:
        """Ray's whole job list, fresh from Ray at every call; parsed only when its answer differs
        from the last one. The list is shared: callers never change it or its jobs."""
        status, raw = await self.upstream_raw("GET", "/api/jobs/")
        if status != 200:
            return status, []
        if raw != self._jobs_raw:
            try:
                jobs = json.loads(raw)
            except ValueError:
                return 502, []
            if not isinstance(jobs, list):
                return 502, []
            self._jobs_raw, self._jobs = raw, jobs
        return status, self._jobs

    async def forward(self, request: Any, who: gs.Member, target: gt.Target,
                      body: bytes | None = None) -> Any:
        """`request` sent to Ray at exactly `target` (what the rules authorized)."""
        from aiohttp import ClientTimeout, web

        data = body if body is not None else await request.read()
        async with self.session.request(request.method, self.upstream_url(target),
                                        data=data or None,
                                        headers=self.upstream_headers(request.headers),
                                        timeout=ClientTimeout(total=UPSTREAM_TIMEOUT_S)) as answer:
            content = await answer.read()
            headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        if who.role != "owner":
            content = self.scrub_bytes(content)
        return web.Response(status=answer.status, body=content, headers=headers)

    async def tail(self, request: Any, who: gs.Member, job_id: str) -> Any:
        """Ray's log stream (a WebSocket), relayed within `who`'s cap and time (gateway_limits);
        closed when `who` is removed (`close_removed`)."""
        return await gl.relay_tail(self, request, who, self.upstream_url(
            gt.Target(gt.job_path(job_id, "/logs/tail"))))

    async def close_removed(self) -> None:
        """Close the log streams of members no longer in the members file (or expired)."""
        current = self.members.ids()
        for member_id in list(self.tails):
            if member_id not in current:
                for client in list(self.tails.pop(member_id)):
                    await client.close()

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "<secret>")
        return text

    def scrub_bytes(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret.encode(), b"<secret>")
        return data

    # --- started and stopped with the server (its tick: gateway_tick.py) ----------------------

    async def start(self) -> None:
        self.session, self.own_session = gl.sessions()
        self._watcher = asyncio.create_task(self.watch())
        if self.config.isolation == "cluster":  # a previous gateway's member clusters stop now,
            gi.member_clusters(self)  # and their usage records close, not at a member's request

    async def shutdown(self) -> None:
        """Stopped (teardown, the supervisor): a last tick while Ray still answers, so that a job
        that ended since the previous one keeps its hours in the usage that outlives the head."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        gl.OWN.set(True)  # the last tick is the gateway's own too
        await gi.shutdown(self)  # member clusters' processes go with the gateway, files stay
        with contextlib.suppress(Exception):
            # Within the supervisor's grace before SIGKILL (supervise.stop: 5 s).
            await asyncio.wait_for(self.account(enforce=False), timeout=3)
        self.usage.save()
        await self.session.close()
        await self.own_session.close()


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def make_app(gateway: Gateway) -> Any:
    """The gateway's aiohttp application: every method and path reach `Gateway.handle`."""
    from aiohttp import web

    async def lifetime(app: web.Application) -> Any:
        await gateway.start()
        yield
        await gateway.shutdown()

    # Packages stream through (gateway_packages.py); anything read whole is a job's JSON.
    app = web.Application(client_max_size=gl.MAX_BODY_BYTES,
                          middlewares=[gl.middleware(gateway.doorman)])
    app.cleanup_ctx.append(lifetime)
    app.router.add_route("*", "/{tail:.*}", gateway.handle)
    return app


def serve(config: Config) -> None:
    """Until SIGTERM (its supervisor's stop), with the limits of gateway_limits."""
    gateway = Gateway(config)
    asyncio.run(gl.serve_until_stopped(make_app(gateway), gateway.doorman, config.host,
                                       config.port, tls_context(config.cert, config.key)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a cluster's sharing gateway.")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    config = read_config(Path(args.config))
    # Its supervisor (infra/node/supervise.py) owns `<config>.pid`: it identifies this process.
    print(f"gateway for {config.cluster} on https://{config.host}:{config.port}", flush=True)
    serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
