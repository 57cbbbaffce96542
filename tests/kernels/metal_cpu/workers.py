"""Worker processes for the CPU check, as a pytest fixture, and running a batch of cases through them."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from metal_cpu import execute


@pytest.fixture(scope="module")
def workers():
    """Processes that build and run the cases, two at a time (a crashing kernel fails its case, not the session)."""
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def run_all(pool, spec, cases, dtype, transform=None):
    """[(config, shape, Result)] of each (config, shape), built and run in the workers."""
    prepared = [execute.prepare(spec, c, s, dtype, seed=i, transform=transform) for i, (c, s) in enumerate(cases)]
    futures = [pool.submit(execute.run_library, p[0]) for p in prepared]
    return [(c, s, execute.judge(spec, dtype, p[1], p[2], p[3], f.result()))
            for (c, s), p, f in zip(cases, prepared, futures)]
