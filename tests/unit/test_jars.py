"""The jars folder is resolved in one place (common/jars.py) for the job, the test bed and the benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.jars import CHECKOUT, CHECKOUT_JARS_DIR, jars_dir

pytestmark = pytest.mark.unit


def test_the_configured_folder_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNWATCH_JARS_DIR", "/from/env")
    assert jars_dir(Path("/configured")) == Path("/configured")


def test_the_environment_comes_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNWATCH_JARS_DIR", "/from/env")
    assert jars_dir() == Path("/from/env")


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_else_the_checkouts_own(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("TXNWATCH_JARS_DIR", raising=False)
    else:
        monkeypatch.setenv("TXNWATCH_JARS_DIR", value)
    assert jars_dir() == CHECKOUT_JARS_DIR
    assert (CHECKOUT / "pyproject.toml").is_file()  # the checkout, not the common/ folder
