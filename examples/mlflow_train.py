"""Train, track: Ray Train (2 workers) trains a small MLP on scikit-learn's digits and logs to MLflow.

Needs a cluster with `tracking: mlflow` (clusters/local-mlflow.yaml); every node already knows the
tracking server and its login, so nothing here names a URL or a password:

    invoke up --cluster clusters/local-mlflow.yaml
    invoke submit --cluster clusters/local-mlflow.yaml examples/mlflow_train.py
    invoke serve-deploy --cluster clusters/local-mlflow.yaml examples/serve.yaml

The driver opens a run and logs the parameters; every worker logs its own loss per epoch into that
run (`loss_rank<N>`, and the host it ran on as a tag); rank 0 logs test accuracy per epoch, then the
model, registered as a new version of `--model-name` (default `digits-mlp`), which
examples/serve_model.py serves. Last line: `RESULT {"run_id": ..., "version": ...}`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import tempfile
from typing import Any

# Beside this script: the data, the model, one epoch of training.
from digits import accuracy, mlp, ship_with_ray, tensors, train_epoch


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    import mlflow
    import ray.train
    import ray.train.torch
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(config["seed"])
    rank = ray.train.get_context().get_world_rank()
    run_id = config["run_id"]
    # MLFLOW_TRACKING_URI and the login come from the node's environment (rayfleet sets them).
    client = mlflow.MlflowClient()
    client.set_tag(run_id, f"host_rank{rank}", socket.gethostname())
    x_train, y_train, x_test, y_test = tensors(config["seed"])
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(TensorDataset(x_train, y_train), batch_size=config["batch_size"], shuffle=True))
    model = ray.train.torch.prepare_model(mlp(config["hidden"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    device = ray.train.torch.get_device()
    score = 0.0
    for epoch in range(1, config["epochs"] + 1):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        loss = train_epoch(model, loader, optimizer, device)
        client.log_metric(run_id, f"loss_rank{rank}", loss, step=epoch)
        score = accuracy(model, x_test, y_test, device)
        if rank == 0:
            client.log_metric(run_id, "test_accuracy", score, step=epoch)
        ray.train.report({"epoch": epoch, "loss": loss, "accuracy": score})
    version = None
    if rank == 0:
        plain = getattr(model, "module", model)  # the model without its DDP wrapper
        with mlflow.start_run(run_id=run_id):
            # pickle: the whole module, any batch size (pt2 would fix the example's shapes).
            info = mlflow.pytorch.log_model(plain, name="model", pip_requirements=["torch"],
                                            serialization_format="pickle",
                                            input_example=x_test[:2].numpy(),
                                            registered_model_name=config["model_name"])
        version = info.registered_model_version
    return {"accuracy": score, "version": version}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--experiment", default="digits")
    parser.add_argument("--model-name", default="digits-mlp")
    args = parser.parse_args()

    import mlflow
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init()
    ship_with_ray()
    mlflow.set_experiment(args.experiment)
    storage = tempfile.mkdtemp(prefix="rayfleet-train-")
    with mlflow.start_run() as run:
        params = {k: v for k, v in vars(args).items() if k not in ("experiment", "model_name")}
        mlflow.log_params(params)
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={**params, "run_id": run.info.run_id, "model_name": args.model_name},
            scaling_config=ScalingConfig(num_workers=args.num_workers),
            run_config=RunConfig(name="mlflow_train", storage_path=storage),
        )
        try:
            result = trainer.fit()
        finally:
            shutil.rmtree(storage, ignore_errors=True)
    final = result.return_value or {}
    print(f"run {run.info.run_id}: test accuracy {final.get('accuracy', 0):.4f}, "
          f"model {args.model_name} version {final.get('version')}")
    print("RESULT " + json.dumps({"run_id": run.info.run_id, "experiment": args.experiment,
                                  "model": args.model_name, **final}))


if __name__ == "__main__":
    main()
