"""Time of `up`'s provisioning for 1, 2 and 4 Lambda nodes against the fake API with the REAL rate
limits, next to the floor those limits impose.

Measured: from the start of `plan` (as `invoke up` runs it: capacity query, render, validate) to
the moment every instance is active and accepts an SSH login: everything Lambda's limits govern.
`ray up` comes after and does not depend on them (see the test-bed test for it).

Floor: Lambda allows one request per second and one launch per 12 s. Before its first launch `up`
needs five requests (capacity, register the SSH key, list instances to adopt orphans of an
interrupted run, look for and create the cluster's firewall ruleset), so the first launch cannot
start before 5 s; each further node waits 12 s; the last node then boots for the fake's boot
delay. floor(N) = 5 + 12 (N - 1) + boot.

Each instance is reached through a loopback sshd (ProxyCommand `nc 127.0.0.1 <port>`), whose key
entry only allows `/bin/true`. Usage: python bench/lambda_up.py [--boot 30] [--nodes 1 2 4] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.lambda_cloud.fake_api import FakeLambda  # noqa: E402
from tests.lambda_cloud.sshd import LocalSshd  # noqa: E402

KEY = "secret_bench_key"
REQUESTS_BEFORE_FIRST_LAUNCH = 5


def spec_text(proxy: str, workers: int) -> str:
    return (
        "provider: lambda\n"
        "head: {choices: [{instance_type: gpu_1x_a10, region: us-east-1}]}\n"
        f"workers: {{count: {workers}, choices: [{{instance_type: gpu_1x_a10, region: us-east-1}}]}}\n"
        f"ssh_user: root\nssh_proxy_command: {proxy!r}\nenv: none\nboot_timeout_s: 600\n"
    )


def one_run(nodes: int, boot: float, work: Path, sshd: LocalSshd) -> dict[str, float]:
    from infra import providers
    from infra.cli.loading import load_spec
    from infra.core import ssh, state

    name = f"bench{nodes}"
    fake = FakeLambda(KEY, scale=1.0, boot_delay=boot, terminate_delay=1.0,
                      capacity={("gpu_1x_a10", "us-east-1"): 16})
    with fake:
        os.environ.update(LAMBDA_API_URL=fake.url, LAMBDA_API_KEY=KEY, LAMBDA_RATE_SCALE="1")
        path = work / f"{name}.yaml"
        path.write_text(spec_text(sshd.proxy_command, nodes - 1))
        sshd.authorize(ssh.ensure_keypair(name).public_key)
        spec = load_spec(path)
        provider = providers.create(spec)
        time.sleep(1.1)  # the fake's bucket starts full: no credit from setup
        started = time.monotonic()
        with state.locked(name, "lambda", "up") as current:
            plan = provider.plan(current)
            provider.provision(current, capacity=plan.extra)  # type: ignore[attr-defined]
        took = time.monotonic() - started
        teardown_started = time.monotonic()
        from infra.cli import commands

        commands.teardown(None, str(path))
        teardown_took = time.monotonic() - teardown_started
        refused = sum(1 for *_, status in fake.log if status == 429)
        leftover = [i for i in fake.running(f"{name}-")]
        assert not leftover, leftover
        return {"up": took, "teardown": teardown_took, "requests": len(fake.log), "429": refused}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=float, default=30.0, help="fake boot delay, seconds")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    args = parser.parse_args()
    if args.quick:
        args.boot, args.nodes = 2.0, [1]
    with tempfile.TemporaryDirectory(prefix="lambda-bench-") as tmp:
        work = Path(tmp)
        os.environ["RAYFLEET_HOME"] = str(work / "home")
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        from infra.core import render

        # Warm Ray's config validation (a one-off import cost of ~2 s, not a rate-limit effect).
        render.validate_ray_cluster_config(
            "cluster_name: w\nprovider: {type: local, head_ip: h, worker_ips: []}\n"
            "auth: {ssh_user: u}\n", "warm-up")
        sshd = LocalSshd(work / "sshd")
        try:
            print(f"{'nodes':>5} {'up s':>8} {'floor s':>8} {'over':>7} {'teardown s':>11} "
                  f"{'requests':>9} {'429s':>5}")
            worst = 0.0
            for nodes in args.nodes:
                result = one_run(nodes, args.boot, work, sshd)
                floor = REQUESTS_BEFORE_FIRST_LAUNCH * 1.0 + 12.0 * (nodes - 1) + args.boot
                over = result["up"] / floor - 1
                worst = max(worst, over)
                print(f"{nodes:>5} {result['up']:>8.2f} {floor:>8.2f} {over:>6.1%} "
                      f"{result['teardown']:>11.2f} {int(result['requests']):>9} "
                      f"{int(result['429']):>5}", flush=True)
            print(f"worst overhead over the floor: {worst:.1%} (target: within 5%)")
        finally:
            sshd.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
