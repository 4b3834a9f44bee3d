"""Run on a local VM in place of the agent: tries what a hostile job would and prints
one JSON line of what it could do (never what it read)."""

import json
import os
import sys


def attempt(action, path):
    try:
        action(path)
        return "done"
    except OSError as exc:
        return type(exc).__name__


def read(path):
    with open(path, "rb") as f:
        f.read(1)


def write_and_read_back(folder):
    """A file of this VM's in `folder`, then every file already there (an earlier VM's)."""
    with open(os.path.join(folder, f"written-by-{os.getuid()}"), "w") as f:
        f.write("x")
    for name in os.listdir(folder):
        read(os.path.join(folder, name))


def main() -> None:
    plan = json.loads(open(sys.argv[1]).read())
    print(json.dumps({
        "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
        "env": dict(os.environ),
        "read": {path: attempt(read, path) for path in plan["read"]},
        "list": {path: attempt(os.listdir, path) for path in plan["list"]},
        "write": {path: attempt(write_and_read_back, path) for path in plan["write"]},
        "home": attempt(write_and_read_back, os.environ["HOME"]),
    }), flush=True)


main()
