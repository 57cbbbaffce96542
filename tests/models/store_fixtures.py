"""Small real stores shared by the model tests: configs timed by a formula on a few catalog devices."""

import math

from zmlx_pipeline.data.catalog import get_device

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000", "nvidia-a100-pcie-40gb")


def fill(store, make_measurement, kernels=("k", "k2"), devices=DEVICES) -> None:
    """3 devices, 4 shapes, 12 configs per kernel (the fold-worker and speed tests' store)."""
    for device_id in devices:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel=kernel, dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=(rows * (1 + i) / vec + abs(tg - 64 * rows ** 0.5) / 16 + 1) * (1 + j / 7))
        for j, kernel in enumerate(kernels) for i, d in enumerate(devices) for rows in (1, 16, 256, 4096)
        for tg in (64, 128, 256, 1024) for vec in (1, 2, 4)
    ])


def fill_moving_best(store, make_measurement, devices, bumps: bool = False) -> None:
    """Kernel "k" on each device at six shapes, 12 configs whose best moves with the shape and the device;
    `bumps` adds a small config-dependent term so that near-ties differ between devices."""
    for device_id in devices:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="k", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=rows * (1 + i) / vec + abs(math.log2(tg) - math.log2(rows) / (1 + i)) * 40
                         + (7 * ((tg * vec + rows + 3 * i) % 5) if bumps else 0) + 1)
        for i, d in enumerate(devices) for rows in (1, 4, 16, 64, 256, 4096)
        for tg in (32, 64, 128, 256, 512, 1024) for vec in (1, 4)
    ])
