"""The contract ships with the project: docs/CONTRACT.md is the shared one, word for word."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "CONTRACT.md"


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared beside this checkout")
def test_docs_contract_is_the_shared_contract() -> None:
    assert (ROOT / "docs" / "CONTRACT.md").read_text() == SHARED.read_text()
