"""Stage 1, read: a dump's steps as values, one module per format.

`formats.py` tells a dump's format from its layout and holds each format's step reader:
`miles.py` (miles and slime format 1), `slime_v2.py`, `nemo_rl.py`, each giving the same
`StepRead` (`tokenlake.steptypes`). `dump.py` owns the layout of a `.pt` dump and loads its
files; `validate.py`, `train_checks.py` and `values.py` check values, `resolve.py` (with
`cp_layout.py`) joins train rows to samples; `weight_versions.py`, `sampling_support.py`,
`tinker.py`, `replay.py`, `jsontext.py`, `trajectory.py`, `vocab.py` and `dashboard.py` read the
rest. Two wings: `pt/` (the only reader of `.pt` files, entered through its `__init__`) and
`remote/` (dumps on an object store).
"""

from __future__ import annotations
