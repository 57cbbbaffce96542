"""Test double of a measuring worker (unit tests only): speaks kernels/worker.py's protocol without a GPU.

Each item's fake time derives from its index; the item with index FAKE_FATAL (env) reports a broken GPU.
With FAKE_LOG (env) set, appends one JSON line there per worker: its pid, CUDA_VISIBLE_DEVICES and item indices.
With FAKE_COMPILE_LOG set, it also speaks the compile phase (compiled, then load) and logs when and what.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(path: str) -> int:
    with open(path) as fh:
        job = json.load(fh)
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                  "job_gpu": job.get("gpu"), "items": [it["i"] for it in job["items"]]}) + "\n")
    if job.get("compile_share") and os.environ.get("FAKE_COMPILE_LOG"):  # the compile phase of several GPUs
        time.sleep(0.05 * float(job.get("gpu") or 0))  # workers finish compiling at different times
        compiled_at = time.time()
        print(json.dumps({"compiled": len(job["compile_share"])}), flush=True)
        if sys.stdin.readline().strip() != "load":
            return 0
        with open(os.environ["FAKE_COMPILE_LOG"], "a") as log:
            log.write(json.dumps({"gpu": job.get("gpu"), "compiled_at": compiled_at, "load_at": time.time(),
                                  "share": [[it["dtype"], it["config"], it["shape"]] for it in job["compile_share"]]})
                      + "\n")
    print(json.dumps({"ready": len(job["items"]), "pid": os.getpid()}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 0
    fatal = int(os.environ.get("FAKE_FATAL", "-1"))
    for item in job["items"]:
        if item["i"] == fatal:
            print(json.dumps({"fatal": "fake broken context"}), flush=True)
            return 3
        t = 10.0 + item["i"]
        print(json.dumps({"i": item["i"], "status": "ok", "error": None, "timing": [t, t, t, 5, 1],
                          "pid": os.getpid()}), flush=True)
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
