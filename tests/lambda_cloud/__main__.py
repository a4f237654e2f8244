"""Run the fake Lambda Cloud API by hand: `python -m tests.lambda_cloud --help`."""

from __future__ import annotations

import argparse
import contextlib

from tests.lambda_cloud.fake_api import FakeLambda


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the fake Lambda Cloud API on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8899)
    parser.add_argument("--api-key", default="secret_fake_key")
    parser.add_argument("--scale", type=float, default=1.0, help="rate-limit scale (1 = real)")
    parser.add_argument("--boot-delay", type=float, default=20.0)
    parser.add_argument("--capacity", action="append", default=[],
                        help="TYPE@REGION=N (repeatable), e.g. gpu_1x_a10@us-east-1=4")
    parser.add_argument("--ip", action="append", default=[], help="address to hand out (repeatable)")
    args = parser.parse_args(argv)
    capacity = {}
    for item in args.capacity:
        where, _, count = item.partition("=")
        type_name, _, region = where.partition("@")
        capacity[(type_name, region)] = int(count or 1)
    fake = FakeLambda(args.api_key, scale=args.scale, boot_delay=args.boot_delay,
                      capacity=capacity, ip_pool=args.ip, port=args.port)
    print(f"fake Lambda API on {fake.url} (LAMBDA_API_URL={fake.url})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        fake.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
