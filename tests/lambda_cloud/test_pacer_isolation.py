"""One pacer per Lambda account on a machine (issue 48): every process that uses the same API key
paces with the others (infra/node/lambda_cloud/pace_state.py), and processes of different keys
never wait on each other. Real subprocesses against the fake Lambda API, its limits scaled down
(the fake answers 429 to any two requests, or launches, closer than its intervals)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.node.lambda_cloud import api
from infra.node.lambda_cloud.pace_state import DIR_VARIABLE, account_store
from infra.node.lambda_cloud.pacing import Pacer
from tests.lambda_cloud.fake_api import FakeLambda

ROOT = Path(__file__).resolve().parents[2]
KEY = "secret_lambda_PACEKEY_9d1e4f07a2b3"
OTHER_KEY = "secret_lambda_OTHERKEY_1c7a60e5d88f"
SSH_KEY = "pace-key"
#: One process of an account: ready, then (on a line on stdin) `launches` launches from one thread
#: while another lists the instances `listings` times; each launch's name carries `name`.
CHILD = r"""
import sys, threading
from infra.node.lambda_cloud import api
url, key, scale, name, launches, listings = sys.argv[1:7]
client = api.LambdaClient(key, url, api.Limits.scaled(float(scale)), timeout=(5.0, 30.0))
print("ready", flush=True)
sys.stdin.readline()
lister = threading.Thread(target=lambda: [client.instances() for _ in range(int(listings))])
lister.start()
for i in range(int(launches)):
    client.launch(region="us-east-1", instance_type="gpu_1x_a10", ssh_key_name="pace-key",
                  name=f"{name}-{i}")
lister.join()
"""


class TwoAccounts(FakeLambda):
    """The fake answering two keys (two accounts at one endpoint)."""

    def authorized(self, header: str) -> bool:
        return super().authorized(header) or header == f"Bearer {OTHER_KEY}"


@pytest.fixture
def pacing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's pacing directory, for this process and the ones it starts."""
    directory = tmp_path / "pacing"
    monkeypatch.setenv(DIR_VARIABLE, str(directory))
    return directory


def account_fake(fake: FakeLambda) -> FakeLambda:
    """`fake` (not started) with room for the launches and the SSH key they name."""
    fake.capacity[("gpu_1x_a10", "us-east-1")] = 10
    fake.ssh_keys["k1"] = {"id": "k1", "name": SSH_KEY, "public_key": "ssh-ed25519 AAAA x"}
    return fake


