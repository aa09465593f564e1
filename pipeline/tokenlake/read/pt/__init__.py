"""The only reader of `.pt` files: an allow-listed unpickler over the zip container, no torch.

A security boundary with one way in: `load` (a file's value; a file younger than
`FRESH_SECONDS` is read into memory first) and `SpecInfo` (miles' pickled speculative-decoding
stand-in, which old dumps hold as an object). Nothing outside this folder imports its modules
(`tests/repo/test_import_graph.py`): `ptread.py` runs the unpickler over the zip container
(`ptzip.py`); `ptglobals.py` is the allow-list, `ptnumpy.py` builds numpy dtypes and arrays,
`pttensor.py` rebuilds tensors, `ptlists.py` decodes plain lists of numbers as whole arrays;
`ptcheck.py` and `ptvector.py` bound the pickle before it runs, from the opcode tables of
`ptopcodes.py`.
"""

from __future__ import annotations

from tokenlake.read.pt.ptglobals import SpecInfo
from tokenlake.read.pt.ptread import FRESH_SECONDS, load

__all__ = ["FRESH_SECONDS", "SpecInfo", "load"]
