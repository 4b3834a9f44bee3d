"""A job's trainer that checks what it was given and tries what a hostile one would,
printing names and outcomes, never a value; then trains respawn.examples.tiny."""

import hashlib
import os
import sys

want_digest, *private = sys.argv[1:]
got = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
print("HF_TOKEN matches" if got == want_digest else "HF_TOKEN is missing or wrong", flush=True)
print("environment names:", " ".join(sorted(os.environ)), flush=True)
for path in private:
    try:
        open(path, "rb").close()
        print(f"read {path}: done", flush=True)
    except OSError as exc:
        print(f"read {path}: {type(exc).__name__}", flush=True)
if got != want_digest:
    sys.exit(3)
os.execv(sys.executable, [sys.executable, "-m", "respawn.examples.tiny", "--steps", "30", "--step-delay", "0.02"])
