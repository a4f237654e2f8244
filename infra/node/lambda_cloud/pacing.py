"""How the Lambda client keeps to Lambda's rate limits: the limits, the pacer every request waits
for, urllib3's retry paced by it, and the transport hook that tells the pacer when a request has
left.

Lambda judges the moment a request *reaches* it; we can only choose the moment it leaves. The
next request is therefore spaced from the latest moment the previous one can have reached Lambda:
its answer (it has surely arrived by then), or, earlier, the moment its last byte was written to
the socket plus `Limits.transit`, the longest a written request takes to be counted. The written
moment is taken in the connection itself (`PacedAdapter`), after the TCP and TLS handshakes: a
new connection's setup is never counted as transit. Counting from the answer alone was safe but
paid each answer's time again on every interval (a launch answer takes seconds at Lambda).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from urllib3 import connection, connectionpool, poolmanager
from urllib3.util.retry import Retry

from infra.node.errors import UsageError
from infra.node.lambda_cloud.pace_state import Memory, Shared, Store, alive

#: Answers worth the same request again: rate limit, Lambda's 409 on rulesets ("conflict", sent
#: with the internal-error body), and server or gateway failures.
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Limits:
    """Lambda's documented rate limits, optionally scaled (tests, the fake)."""

    #: Seconds between any two requests ("generally one request per second").
    request_interval: float = 1.0
    #: Seconds between two launches ("one request per 12 seconds").
    launch_interval: float = 12.0
    #: Longest single backoff sleep after a 429/5xx.
    backoff_cap: float = 30.0
    #: Safety margin over the intervals: the server's clock is not ours. What it must cover is
    #: the two clocks' rates (NTP keeps them within 500 ppm) and the server's rounding: the
    #: moments themselves are already the latest the request can have arrived (`transit`), so
    #: the margin is no cushion for the network or a loaded client. 0.5 % is 60 ms of a launch
    #: interval, ten times the clocks' worst; 2 % cost 0.24 s on every launch, 1.7 s of an
    #: 8-worker scale-up (docs/benchmarks.md, issue 38).
    margin: float = 0.005
    #: How long a launch whose answer was lost may take to show up in the instance list before
    #: we believe it never happened (generous: Lambda documents nothing about it).
    lost_launch_window: float = 120.0
    #: The longest a request takes from its last byte written here to the moment the server
    #: counts it: the network's one-way time and the server's front. Never scaled: it is the
    #: network's, not Lambda's. Measured to the fake's socket (bench/lambda_transit.py,
    #: docs/benchmarks.md): nothing, even at load 9-10 (loopback delivers within the write); the
    #: 80 ms of the proven flake, and up to 2.5 s at load 10, were spent before the write or in
    #: the fake's own starved threads. 0.25 s is room for a real network's one-way time (tens of
    #: ms within a region); a request later than that can meet a 429, which is waited out and
    #: sent again (a launch too: a 429 created nothing).
    transit: float = 0.25

    #: The part of the request budget this process's routine requests (listings, polls) keep to:
    #: the head's node provider and the user's machine share one account's budget. A launch and
    #: the capacity read right before it are not routine: they go at Lambda's own limit, since
    #: nothing else forces them apart, and each second there delays a worker (issue 38).
    share: float = 1.0

    @classmethod
    def scaled(cls, scale: float, share: float = 1.0) -> Limits:
        """Lambda's limits times `scale`, this process keeping to `share` of the request budget
        for its routine requests."""
        return cls(1.0 * scale, 12.0 * scale, 30.0 * scale, lost_launch_window=120.0 * scale,
                   share=share)

    @property
    def routine_interval(self) -> float:
        """Seconds between this process's routine requests (listings, polls): Lambda's request
        interval over this process's share of it."""
        return self.request_interval / self.share

    @property
    def scale(self) -> float:
        return self.launch_interval / 12.0

    @classmethod
    def from_env(cls, share: float = 1.0) -> Limits:
        raw = os.environ.get("LAMBDA_RATE_SCALE", "1")
        try:
            scale = float(raw)
        except ValueError:
            raise UsageError(f"LAMBDA_RATE_SCALE={raw!r}: expected a number such as 1 or 0.01") from None
        if not 0 < scale <= 100:
            raise UsageError(f"LAMBDA_RATE_SCALE={raw!r}: must be > 0 and <= 100")
        return cls.scaled(scale, share)


