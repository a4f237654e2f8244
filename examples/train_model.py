"""A Hydra app: train a small PyTorch MLP on scikit-learn's digits with the configured optimizer.

    python examples/train_model.py optimizer.lr=3e-3                       # one run, here
    python examples/train_model.py --multirun hydra/launcher=ray optimizer.lr=1e-4,1e-3
    python examples/train_model.py --multirun hydra/launcher=ray hydra.launcher.remote=false \\
        optimizer.lr=1e-4,1e-3                                             # in-process Ray instead

With `hydra/launcher=ray` (examples/hydra_plugins/rayfleet_launcher) each run of the sweep becomes
a job on the current rayfleet cluster (`invoke up` first; `hydra.launcher.cluster=<name or path>`
picks another). Config: examples/conf/train_model.yaml. Each run prints `RESULT {...}` and
returns its test accuracy, which the launcher reports for the whole sweep.
"""

from __future__ import annotations

import json
import socket

import hydra

# Beside this script: the data, the model, one epoch of training. (The launcher ships this
# module with the jobs: a Ray job's import path does not hold this folder.)
from digits import accuracy, mlp, tensors, train_epoch
from omegaconf import DictConfig


def train(cfg: DictConfig) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(cfg.seed)
    x_train, y_train, x_test, y_test = tensors(cfg.seed)
    model = mlp(cfg.hidden)
    if cfg.optimizer.name == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=cfg.optimizer.lr)
    elif cfg.optimizer.name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr,
                                    momentum=cfg.optimizer.momentum)
    else:
        raise ValueError(f"optimizer.name={cfg.optimizer.name!r}: use adam or sgd")
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=cfg.batch_size, shuffle=True)
    loss = 0.0
    for epoch in range(1, cfg.epochs + 1):
        loss = train_epoch(model, loader, optimizer)
        print(f"epoch {epoch}: loss {loss:.4f}")
    return {"loss": loss, "accuracy": accuracy(model, x_test, y_test)}


@hydra.main(version_base=None, config_path="conf", config_name="train_model")
def main(cfg: DictConfig) -> float:
    metrics = train(cfg)
    print(f"{cfg.optimizer.name} lr={cfg.optimizer.lr}: accuracy {metrics['accuracy']:.4f} "
          f"on {socket.gethostname()}")
    print("RESULT " + json.dumps({"optimizer": cfg.optimizer.name, "lr": cfg.optimizer.lr,
                                  "host": socket.gethostname(), **metrics}))
    return metrics["accuracy"]


if __name__ == "__main__":
    main()
