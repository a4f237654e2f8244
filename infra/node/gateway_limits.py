"""What keeps one member from taking the gateway (gateway.py) from everyone else.

- Caps per member (spec `sharing.max_member_connections`, `max_member_uploads`,
  `max_member_tails`): the connections a member holds open (each carries one request at a time;
  a log tail holds one for as long as it runs), the working-dir uploads they stream at once, and
  their open log tails. Past a cap: 429, one line naming the key. The owner's gateway token
  counts like a member's.
- Connections that have not signed in (the TLS handshake done, no request with a valid token
  yet): at most MAX_UNSIGNED, the oldest closed first past it; each lives at most
  UNSIGNED_LIFETIME_S, and whatever such a connection is answered, it is closed after it. The
  TLS handshake itself must end within HANDSHAKE_TIMEOUT_S, and a request's headers must be
  complete within HEADER_TIMEOUT_S of the connection's start or its previous answer (aiohttp's
  keep-alive timer, which also closes idle connections).
- Two upstream sessions: the members' (a bounded pool, MEMBER_POOL) and the gateway's own
  (its tick, the reaper's submit, the hourly price: OWN_POOL, each call OWN_TIMEOUT_S at most),
  so the gateway's enforcement never waits behind members' streams. Calls made in a task that
  set OWN (the tick) take the gateway's own.
- Streams end: an upload body that sends nothing for UPLOAD_IDLE_S is cut (408); a log tail
  ends after TAIL_MAX_S, and a client that stops answering pings is dropped (TAIL_HEARTBEAT_S).
- Ray away: a member's request that cannot reach Ray is answered 502 in one line.

Ray and what Ray brings (aiohttp) only: it ships to heads in the node package.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

CONNECTIONS, UPLOADS, TAILS = "connections", "uploads", "tails"
#: The spec key (`sharing.<key>`) of each cap, and what it counts, for the 429's one line.
KEYS = {CONNECTIONS: ("max_member_connections", "connections open"),
        UPLOADS: ("max_member_uploads", "uploads streaming"),
        TAILS: ("max_member_tails", "log tails open")}
#: The spec's defaults (infra/core/spec.py `Sharing`), for a config written before the caps.
DEFAULTS = {CONNECTIONS: 16, UPLOADS: 2, TAILS: 4}

#: A client's TLS handshake (asyncio's default is 60 s: a slow opener held a socket that long).
HANDSHAKE_TIMEOUT_S = 10.0
#: A request's headers complete within this of the connection's start or its previous answer;
#: also how long an idle keep-alive connection stays (aiohttp's default is 75 s).
HEADER_TIMEOUT_S = 15.0
#: Connections past their handshake that have not signed in: past this many, the oldest goes.
#: Far above a class opening its dashboards at once; far below the process's file limit.
MAX_UNSIGNED = 256
#: The longest such a connection lives (a login form's body trickled byte by byte included).
UNSIGNED_LIFETIME_S = 30.0
#: Answers still in flight when the gateway stops (within the supervisor's 5 s before SIGKILL,
#: beside the last tick's 3 s).
SHUTDOWN_TIMEOUT_S = 1.0
#: How long the unread body of a refused request (an upload past a cap) is read and dropped
#: before its connection closes, so that its sender still reads the answer (aiohttp's is 10 s).
LINGER_S = 2.0
#: What a request body read whole may be: a job's JSON (packages stream, gateway_packages.py).
MAX_BODY_BYTES = 1024 * 1024
#: Members' connections to Ray at once, all members together: 16 per member is the cap on any
#: one of them, so that six members at their caps still leave room for the rest.
MEMBER_POOL = 100
#: No call to Ray that the gateway relays for a member takes longer (streams excepted: they
#: have their own limits below).
UPSTREAM_TIMEOUT_S = 120.0
#: The gateway's own connections to Ray (its tick's calls are sequential; a few at shutdown).
OWN_POOL = 8
#: Each of the gateway's own calls (the job list of thousands of jobs included) at most.
OWN_TIMEOUT_S = 30.0
#: An upload body's longest silence: Ray's client sends a package in one go, so a minute without
#: a byte is a stalled or hostile sender, not a slow link.
UPLOAD_IDLE_S = 60.0
#: A log tail's longest life: a stream of a quiet job is silent for hours by right (so no idle
#: limit from Ray's side), but none is held past a long working day; following again goes on.
TAIL_MAX_S = 12 * 3600.0
#: Pings to a tail's client: one that stops answering is dropped within two of these.
TAIL_HEARTBEAT_S = 30.0

#: True in the gateway's own task (its tick): its calls to Ray take its own session.
OWN: contextvars.ContextVar[bool] = contextvars.ContextVar("rayfleet_gateway_own", default=False)


def reply(status: int, text: str) -> Any:
    from aiohttp import web

    return web.Response(status=status, text=text + "\n")


class IdleBody(Exception):
    """An upload body sent nothing for UPLOAD_IDLE_S."""


async def idle_chunks(stream: Any, size: int = 1 << 16) -> AsyncIterator[bytes]:
    """A request body's chunks as they come; IdleBody once none came for UPLOAD_IDLE_S."""
    while True:
        try:
            chunk = await asyncio.wait_for(stream.read(size), UPLOAD_IDLE_S)
        except asyncio.TimeoutError:
            raise IdleBody(UPLOAD_IDLE_S) from None
        if not chunk:
            return
        yield chunk


