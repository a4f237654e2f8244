"""Ask the digits Serve app (examples/serve_model.py) about the test digits; print its accuracy.

    python examples/serve_client.py "$(invoke serve-url digits)" [--count 200]

Last line: `RESULT {"accuracy": ..., "count": ...}`.
"""

from __future__ import annotations

import argparse
import json

import requests
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the app's URL, e.g. from `invoke serve-url digits`")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    data = load_digits()
    _, x_test, _, y_test = train_test_split(data.data / 16.0, data.target, test_size=0.25,
                                            random_state=0, stratify=data.target)
    x_test, y_test = x_test[:args.count], y_test[:args.count]
    answer = requests.post(args.url, json={"inputs": x_test.tolist()}, timeout=60)
    answer.raise_for_status()
    predictions = answer.json()["predictions"]
    accuracy = sum(int(p == t) for p, t in zip(predictions, y_test, strict=True)) / len(y_test)
    print(f"{len(y_test)} digits, accuracy {accuracy:.3f} (chance: 0.1)")
    print("RESULT " + json.dumps({"accuracy": accuracy, "count": len(y_test)}))


if __name__ == "__main__":
    main()
