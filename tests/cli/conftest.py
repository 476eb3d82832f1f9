"""Fixtures for CLI tests: the tiny byte-level model (real engine), and a runner for `bulkrun ...`."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.models import make_tiny_model

from bulkrun.cli import main


@pytest.fixture(scope="session")
def cli_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("cli-tiny-llama"))


@pytest.fixture
def bulkrun(capsys):
    """bulkrun(*args) -> (exit code, stdout, stderr), run in-process like the console script."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
