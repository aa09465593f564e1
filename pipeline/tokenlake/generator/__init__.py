"""The dump generator (`tokenlake generate`): dumps of every layout and framework at any size,
and their ground truth. `synth.py` writes a dump from its spec (`synth_spec.py`) in a
framework's layout (`synth_frameworks.py`), with the newer and older sample shapes
(`synth_shapes.py`) and the dashboard (`synth_dashboard.py`); `synth_truth.py` computes what the
lake must hold.
"""

from __future__ import annotations
