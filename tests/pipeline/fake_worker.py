"""Test double of a measuring worker (unit tests only): speaks kernels/worker.py's protocol without a GPU.

Each item's fake time derives from its index; the item with index FAKE_FATAL (env) reports a broken GPU.
"""

from __future__ import annotations

import json
import os
import sys


def main(path: str) -> int:
    with open(path) as fh:
        job = json.load(fh)
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
