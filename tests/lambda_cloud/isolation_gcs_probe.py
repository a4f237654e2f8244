"""A member's job tries GCS servers with every token it holds (tests/lambda_cloud/
test_e2e_sharing_isolation.py): its own cluster's (which must answer it: the probe can succeed)
and another member's (which must not).

    python isolation_gcs_probe.py OWN_GCS OTHER_GCS [FILE ...]

Tokens tried: none, its own (RAY_AUTH_TOKEN_PATH) and every 64-hex string in each FILE it can
read. Prints one line `GCS <json>`: for each address, one answer per token, "OK" when the GCS
answered the call, else the gRPC status's name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

import grpc
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

TOKEN = re.compile(rb"\b[0-9a-f]{64}\b")


def tokens(files: list[str]) -> list[bytes]:
    found = {b""}
    for path in [os.environ.get("RAY_AUTH_TOKEN_PATH", "/nonexistent"), *files]:
        with contextlib.suppress(OSError):
            found.update(TOKEN.findall(Path(path).read_bytes()[:1_000_000]))
    return sorted(found)


def answers(address: str, tried: list[bytes]) -> list[str]:
    said = []
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.GetAllNodeInfoRequest()  # type: ignore[attr-defined]
        for token in tried:
            metadata = [("authorization", f"Bearer {token.decode()}")] if token else []
            try:
                stub.GetAllNodeInfo(request, metadata=metadata, timeout=5)
                said.append("OK")
            except grpc.RpcError as exc:
                said.append(exc.code().name)
    return said


def main() -> int:
    own, other, *files = sys.argv[1:]
    tried = tokens(files)
    print("GCS " + json.dumps({"tried": len(tried), "own": answers(own, tried),
                               "other": answers(other, tried)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
