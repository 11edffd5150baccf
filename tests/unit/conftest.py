"""Unit tests: sans-IO pieces only, no broker process and no network."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# Modest defaults keep the whole unit suite well under a minute; raise with HYPOTHESIS_PROFILE=thorough.
settings.register_profile(
    "unit", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "unit"))
