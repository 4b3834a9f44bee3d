"""Everything that runs on a VM: the agent, notice watchers, the checkpoint library.

Nothing under this package imports Django: it ships to VMs on its own.
"""

__version__ = "0.1.0"
