"""A small real store shared by the fold-worker and speed tests: 3 devices, 4 shapes, 12 configs, times from a formula."""

from zmlx_pipeline.data.catalog import get_device

DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000", "nvidia-a100-pcie-40gb")


def fill(store, make_measurement, kernels=("k", "k2"), devices=DEVICES) -> None:
    for device_id in devices:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel=kernel, dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec},
                         median_us=(rows * (1 + i) / vec + abs(tg - 64 * rows ** 0.5) / 16 + 1) * (1 + j / 7))
        for j, kernel in enumerate(kernels) for i, d in enumerate(devices) for rows in (1, 16, 256, 4096)
        for tg in (64, 128, 256, 1024) for vec in (1, 2, 4)
    ])
