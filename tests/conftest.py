"""Suite-wide fixtures. Every test gets its own EXACTEDIT_HOME (the user-level blind registry,
evals.registry), so no test sees another's blind runs or the user's real ones."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def exactedit_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("exactedit-home")
    monkeypatch.setenv("EXACTEDIT_HOME", str(home))
    return home
