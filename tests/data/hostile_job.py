"""A member's job that will not stop: it ignores SIGTERM and leaves a detached actor behind.

Prints the actor's worker pid and the job's id, then sleeps until it is killed."""

import os
import signal
import time

import ray

signal.signal(signal.SIGTERM, signal.SIG_IGN)
ray.init()


@ray.remote(num_cpus=0)
class Keeper:
    def pid(self) -> int:
        return os.getpid()


keeper = Keeper.options(lifetime="detached").remote()
print("KEEPER", ray.get(keeper.pid.remote()), flush=True)
print("JOBID", ray.get_runtime_context().get_job_id(), flush=True)
while True:
    time.sleep(1)
