"""How long a Lambda API request takes from its last byte written (where the client's pacer
counts it, `Pacer.written`) to the moment the fake's rate limits count it, and from the moment
it took its turn (where the pacer counted before issue 38) to the same moment: the skew that
`Limits.transit` must cover.

The client and the fake run in this one process, as in the tests/lambda_cloud tests whose flake
was proven (a request 80 ms from its turn to the fake at load 9): several threads share one
client, as Ray's launcher threads and its autoscaler loop share the head's. `--burn N` adds N
busy processes for the run (ended by their pid), to measure at the load the flake needs;
`uptime`'s load is printed with every figure.

Usage: python bench/lambda_transit.py [--requests 400] [--threads 4] [--burn 0] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.node.lambda_cloud import api  # noqa: E402
from tests.fakes.http import ARRIVED  # noqa: E402
from tests.lambda_cloud.fake_api import FakeLambda  # noqa: E402

KEY = "secret_bench_transit_key"
SEQ = "X-Rayfleet-Bench-Seq"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def burn(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def measure(requests: int, threads: int) -> tuple[list[float], list[float], list[float], int]:
    """(written -> counted, turn -> counted, written -> answered) in seconds per request, and the
    429s seen."""
    # The fake without limits (the client's pacing is not what is measured here), at 1/100.
    fake = FakeLambda(KEY, scale=0.01, capacity={("gpu_1x_a10", "us-east-1"): 10 ** 6},
                      quota=10 ** 6).start()
    fake.general.interval = fake.launches.interval = 0.0
    counted: dict[str, float] = {}
    authenticate = fake.authenticate

    def count(request: Any) -> Any:
        # The moment the fake's limits judge the request by (it reached the socket).
        counted[request.headers.get(SEQ, "")] = request.environ.get(ARRIVED) or time.monotonic()
        return authenticate(request)

    fake.authenticate = count  # type: ignore[method-assign]
    client = api.LambdaClient(KEY, fake.url, api.Limits.scaled(0.01), timeout=(5.0, 30.0))
    client.add_ssh_key("k", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeFakeFake t")
    numbers = itertools.count()
    local = threading.local()
    written: dict[str, float] = {}
    turns: dict[str, float] = {}
    answered: dict[str, float] = {}
    pacer_wait, pacer_written = client._pacer.wait, client._pacer.written

    def on_wait(launch: bool, prompt: bool = False) -> None:
        pacer_wait(launch, prompt)
        local.turn = time.monotonic()

    def on_written() -> None:
        written[local.seq] = time.monotonic()
        turns[local.seq] = local.turn
        pacer_written()

    client._pacer.wait = on_wait  # type: ignore[method-assign]
    client._pacer.written = on_written  # type: ignore[method-assign]
    for session in (client._session, client._launch_session):
        send = session.request

        def numbered(*args: Any, _send: Any = send, **kwargs: Any) -> Any:
            local.seq = seq = str(next(numbers))
            try:
                return _send(*args, headers={SEQ: seq}, **kwargs)
            finally:
                answered[seq] = time.monotonic()

        session.request = numbered  # type: ignore[method-assign]

    def work(n: int) -> None:
        for i in range(requests // threads):
            if i % 4 == 3:
                client.launch(region="us-east-1", instance_type="gpu_1x_a10", ssh_key_name="k",
                              name=f"t{n}-{i}")
            else:
                client.instances()

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    fake.stop()
    refused = len([s for _, s in fake.requests() if s == 429])
    seqs = [s for s in written if s in counted]
    return ([counted[s] - written[s] for s in seqs], [counted[s] - turns[s] for s in seqs],
            [answered[s] - written[s] for s in seqs if s in answered], refused)


def describe(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"{name}: median {1000 * statistics.median(ordered):.1f} ms, p99 {1000 * p99:.1f} ms, "
            f"max {1000 * ordered[-1]:.1f} ms, min {1000 * ordered[0]:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--burn", type=int, default=0, help="busy processes beside the run")
    parser.add_argument("--quick", action="store_true", help="40 requests (CI keeps it running)")
    args = parser.parse_args()
    if args.quick:
        args.requests = 40
    burners = burn(args.burn)
    try:
        if burners:
            time.sleep(15)  # the load average follows the burners with a delay
        print(f"load before: {load()}")
        after_write, after_turn, answers, refused = measure(args.requests, args.threads)
        print(f"load after: {load()}; {len(after_write)} requests, {args.threads} threads, "
              f"{args.burn} busy processes; 429s from the fake: {refused}")
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    print(describe("written -> counted by the fake", after_write))
    print(describe("turn taken -> counted by the fake", after_turn))
    print(describe("written -> answered", answers))
    transit = api.Limits().transit
    late = [x for x in after_write if x > transit]
    print(f"over Limits.transit ({transit * 1000:.0f} ms): {len(late)} of {len(after_write)}")
    return 0 if not late else 1


if __name__ == "__main__":
    raise SystemExit(main())
