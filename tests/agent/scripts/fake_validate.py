"""Stands in for the checkpoint library's validate entry point: the verdict depends
on the URI, and the message tells the niceness it ran at."""

import json
import os
import sys
import time


def check(uri: str) -> tuple[dict, int]:
    """The verdict printed on `uri` and the exit status (SystemExit for a crash)."""
    if "gone" in uri:
        return {"result": "invalid", "message": f"checkpoint {uri} has no MANIFEST.json", "unreadable": True}, 1
    if "broken" in uri:
        return {"result": "error", "message": "eval_fn 'm:f' raised ValueError: boom"}, 2
    if "hang" in uri:
        time.sleep(3600)
    if "crash" in uri:
        raise SystemExit("segfault-ish")
    result = "invalid" if "bad" in uri else "valid"
    return {"result": result, "loss": 0.5, "reference_loss": 0.5, "message": f"nice={os.nice(0)}"}, 0 if result == "valid" else 1


if __name__ == "__main__":
    doc, code = check(sys.argv[1])
    print(json.dumps(doc))
    sys.exit(code)
