"""Serve: answer digit predictions with the latest registered version of the MLflow model.

    invoke serve-deploy examples/serve.yaml                 # or: invoke serve-deploy examples.serve_model:app
    python examples/serve_client.py "$(invoke serve-url digits)"

POST a JSON body {"inputs": [[64 pixel values in 0..1], ...]}; the answer is {"predictions": [...]}.
The model is loaded from `models:/<MODEL_NAME>/latest` on the cluster's tracking server (the node's
environment names it and holds the login); MODEL_NAME defaults to `digits-mlp`.
"""

from __future__ import annotations

import os
from typing import Any

from ray import serve


@serve.deployment
class DigitClassifier:
    def __init__(self) -> None:
        import mlflow.pytorch

        self.model_uri = f"models:/{os.environ.get('MODEL_NAME', 'digits-mlp')}/latest"
        self.model = mlflow.pytorch.load_model(self.model_uri)
        self.model.eval()

    async def __call__(self, request: Any) -> dict[str, Any]:
        import torch

        body = await request.json()
        with torch.no_grad():
            scores = self.model(torch.tensor(body["inputs"], dtype=torch.float32))
        return {"predictions": scores.argmax(dim=1).tolist(), "model": self.model_uri}


app = DigitClassifier.bind()
