import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib.util

import pytest

_LIBRARIES = {"colpali": "colpali_engine", "pylate": "pylate"}


def pytest_collection_modifyitems(config, items):
    """Stack-marked tests skip, with the reason, outside their environment (`make test` routes them)."""
    for item in items:
        for marker, module in _LIBRARIES.items():
            if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
                item.add_marker(pytest.mark.skip(reason=f"needs the {marker} environment ({module} not installed)"))
