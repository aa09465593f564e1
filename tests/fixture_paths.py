"""Where the tests find the real miles fixtures: inside the repository, so a clone passes alone.

`tests/fixtures/miles-real/` is a verbatim copy of the project's reference fixtures (real
`--dump-details` dumps written by miles' own code, with what miles' own reader computed from
them; see its README). `tests/fixtures/miles-next/` is the same for the formats miles wrote
after the spec's snapshot, and one older one (docs/dump-format.md 9b; see its README). Tests
read them in place and never write into them.
"""

from __future__ import annotations

from pathlib import Path

MILES_REAL = Path(__file__).resolve().parent / "fixtures" / "miles-real"
REAL_DUMPS = MILES_REAL / "dumps"
REAL_ORACLE = MILES_REAL / "oracle"

# Real slime dumps, NeMo-RL logs and prime-rl token exports written by each framework's own code, with reference answers
# (each folder's README says how); listed with their hashes in each MANIFEST.sha256.
SLIME_REAL = Path(__file__).resolve().parent / "fixtures" / "slime-real"
NEMO_RL_REAL = Path(__file__).resolve().parent / "fixtures" / "nemo-rl-real"
PRIME_RL_REAL = Path(__file__).resolve().parent / "fixtures" / "prime-rl-real"
MILES_NEXT = Path(__file__).resolve().parent / "fixtures" / "miles-next"
NEXT_DUMPS = MILES_NEXT / "dumps"
NEXT_ORACLE = MILES_NEXT / "oracle"