class Caps:
    """How many connections, uploads and tails each member holds, against the config's caps."""

    def __init__(self, config: Any) -> None:
        self.caps = {kind: int(getattr(config, KEYS[kind][0], DEFAULTS[kind])) for kind in KEYS}
        self.held: dict[tuple[str, str], int] = {}

    def take(self, kind: str, member_id: str) -> bool:
        held = self.held.get((kind, member_id), 0)
        if held >= self.caps[kind]:
            return False
        self.held[(kind, member_id)] = held + 1
        return True

    def give(self, kind: str, member_id: str) -> None:
        held = self.held.get((kind, member_id), 0) - 1
        if held > 0:
            self.held[(kind, member_id)] = held
        else:
            self.held.pop((kind, member_id), None)

    def refusal(self, kind: str, name: str) -> Any:
        key, what = KEYS[kind]
        answer = reply(429, f"member {name} has {self.caps[kind]} {what}, the cluster's cap "
                            f"(sharing.{key}); wait for one to end, then try again")
        answer.force_close()  # closed after it: no unread body (an upload's) lingers for 10 s
        return answer

    async def run(self, kind: str | None, who: Any, make: Callable[[], Awaitable[Any]]) -> Any:
        """`make()`'s answer while `who` holds one of `kind` (None: no cap); 429 past the cap."""
        if kind is None:
            return await make()
        if not self.take(kind, who.id):
            return self.refusal(kind, who.name)
        try:
            return await make()
        finally:
            self.give(kind, who.id)


