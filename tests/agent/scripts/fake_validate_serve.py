"""Stands in for the warm validator (`respawn.checkpoint.validate --serve`): answers as
fake_validate does, its message marked `warm`; dies on a URI naming `warmdies`."""

import json
import os
import sys

from fake_validate import check

print(json.dumps({"ready": True, "device": "cpu"}), flush=True)
for line in sys.stdin:
    uri = json.loads(line)[0]
    if "warmdies" in uri:
        os._exit(3)
    doc, code = check(uri)
    doc["message"] = f"warm {doc['message']}"
    print(json.dumps({"code": code, "output": json.dumps(doc)}), flush=True)
