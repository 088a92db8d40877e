import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib.util

import pytest


@pytest.fixture
def own_gates(tmp_path, monkeypatch):
    """A folder of the test's own for GPU gates (and the host registry): sweeps started by the test put
    theirs there, and nothing inherited from the environment points a cell at the host's real ones."""
    from harness import gpu_gate, host
    from harness.orchestrate import pool

    folder = tmp_path / "gates"
    folder.mkdir()
    monkeypatch.setenv(pool.GATE_DIR_VARIABLE, str(folder))
    monkeypatch.setenv(host.HOST_DIR_VARIABLE, str(tmp_path / "host"))  # and a host registry of its own
    monkeypatch.delenv(gpu_gate.LOCK_VARIABLE, raising=False)
    monkeypatch.delenv(gpu_gate.SHARE_VARIABLE, raising=False)
    return folder


_LIBRARIES = {"colpali": "colpali_engine", "pylate": "pylate"}


def pytest_collection_modifyitems(config, items):
    """Stack-marked tests skip, with the reason, outside their environment (`make test` routes them)."""
    for item in items:
        for marker, module in _LIBRARIES.items():
            if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
                item.add_marker(pytest.mark.skip(reason=f"needs the {marker} environment ({module} not installed)"))