class Doorman:
    """Every connection from its TLS handshake's end to its close: not signed in (capped, short
    lived, closed after each answer), or one member's (counted against their connection cap)."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        #: Connections not signed in, oldest first: their transport and their end of life.
        self.unsigned: dict[Any, tuple[Any, asyncio.TimerHandle]] = {}
        self.member_of: dict[Any, str] = {}

    def attach(self, server: Any) -> None:
        """Follow the connections of aiohttp's `server` (what an AppRunner serves with)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: Any) -> None:
            made(handler, transport)
            self.opened(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.closed(handler)
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    def opened(self, handler: Any, transport: Any) -> None:
        ends = asyncio.get_running_loop().call_later(UNSIGNED_LIFETIME_S, self._end, handler)
        self.unsigned[handler] = (transport, ends)
        while len(self.unsigned) > MAX_UNSIGNED:
            self._end(next(iter(self.unsigned)))

    def _end(self, handler: Any) -> None:
        found = self.unsigned.pop(handler, None)
        if found is not None:
            found[1].cancel()
            found[0].abort()

    def closed(self, handler: Any) -> None:
        found = self.unsigned.pop(handler, None)
        if found is not None:
            found[1].cancel()
        member = self.member_of.pop(handler, None)
        if member is not None:
            self.caps.give(CONNECTIONS, member)

    def sign_in(self, request: Any, who: Any) -> Any:
        """None when `request`'s connection is (now) signed in; the 429 when it would be one
        more of `who`'s than their cap. A connection counts for the first member it carried."""
        handler = request.protocol
        if handler in self.member_of or handler not in self.unsigned:
            return None  # signed in already, or not followed (a server without the doorman)
        if not self.caps.take(CONNECTIONS, who.id):
            return self.caps.refusal(CONNECTIONS, who.name)
        self.unsigned.pop(handler)[1].cancel()
        self.member_of[handler] = who.id
        return None

    def signed(self, request: Any) -> bool:
        return request.protocol not in self.unsigned


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(4):  # aiohttp wraps what a body's iterator raised once or twice
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def middleware(doorman: Doorman) -> Any:
    """Around every request: Ray unreachable → 502, a stalled upload → 408, each in one line;
    a connection that did not sign in is closed after its answer."""
    from aiohttp import ClientError, web

    @web.middleware
    async def guarded(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            answer = await handler(request)
        except Exception as exc:
            if _caused_by(exc, IdleBody):
                answer = reply(408, f"the upload sent nothing for {UPLOAD_IDLE_S:g} s and was "
                                    "cut (rayfleet's gateway); send it again")
                answer.force_close()
            elif _caused_by(exc, ClientError) or _caused_by(exc, OSError) \
                    or _caused_by(exc, asyncio.TimeoutError):
                answer = reply(502, f"the cluster's Ray did not answer ({type(exc).__name__}); "
                                    "try again in a minute")
            else:
                raise
        if not doorman.signed(request):
            answer.force_close()
        return answer

    return guarded


def sessions() -> tuple[Any, Any]:
    """The members' session to Ray and the gateway's own, each with its own pool."""
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    members = ClientSession(
        connector=TCPConnector(limit=MEMBER_POOL, limit_per_host=MEMBER_POOL),
        timeout=ClientTimeout(total=None, sock_connect=10, sock_read=UPSTREAM_TIMEOUT_S))
    own = ClientSession(connector=TCPConnector(limit=OWN_POOL, limit_per_host=OWN_POOL),
                        timeout=ClientTimeout(total=OWN_TIMEOUT_S, sock_connect=10))
    return members, own


def pick(gateway: Any) -> tuple[Any, Any]:
    """The session and timeout of a call to Ray made now: the gateway's own in its own task."""
    from aiohttp import ClientTimeout

    if OWN.get() and gateway.own_session is not None:
        return gateway.own_session, ClientTimeout(total=OWN_TIMEOUT_S, sock_connect=10)
    return gateway.session, ClientTimeout(total=UPSTREAM_TIMEOUT_S, sock_connect=10)


async def relay_tail(gateway: Any, request: Any, who: Any, url: Any) -> Any:
    """Ray's log stream at `url` (a WebSocket) relayed message by message to `who`, one of
    their `max_member_tails`; closed when `who` is removed (`Gateway.close_removed`), when the
    client goes (its close, or pings unanswered), when Ray ends it, or after TAIL_MAX_S."""
    from aiohttp import ClientError, ClientWSTimeout, web

    if not gateway.caps.take(TAILS, who.id):
        return gateway.caps.refusal(TAILS, who.name)
    try:
        client = web.WebSocketResponse(heartbeat=TAIL_HEARTBEAT_S)
        await client.prepare(request)
        open_tails = gateway.tails.setdefault(who.id, set())
        open_tails.add(client)
        try:
            async with gateway.session.ws_connect(
                    url, headers=gateway.upstream_headers(),
                    timeout=ClientWSTimeout(ws_receive=None, ws_close=10)) as ray:
                if not await _relay_until_one_ends(gateway, ray, client) and not client.closed:
                    await client.send_str(f"(rayfleet's gateway: this log stream ended after "
                                          f"{TAIL_MAX_S / 3600:g} h; follow the job again)\n")
        except (ClientError, OSError, asyncio.TimeoutError):
            pass  # Ray away: the stream ends (the client's next call says more)
        finally:
            open_tails.discard(client)
        await client.close()
        return client
    finally:
        gateway.caps.give(TAILS, who.id)


async def _relay_until_one_ends(gateway: Any, ray: Any, client: Any) -> bool:
    """Relay until Ray's stream or the client ends (True), or TAIL_MAX_S passed (False). The
    client is read too: that is where its close and its answers to pings arrive."""
    relay = asyncio.ensure_future(_relay(gateway, ray, client))
    drain = asyncio.ensure_future(_drain(client))
    done, pending = await asyncio.wait({relay, drain}, timeout=TAIL_MAX_S,
                                       return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()  # Ray's stream failing is the caller's to answer
    return bool(done)


async def _drain(client: Any) -> None:
    async for _ in client:  # a member sends nothing on a log stream; its close ends this
        pass


async def _relay(gateway: Any, ray: Any, client: Any) -> None:
    from aiohttp import WSMsgType

    async for message in ray:
        if client.closed:
            break
        if message.type == WSMsgType.TEXT:
            await client.send_str(gateway.scrub(message.data))
        elif message.type == WSMsgType.BINARY:
            await client.send_bytes(gateway.scrub_bytes(message.data))
        else:
            break


class Listening:
    """The gateway's app served on an address over TLS: its runner and the listening server."""

    def __init__(self, runner: Any, server: asyncio.Server) -> None:
        self.runner, self.server = runner, server
        self.port = int(server.sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def listen(app: Any, doorman: Doorman, host: str, port: int,
                 context: ssl.SSLContext) -> Listening:
    """`app` served as the gateway serves it: aiohttp's handshake-to-header limits set here
    (TCPSite cannot set the TLS handshake's timeout, so the server is made directly)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT_S,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S, lingering_time=LINGER_S,
                           max_line_size=8190, max_field_size=8190)
    await runner.setup()
    assert runner.server is not None
    doorman.attach(runner.server)
    server = await asyncio.get_running_loop().create_server(
        runner.server, host, port, ssl=context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
    return Listening(runner, server)


async def serve_until_stopped(app: Any, doorman: Doorman, host: str, port: int,
                              context: ssl.SSLContext) -> None:
    """Serve until SIGTERM or SIGINT (the supervisor's stop), then stop in order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listening = await listen(app, doorman, host, port, context)
    try:
        await stop.wait()
    finally:
        await listening.cleanup()
