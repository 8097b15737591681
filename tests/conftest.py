"""Suite-wide fixtures. Every test gets its own EXACTEDIT_HOME (the user-level blind registry,
evals.protocol.registry), so no test sees another's blind runs or the user's real ones; a session-wide one
is set first, for module- and session-scoped fixtures, which are built before any test's own."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_exactedit_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXACTEDIT_HOME", str(tmp_path_factory.mktemp("exactedit-home-session")))
        yield


@pytest.fixture(autouse=True)
def exactedit_home(_session_exactedit_home, tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("exactedit-home")
    monkeypatch.setenv("EXACTEDIT_HOME", str(home))
    return home
