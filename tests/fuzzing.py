"""How hard the property tests hunt.

Each property names its full count of examples; a run takes ``PORTER_MESH_FUZZ_SCALE``
times that count (at least :data:`FLOOR`). The default, 0.35, is the quick pass of
``make test``; CI's second step runs every property again at 1 (``make test-properties``),
and a longer hunt is a larger scale (``PORTER_MESH_FUZZ_SCALE=20 make test-properties``).
Hypothesis' own default of 100 examples is scaled the same way (``tests/conftest.py``).
"""

from __future__ import annotations

import math
import os

#: The environment variable that sets the scale.
SCALE_ENV = "PORTER_MESH_FUZZ_SCALE"
#: Fewest examples a property runs, whatever the scale.
FLOOR = 10


def _scale() -> float:
    text = os.environ.get(SCALE_ENV, "0.35")
    try:
        scale = float(text)
    except ValueError:
        scale = -1.0
    if not (math.isfinite(scale) and scale > 0):
        raise SystemExit(f"{SCALE_ENV}={text!r}: give a number above 0 (1 is the full hunt)")
    return scale


SCALE = _scale()


def examples(full: int) -> int:
    """The examples to run of a property whose full hunt is ``full``."""
    return max(FLOOR, round(full * SCALE))
