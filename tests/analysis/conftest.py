"""Fixtures for the analysis tests: the real SmolLM2 model (loaded once per session)."""

import pytest


@pytest.fixture(scope="session")
def smollm2():
    from pipeline.analysis.subject import Subject

    return Subject("smollm2", "auto")
