"""A Ray Tune sweep: learning rate x batch size for a small CNN, with the ASHA scheduler.

The CNN (PyTorch) classifies scikit-learn's 8x8 handwritten digits, which ship with scikit-learn:
nothing is downloaded. ASHA stops the worst trials early, so most of the budget goes to the
promising ones. Each trial reserves --cpus-per-trial CPUs and --gpus-per-trial GPUs (fractions
allowed, e.g. 0.25 to pack four trials on one GPU).

    invoke submit examples/tune_sweep.py                                   # small
    invoke submit examples/tune_sweep.py -- --num-samples 32 --epochs 20   # real size
    invoke submit examples/tune_sweep.py -- --gpus-per-trial 0.5

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


def train_digits(config: dict[str, Any]) -> None:
    """One trial: train for config["epochs"] epochs, reporting test accuracy after each."""
    import torch
    from ray import tune
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(config["seed"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x_train, y_train, x_test, y_test = tensors(config["seed"], images=True)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=int(config["batch_size"]),
                        shuffle=True)
    model = small_cnn().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    for _ in range(config["epochs"]):
        loss = train_epoch(model, loader, optimizer, device)
        tune.report({"loss": loss, "accuracy": accuracy(model, x_test, y_test, device)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=4, help="trials to run (default 4)")
    parser.add_argument("--epochs", type=int, default=3, help="max epochs per trial (default 3)")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--gpus-per-trial", type=float, default=0.0,
                        help="GPUs per trial; fractions share a GPU (default 0)")
    parser.add_argument("--storage", default=None,
                        help="where Tune keeps trial results (default: a temp dir, removed at the end)")
    parser.add_argument("--full", action="store_true", help="real size: 32 trials, 20 epochs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.full:
        args.num_samples, args.epochs = 32, 20

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray.init()
    ship_with_ray()
    storage = args.storage or tempfile.mkdtemp(prefix="rayfleet-tune-")
    scheduler = ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=2)
    tuner = tune.Tuner(
        tune.with_resources(train_digits, {"cpu": args.cpus_per_trial, "gpu": args.gpus_per_trial}),
        param_space={
            "lr": tune.loguniform(1e-4, 1e-1),
            "batch_size": tune.choice([16, 32, 64, 128]),
            "epochs": args.epochs,
            "seed": args.seed,
        },
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", scheduler=scheduler,
                                    num_samples=args.num_samples),
        run_config=tune.RunConfig(name="tune_sweep", storage_path=storage, verbose=1),
    )
    try:
        results = tuner.fit()
    finally:
        if args.storage is None:
            shutil.rmtree(storage, ignore_errors=True)
    best = results.get_best_result()
    trials = []
    for result in results:
        epochs = int(result.metrics.get("training_iteration", 0)) if result.metrics else 0
        trials.append({
            "lr": result.config["lr"], "batch_size": result.config["batch_size"],
            "epochs": epochs, "accuracy": (result.metrics or {}).get("accuracy"),
            "error": str(result.error).splitlines()[0] if result.error else None,
        })
    for t in sorted(trials, key=lambda t: -(t["accuracy"] or 0)):
        print(f"  lr={t['lr']:.5f} batch_size={t['batch_size']:3d} epochs={t['epochs']:2d} "
              f"accuracy={t['accuracy'] if t['accuracy'] is None else round(t['accuracy'], 4)}")
    config = {"lr": best.config["lr"], "batch_size": best.config["batch_size"]}
    print(f"best config: lr={config['lr']:.5f} batch_size={config['batch_size']} "
          f"accuracy={best.metrics['accuracy']:.4f}")
    print("RESULT " + json.dumps({
        "best_config": config,
        "best_accuracy": best.metrics["accuracy"],
        "trials": trials,
        "stopped_early": sum(1 for t in trials if t["epochs"] < args.epochs),
        "errors": sum(1 for t in trials if t["error"]),
    }))


if __name__ == "__main__":
    main()
