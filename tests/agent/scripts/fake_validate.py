"""Stands in for the checkpoint library's validate entry point: the verdict depends
on the URI, and the message tells the niceness it ran at."""

import json
import os
import sys

uri = sys.argv[1]
if "gone" in uri:
    print(json.dumps({"result": "invalid", "message": f"checkpoint {uri} has no MANIFEST.json", "unreadable": True}))
    sys.exit(1)
if "broken" in uri:
    print(json.dumps({"result": "error", "message": "eval_fn 'm:f' raised ValueError: boom"}))
    sys.exit(2)
if "crash" in uri:
    raise SystemExit("segfault-ish")
result = "invalid" if "bad" in uri else "valid"
print(json.dumps({"result": result, "loss": 0.5, "reference_loss": 0.5, "message": f"nice={os.nice(0)}"}))
sys.exit(0 if result == "valid" else 1)
