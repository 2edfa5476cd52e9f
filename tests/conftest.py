"""Shared fixtures. Tests use real Chromium, a real DuckDB/Parquet lake and real tiny models; nothing
touches the network (the Hub is unreachable here, and HF_HUB_OFFLINE makes that fail fast)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture
def lake_root(tmp_path):
    return tmp_path / "lake"