class Pacer:
    """The turn to send, shared by threads and, through `store` (pace_state.py), by every process
    of this machine that uses the same key (issue 48): a request holds it from `wait` until it has
    surely reached the server (`done` on its answer, or `Limits.transit` after `written`), and the
    next one is sent one interval (a launch: one launch interval) after that moment.

    Spacing the moments requests leave is not enough: the server judges the moments they arrive,
    and on a loaded machine a request took 80 ms from its slot to the fake, so another thread's
    request sent 102 ms later arrived 14 ms behind it (a 429). That time was spent before the
    request was written (scheduling, building it, the connection) and in the fake's own threads;
    what remains after the last byte is the network's, bounded by `transit`. A launch waiting out
    its longer interval holds nobody back, and nobody holds it back: a plain request that would
    push it past its due time waits behind it, whichever process sends it.

    Threads of this pacer wake each other; another process's moves are seen by looking again
    every `POLL` seconds while it holds the turn (its request's arrival is then known to within
    that). A turn whose process is gone, or held longer than `HOLD`, is taken back."""

    #: How often a request looks again while another process's request holds the turn.
    POLL = 0.02
    #: The longest a request may hold the turn (a stopped process's): beyond any request's
    #: connect and read timeouts.
    HOLD = 120.0

    def __init__(self, limits: Limits, store: Store | None = None) -> None:
        self.limits = limits
        self.store: Store = store or Memory()
        self.lock = threading.Condition()
        #: When this process's next routine request may go (its share of the budget); the shared
        #: state's `next_prompt` spaces the account's requests.
        self.next_any = 0.0
        #: This pacer's launches waiting for their turn.
        self.launches_waiting = 0

    def _me(self) -> str:
        """The current thread's name in the shared state: process, thread, this pacer."""
        return f"{os.getpid()}:{threading.get_ident()}:{id(self):x}"

    def _mine(self, owner: str | None) -> bool:
        """Whether `owner` is a thread of this pacer (whose `written`/`done` wake the others)."""
        return owner is not None and owner.startswith(f"{os.getpid()}:") \
            and owner.endswith(f":{id(self):x}")

    def _arrived(self, shared: Shared, at: float) -> None:
        """The owner's request has reached the server by `at`: the next ones count from there."""
        factor = 1 + self.limits.margin
        if self._mine(shared.owner):
            self.next_any = max(self.next_any, at + self.limits.routine_interval * factor)
        shared.next_prompt = max(shared.next_prompt, at + self.limits.request_interval * factor)
        if shared.owner_launch:
            shared.next_launch = max(shared.next_launch, at + self.limits.launch_interval * factor)
        shared.owner, shared.written_at = None, None
        self.lock.notify_all()

    def _take_back(self, shared: Shared, now: float) -> None:
        """Free the turn another request holds once it has surely arrived: `transit` after it
        was written, or (its process gone) `transit` after the last moment it can have been
        written, or after `HOLD`. Forget the waiting launches of processes that are gone."""
        owner, written, transit = shared.owner, shared.written_at, self.limits.transit
        if owner is not None and owner != self._me():
            gone = not alive(int(owner.split(":", 1)[0]))
            if written is not None and (gone or now >= written + transit):
                self._arrived(shared, written + transit)
            elif gone:
                self._arrived(shared, now + transit)
            elif now - shared.taken_at > self.HOLD:
                self._arrived(shared, now)
        mine = f"{os.getpid()}:{id(self):x}"
        for key in [k for k in shared.launchers if k != mine]:
            if not alive(int(key.split(":", 1)[0])):
                del shared.launchers[key]
        if self.launches_waiting:
            shared.launchers[mine] = self.launches_waiting
        else:
            shared.launchers.pop(mine, None)

    def _delays_a_launch(self, shared: Shared, now: float, start: float) -> bool:
        """A plain request sent now (at the earliest at `start`) would push the next launch a
        thread waits for past its due time: launches go at Lambda's limit, listings fit in
        between."""
        if not any(shared.launchers.values()):
            return False
        due = max(shared.next_launch, shared.next_prompt)
        arrived_by = max(now, start) + self.limits.transit
        return arrived_by + self.limits.request_interval * (1 + self.limits.margin) > due

    def _wait_for(self, shared: Shared, now: float, launch: bool,
                  prompt: bool) -> tuple[bool, float | None]:
        """(whether this thread may send now; else how long to wait, None: until woken)."""
        start = max(shared.next_prompt, shared.next_launch) if launch \
            else shared.next_prompt if prompt else max(self.next_any, shared.next_prompt)
        if shared.owner not in (None, self._me()):
            # `written` or `done` wakes us (another process's: looked at again), else the
            # owner's transit bound does.
            bound = None if shared.written_at is None \
                else shared.written_at + self.limits.transit - now
            if self._mine(shared.owner):
                return False, bound
            return False, self.POLL if bound is None else min(bound, self.POLL)
        if now < start:
            return False, start - now
        if not launch and self._delays_a_launch(shared, now, start):
            # Until the launch has taken its turn (then `written` wakes us, or we look again).
            return False, max(max(shared.next_launch, shared.next_prompt) - now, 0.005)
        return True, 0.0

    def wait(self, launch: bool, prompt: bool = False) -> None:
        """Until this thread may send; its request then holds the turn until it has arrived.
        `prompt`: a request on a launch's way (the capacity read before it), spaced by Lambda's
        own limit rather than this process's share; a launch always is."""
        with self.lock:
            self.launches_waiting += launch
            taken = False
            try:
                while True:
                    with self.store.open() as shared:
                        now = time.monotonic()
                        self._take_back(shared, now)
                        go, timeout = self._wait_for(shared, now, launch, prompt)
                        if go:
                            self.launches_waiting -= launch
                            taken = True
                            self._take_back(shared, now)  # our launch no longer waits
                            shared.owner, shared.owner_launch = self._me(), launch
                            shared.taken_at, shared.written_at = now, None
                            return
                    self.lock.wait(timeout)  # may wake early: looped
            finally:
                if not taken:
                    self.launches_waiting -= launch
                    if launch:
                        with contextlib.suppress(OSError), self.store.open() as shared:
                            self._take_back(shared, time.monotonic())

    def written(self) -> None:
        """This thread's request has been written whole: it reaches the server within `transit`."""
        with self.lock, self.store.open() as shared:
            if shared.owner == self._me() and shared.written_at is None:
                shared.written_at = time.monotonic()
                self.lock.notify_all()

    def done(self) -> None:
        """This thread's request was answered (or failed): it has arrived, if at all, by now or by
        `transit` after it was written, whichever was first. A second `done` (an interrupted retry
        backoff), or one after another thread took the turn, changes nothing."""
        with self.lock, self.store.open() as shared:
            if shared.owner != self._me():
                return
            now = time.monotonic()
            written = shared.written_at
            self._arrived(shared, now if written is None else min(now, written + self.limits.transit))

    def push_back(self, seconds: float) -> None:
        """After a 429, keep every thread of every process on this account quiet for a while, not
        just the one that was told."""
        with self.lock, self.store.open() as shared:
            until = time.monotonic() + seconds
            self.next_any = max(self.next_any, until)
            shared.next_prompt = max(shared.next_prompt, until)

    def defer_launches(self, seconds: float) -> None:
        """No launch on this account before `seconds` from now (another process just launched)."""
        with self.lock, self.store.open() as shared:
            shared.next_launch = max(shared.next_launch, time.monotonic() + seconds)

    def launch_wait(self) -> float:
        """Seconds from now until a launch may go by the launch interval (0: now)."""
        with self.lock, self.store.open() as shared:
            return max(0.0, shared.next_launch - time.monotonic())

    def routine_wait(self) -> float:
        """Seconds from now until a routine request could go (inf while another request holds
        the turn: a launch's answer takes seconds), for a caller that would rather not wait."""
        with self.lock, self.store.open() as shared:
            now = time.monotonic()
            self._take_back(shared, now)
            if shared.owner is not None:
                return float("inf")
            return max(0.0, self.next_any - now, shared.next_prompt - now)


