"""The held-out splits of evaluate.py: which rows each fold trains on and which it scores.

Splits:
- `shapes`: held-out shapes on seen devices: each kernel's shapes in up to 5 folds (2 for a
  kernel of over LARGE_KERNEL_CASES = 1000 cases); a fold's shapes are unseen on every device while
  training, its cases scored on devices seen in training (a kernel measured at one shape has
  no such case);
- `devices` (alias `lodo`): leave one device out: every case of the device is scored by
  methods trained on the other devices.

Protocols (check_protocol): `nested` (every choice of the model made inside each fold's training
rows) or `fixed` (the choices of one fit on every row, kept for every fold).
"""

from __future__ import annotations

import polars as pl

from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.models.features import CASE, KernelFeatures

SPLITS = ("shapes", "devices")
SPLIT_ALIASES = {"lodo": "devices"}
PROTOCOLS = ("nested", "fixed")
SHAPE_FOLDS = 5
# A kernel of more cases than this is held out in SHAPE_FOLDS_LARGE shape folds: fewer fits, and each fold's
# model still trains on over 500 cases, not far from a 5-fold of the committed data's largest kernel (softmax:
# 42 shapes x 3 dtypes x 6 devices = 756 cases, about 605 in a fold's training). Every case is still scored
# once; the committed data keeps 5 folds, so each fold holds out a fifth of the shapes, not half of them.
LARGE_KERNEL_CASES = 1000
SHAPE_FOLDS_LARGE = 2


class EvaluationError(ZmlxPipelineError, ValueError):
    "The evaluation cannot be run as asked"


def canonical_split(split: str) -> str:
    """The split's name (`lodo` is `devices`); EvaluationError for an unknown one."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    return split


def shape_folds(frame: pl.DataFrame) -> int:
    """The shape folds of a kernel: SHAPE_FOLDS, or SHAPE_FOLDS_LARGE for a kernel of more than
    LARGE_KERNEL_CASES cases (each fold's model still trains on half of them or more)."""
    cases = frame.select([c for c in CASE if c in frame.columns]).n_unique()
    return SHAPE_FOLDS_LARGE if cases > LARGE_KERNEL_CASES else SHAPE_FOLDS


def folds(frame: pl.DataFrame, split: str) -> list[tuple[str, pl.Expr, pl.Expr]]:
    """(name, training-row filter, test-row filter) per fold of one kernel's frame."""
    split = canonical_split(split)
    if split == "devices":
        devices = sorted(frame["device_id"].unique().to_list())
        if len(devices) < 2:
            return []
        return [(d, pl.col("device_id") != d, pl.col("device_id") == d) for d in devices]
    if split == "shapes":
        shapes = sorted(frame["shape_key"].unique().to_list())
        if len(shapes) < 2:
            return []
        n = min(shape_folds(frame), len(shapes))
        out = []
        for i in range(n):
            held = shapes[i::n]
            test = pl.col("shape_key").is_in(held)
            out.append((f"shapes-{i}", ~test, test))
        return out


def fold_rows(frame: pl.DataFrame, split: str, train_filter: pl.Expr,
              test_filter: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A fold's training and test rows; under `shapes` only the test rows of devices seen in training."""
    train = frame.filter(train_filter)
    test = frame.filter(test_filter)
    if split == "shapes":
        test = test.filter(pl.col("device_id").is_in(train["device_id"].unique().to_list()))
    return train, test


def fold_plan(features: KernelFeatures, split: str, enough_cases: int | None = None) -> list[int]:
    """The folds of a kernel that get scored: those with training and test rows, until `enough_cases`
    cases are (None: all)."""
    split = canonical_split(split)
    plan, scored = [], 0
    for i, (_, train_filter, test_filter) in enumerate(folds(features.frame, split)):
        if enough_cases is not None and scored >= enough_cases:
            break
        train, test = fold_rows(features.frame, split, train_filter, test_filter)
        if train.is_empty() or test.is_empty():
            continue
        plan.append(i)
        scored += test.select(CASE).n_unique()
    return plan


def check_protocol(protocol: str | None, split: str) -> str:
    """The protocol's name (None: `nested`); EvaluationError for an unknown one.

    `nested`: each outer fold's model makes every choice (ensemble weights, hedging, fallback to a
    baseline) by inner folds inside that fold's training rows, so the held-out shapes or the left-out
    device are never seen by any choice. `fixed`: the choices of one fit on every row are kept for
    every fold (what train's held-out pruning does): cheaper, but the choices saw the test rows.
    """
    protocol = "nested" if protocol is None else protocol
    if protocol not in PROTOCOLS:
        raise EvaluationError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return protocol
