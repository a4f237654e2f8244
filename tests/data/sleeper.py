"""A job that prints a variable from its runtime env, then sleeps until stopped."""

import os
import time

print(f"GREETING={os.environ.get('GREETING')}", flush=True)
time.sleep(600)
