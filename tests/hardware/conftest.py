"""Shared fixtures for the hardware-profile tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_search_path(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hide the developer's own ~/.config/simgrid/profiles and $SIMGRID_PROFILE_PATH from every test."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SIMGRID_PROFILE_PATH", raising=False)
    return home
