"""Data-parallel training with Ray Train's TorchTrainer over --num-workers workers.

Each worker trains the same small CNN on its shard of scikit-learn's 8x8 digits (shipped with
scikit-learn: nothing is downloaded); gradients are averaged across workers (PyTorch DDP, gloo on
CPUs, NCCL on GPUs). Loss and test accuracy are reported after every epoch.

    invoke submit examples/train_example.py                                    # 2 workers, small
    invoke submit examples/train_example.py -- --num-workers 8 --use-gpu --full

The last line is a machine-readable summary: `RESULT {...}`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from typing import Any

# Beside this script: the data, the model, one epoch of training.
from digits import accuracy, ship_with_ray, small_cnn, tensors, train_epoch


def train_loop_per_worker(config: dict[str, Any]) -> list[dict[str, float]]:
    """Runs on every worker; rank 0's return value is the per-epoch history."""
    import ray.train
    import ray.train.torch
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(config["seed"])
    context = ray.train.get_context()
    x_train, y_train, x_test, y_test = tensors(config["seed"], images=True)
    # prepare_data_loader adds a DistributedSampler: each worker sees 1/num_workers of the data.
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(TensorDataset(x_train, y_train), batch_size=config["batch_size"], shuffle=True))
    model = ray.train.torch.prepare_model(small_cnn())  # DDP wrapper, on the right device
    device = ray.train.torch.get_device()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    history = []
    for epoch in range(1, config["epochs"] + 1):
        if context.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        metrics = {"epoch": epoch, "loss": train_epoch(model, loader, optimizer, device),
                   "accuracy": accuracy(model, x_test, y_test, device)}
        history.append(metrics)
        # Shows up live in the job's log as "Reporting training result <epoch>: ...".
        ray.train.report(metrics)
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2, help="training workers (default 2)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--storage", default=None,
                        help="where Ray Train keeps run state (default: a temp dir, removed at the end)")
    parser.add_argument("--full", action="store_true", help="real size: 30 epochs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.full:
        args.epochs = 30

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init()
    ship_with_ray()
    storage = args.storage or tempfile.mkdtemp(prefix="rayfleet-train-")
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                           "seed": args.seed},
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu,
                                     resources_per_worker={"CPU": args.cpus_per_worker}),
        run_config=RunConfig(name="train_example", storage_path=storage),
    )
    try:
        result = trainer.fit()
    finally:
        if args.storage is None:
            shutil.rmtree(storage, ignore_errors=True)
    # Rank 0's return value; `result.metrics` is only filled when checkpoints are reported.
    history = result.return_value or []
    for row in history:
        print(f"epoch {row['epoch']:2d}: loss {row['loss']:.4f}  accuracy {row['accuracy']:.4f}")
    final = history[-1] if history else {}
    print(f"trained on {args.num_workers} worker(s); final accuracy {final.get('accuracy', 0):.4f}")
    print("RESULT " + json.dumps({"workers": args.num_workers, "epochs": history, "final": final}))


if __name__ == "__main__":
    main()
