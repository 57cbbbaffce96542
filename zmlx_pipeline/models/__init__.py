"""models part of zmlx-pipeline (see DESIGN.md)."""

import os

# HistGradientBoosting's OpenMP threads spin while they wait for each other: on a machine shared
# with other work a fit then runs tens of times slower. Waiting passively costs little when idle.
# (Read when OpenMP loads, so it is set before scikit-learn is imported; an explicit setting wins.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
