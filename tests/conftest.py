"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``shared/`` folder next to the repository; tests skip when it is absent."""
    path = Path(__file__).resolve().parents[1].parent / "shared"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    return path
