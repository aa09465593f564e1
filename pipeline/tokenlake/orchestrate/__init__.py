"""Orchestration: running the stages over a dump. `extract.py` plans, commits and publishes a
run; `step.py` is one step's job in a worker, run by `scheduler.py` (or `ray_executor.py` on a
cluster) and shown by `progress.py`; `follow.py` follows a live run; `verify.py` reconciles a
lake with its manifests and sources; `maintain.py` changes a lake without a dump.
"""

# The bounds of `tokenlake extract`'s numbers, for the CLI and the Python API alike
# (`ExtractOptions.check`): worker processes, and the seconds of `--poll` and `--settle`.
from __future__ import annotations

MAX_WORKERS = 256
MAX_SECONDS = 86400.0
