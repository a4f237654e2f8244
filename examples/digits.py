"""What the PyTorch examples share: scikit-learn's 8x8 handwritten digits as tensors (they ship with
scikit-learn: nothing is downloaded), their two small models, and one epoch of training.

train_example.py, tune_sweep.py, mlflow_train.py and train_model.py import it from beside them. Ray's
workers run in the uploaded project, where this folder is not on the import path: those scripts
have Ray ship this module's functions by value, like their own (`ship_with_ray`).
"""

from __future__ import annotations

import sys
from typing import Any


def tensors(seed: int = 0, images: bool = False) -> tuple[Any, Any, Any, Any]:
    """(x_train, y_train, x_test, y_test), pixels in [0, 1]: images 1x8x8 (for a CNN) or flat
    rows of 64 (for an MLP); a stratified quarter held out for testing."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = digits.images if images else digits.data
    x = torch.tensor(pixels / 16.0, dtype=torch.float32)
    x = x.unsqueeze(1) if images else x
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed,
                                                        stratify=y)
    return x_train, y_train, x_test, y_test


def small_cnn() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32 x 4 x 4
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def mlp(hidden: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train_epoch(model: Any, loader: Any, optimizer: Any, device: Any = "cpu") -> float:
    """One pass over `loader` (cross-entropy loss); the mean loss per sample."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    total, seen = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        seen += len(y)
    return total / seen


def accuracy(model: Any, x_test: Any, y_test: Any, device: Any = "cpu") -> float:
    import torch

    model.eval()
    with torch.no_grad():
        predicted = model(x_test.to(device)).argmax(dim=1).cpu()
    return float((predicted == y_test).float().mean())


def ship_with_ray() -> None:
    """Have Ray pickle this module's functions by value when a task or trainer uses them."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