class PacedRetry(Retry):
    """urllib3's Retry, paced like every other request: it waits Retry-After when the answer has
    one (capped), else its exponential backoff but never less than one request interval; a 429
    also quiets every other thread (`Pacer.push_back`). The failed attempt gives up its turn
    while it backs off; the retry then waits for a turn like any request."""

    pacer: Pacer | None = None
    #: Retries of a launch take a launch slot.
    launch: bool = False

    def new(self, **kw: Any) -> PacedRetry:
        retry = super().new(**kw)
        retry.pacer, retry.launch = self.pacer, self.launch
        return retry

    def get_backoff_time(self) -> float:
        limits = self.pacer.limits if self.pacer else Limits()
        floor = limits.request_interval * (1 + limits.margin)
        return max(floor, super().get_backoff_time())

    def sleep(self, response: Any = None) -> None:
        delay = self.get_backoff_time()
        header = response.headers.get("Retry-After") if response is not None else None
        if header and self.pacer is not None:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(header), self.pacer.limits.backoff_cap * 2))
        if self.pacer is not None:
            self.pacer.done()
            if response is not None and response.status == 429:
                self.pacer.push_back(delay)
            time.sleep(delay)
            self.pacer.wait(self.launch)
        else:
            time.sleep(delay)


#: What the current thread's request in flight calls once it is written whole (`sending`).
_on_written = threading.local()


