"""`python -m respawn`: the `respawn` CLI (respawn.cli); the agent is `python -m respawn.agent`."""

from respawn.cli.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