def run_together(url: str, keys: list[str], scale: float, launches: int, listings: int) -> None:
    """One process per key in `keys`, started at once (each says when it is ready), to the end."""
    processes = [subprocess.Popen(
        [sys.executable, "-c", CHILD, url, key, str(scale), f"p{i}", str(launches), str(listings)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, key in enumerate(keys)]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n", \
                process.communicate(timeout=30)[1]
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def launched_at(fake: FakeLambda, name: str) -> list[float]:
    """When the fake took each launch of the process named `name`, in order."""
    return sorted(i.launched for i in fake.instances.values() if i.name.startswith(f"{name}-"))


def test_processes_of_one_key_never_break_the_request_or_launch_limit(pacing: Path) -> None:
    """Two processes of one key, each launching from one thread while listing from another: the
    fake (1/50 of Lambda's limits: 20 ms between requests, 240 ms between launches) never had two
    requests or two launches closer than its limits, so never answered 429. Each process pacing
    alone sent its first requests at the same moment as the other's."""
    scale = 0.02
    with account_fake(FakeLambda(KEY, scale=scale, boot_delay=60)) as fake:
        run_together(fake.url, [KEY, KEY], scale, launches=2, listings=6)
        with fake.lock:
            log = list(fake.log)
        assert [(m, p) for _, m, p, s in log if s == 429] == [], fake.timeline()
        accepted = sorted(t for t, _, _, s in log if s == 200)
        launches = sorted(t for t, m, p, s in log if p == "/instance-operations/launch" and s == 200)
        assert len(launches) == 4 and len(launched_at(fake, "p0")) == len(launched_at(fake, "p1")) == 2
        assert min(b - a for a, b in itertools.pairwise(accepted)) >= fake.general.interval * 0.999
        assert min(b - a for a, b in itertools.pairwise(launches)) >= fake.launches.interval * 0.999
    # The state is one file per account, named by a hash: the key is in no name and no content.
    files = sorted(pacing.iterdir())
    assert len([f for f in files if f.suffix == ".json"]) == 1, files
    assert not [f for f in files if KEY in f.name or KEY in f.read_text()]
    assert pacing.stat().st_mode & 0o077 == 0


def test_processes_of_different_keys_do_not_wait_on_each_other(pacing: Path) -> None:
    """Two accounts at one endpoint, a launch each at 1/5 of Lambda's limits (2.4 s between
    launches): the two launches go together (one pacer for both would have put them 2.4 s
    apart)."""
    scale = 0.2
    with account_fake(TwoAccounts(KEY, scale=scale, boot_delay=60)) as fake:
        fake.general.interval = fake.launches.interval = 0  # two accounts: each judged alone
        run_together(fake.url, [KEY, OTHER_KEY], scale, launches=1, listings=0)
        first, second = launched_at(fake, "p0"), launched_at(fake, "p1")
        assert len(first) == len(second) == 1
        assert abs(first[0] - second[0]) < 12.0 * scale / 2, (first, second)
    assert len(list(pacing.glob("*.json"))) == 2


def test_a_429_quiets_every_pacer_of_the_account(pacing: Path) -> None:
    """A 429's deferral (PacedRetry: `Pacer.push_back`) holds back the account's other pacers
    (as another process's would be: the state is the account's file), not those of another key."""
    limits = api.Limits.scaled(0.01)
    told, other = (Pacer(limits, account_store("http://127.0.0.1:9/api/v1", KEY)) for _ in range(2))
    elsewhere = Pacer(limits, account_store("http://127.0.0.1:9/api/v1", OTHER_KEY))
    started = time.monotonic()
    told.push_back(1.0)
    elsewhere.wait(launch=False)
    elsewhere.done()
    assert time.monotonic() - started < 0.8
    other.wait(launch=False)
    other.done()
    assert time.monotonic() - started >= 1.0


def test_a_crashed_holder_of_the_turn_holds_nobody_back(pacing: Path) -> None:
    """A process killed while its request holds the account's turn (before its request was
    written): the next request goes within the network's transit bound and one interval, not
    after `Pacer.HOLD` (120 s)."""
    url = "http://127.0.0.1:9/api/v1"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from infra.node.lambda_cloud import api, pacing, "
         f"pace_state; p = pacing.Pacer(api.Limits.scaled(0.01), pace_state.account_store({url!r}, "
         f"{KEY!r})); p.wait(launch=True); print('holding', flush=True); sys.stdin.readline()"],
        cwd=ROOT, env=os.environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    pacer = Pacer(api.Limits.scaled(0.01), account_store(url, KEY))
    waiter = threading.Thread(target=pacer.wait, args=(False,), daemon=True)
    started = time.monotonic()
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive(), "the dead holder's turn was never taken back"
    assert time.monotonic() - started < 5


def test_a_stale_state_file_goes_and_its_holder_paces_on_with_the_account(pacing: Path) -> None:
    """A state file nobody wrote for a day (a key no longer used) is removed when a client is
    made; a process still holding it opens the account's new file, so it keeps pacing with the
    account's other processes."""
    url = "http://127.0.0.1:9/api/v1"
    limits = api.Limits.scaled(0.01)
    holder = Pacer(limits, account_store(url, KEY))
    holder.wait(launch=False)
    holder.done()
    (stale,) = pacing.glob("*.json")
    day_ago = time.time() - 2 * 86400
    os.utime(stale, (day_ago, day_ago))
    account_store(url, OTHER_KEY)  # another client: the stale file goes
    assert not stale.exists()
    other = Pacer(limits, account_store(url, KEY))
    started = time.monotonic()
    holder.push_back(1.0)
    other.wait(launch=False)
    other.done()
    assert time.monotonic() - started >= 1.0