@contextlib.contextmanager
def sending(hook: Callable[[], None]) -> Iterator[None]:
    """While this block sends a request (retries included), `hook` runs each time one attempt
    has been written whole."""
    _on_written.hook = hook
    try:
        yield
    finally:
        _on_written.hook = None


class _Stamped:
    """A connection that reports when a request has been written whole: urllib3 (1.26 and 2.x)
    calls `getresponse` right after the request's headers and body went out, and only then."""

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        hook = getattr(_on_written, "hook", None)
        if hook is not None:
            hook()
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _StampedHTTPConnection(_Stamped, connection.HTTPConnection):
    pass


class _StampedHTTPSConnection(_Stamped, connection.HTTPSConnection):
    pass


class _StampedHTTPPool(connectionpool.HTTPConnectionPool):
    ConnectionCls = _StampedHTTPConnection


class _StampedHTTPSPool(connectionpool.HTTPSConnectionPool):
    ConnectionCls = _StampedHTTPSConnection


_STAMPED = {"http": _StampedHTTPPool, "https": _StampedHTTPSPool}


def _stamp(manager: Any) -> Any:
    # Only urllib3's own pools are swapped (a SOCKS proxy's manager has its own): a request sent
    # through anything else is never stamped and keeps its turn until its answer, the safe side.
    if getattr(manager, "pool_classes_by_scheme", None) is poolmanager.pool_classes_by_scheme:
        manager.pool_classes_by_scheme = _STAMPED
    return manager


def paced_adapter(retry: PacedRetry) -> Any:
    """requests' HTTPAdapter with `retry`, on connections that stamp the written moment."""
    from requests.adapters import HTTPAdapter

    class PacedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            _stamp(self.poolmanager)

        def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
            return _stamp(super().proxy_manager_for(*args, **kwargs))

    return PacedAdapter(max_retries=retry)
