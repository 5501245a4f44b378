"""A small real training loop that survives being stopped: linear regression by minibatch SGD in NumPy.

Every ``--checkpoint-every`` steps it saves the step counter and the weights to ``$GPUPOOL_CHECKPOINT_DIR``
(atomically: a temporary file, then ``os.replace``, so a kill mid-write leaves the previous checkpoint), and
on start it resumes from the checkpoint it finds there. gpupool gives every attempt of a job the same
checkpoint directory, so a job the pool requeues after a GPU fault loses at most one interval of work. A job
that failed on its own is not retried; a new job continues it with ``--resume-from`` the old job's folder
(``~/.gpupool/jobs/<old id>/checkpoint``), read when its own folder holds no checkpoint yet.

Each step prints ``step N/TOTAL loss L``; a resumed run first prints ``resumed at step N``. Minibatches are
drawn from a generator seeded by the step, so a resumed run computes exactly what an uninterrupted one would.

    GPUPOOL_CHECKPOINT_DIR=/tmp/ckpt python examples/train_with_checkpoints.py --steps 200 --checkpoint-every 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FEATURES = 8
SAMPLES = 4096


def data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed regression problem: inputs, targets and the true weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES))
    w_true = rng.normal(size=FEATURES)
    y = x @ w_true + 0.01 * rng.normal(size=SAMPLES)
    return x, y, w_true


def load(checkpoint: Path) -> tuple[int, np.ndarray] | None:
    if not checkpoint.exists():
        return None
    with np.load(checkpoint) as saved:
        return int(saved["step"]), saved["weights"]


def save(checkpoint: Path, step: int, weights: np.ndarray) -> None:
    """Write then rename: the checkpoint on disk is always a whole one."""
    fd, temporary = tempfile.mkstemp(dir=checkpoint.parent, prefix=".checkpoint-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, step=step, weights=weights)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, checkpoint)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="total SGD steps")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep per step, to stand in for work"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--batch", type=int, default=64, help="minibatch size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--resume-from",
        type=Path,
        help="an earlier job's checkpoint folder, to start from while this job's own has no checkpoint",
    )
    args = parser.parse_args(argv)

    directory = Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR") or "checkpoints")
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = directory / "train.npz"
    x, y, w_true = data(args.seed)

    step, weights = 0, np.zeros(FEATURES)
    restored, source = load(checkpoint), ""
    if restored is None and args.resume_from is not None:
        earlier = args.resume_from.expanduser() / checkpoint.name
        restored, source = load(earlier), f" from {args.resume_from}"
        if restored is None:
            print(
                f"--resume-from: no checkpoint {earlier} (expected a job's checkpoint folder)",
                file=sys.stderr,
            )
            return 2
    if restored is not None:
        step, weights = restored
        print(f"resumed at step {step}{source}", flush=True)
    while step < args.steps:
        batch = np.random.default_rng([args.seed, step]).integers(0, SAMPLES, size=args.batch)
        error = x[batch] @ weights - y[batch]
        weights = weights - args.lr * (x[batch].T @ error) / args.batch
        step += 1
        loss = float(np.mean((x @ weights - y) ** 2))
        print(f"step {step}/{args.steps} loss {loss:.6f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save(checkpoint, step, weights)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    distance = float(np.linalg.norm(weights - w_true))
    print(f"done: {step} steps, distance to the true weights {distance:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
