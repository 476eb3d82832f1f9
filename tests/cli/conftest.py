"""Fixtures for CLI tests: the tiny byte-level model (real engine), and a runner for `bulkrun ...`."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.models import make_tiny_model
from typer.testing import CliRunner

from bulkrun.cli import app


@pytest.fixture(scope="session")
def cli_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("cli-tiny-llama"))


@pytest.fixture
def bulkrun():
    """bulkrun(*args) -> (exit code, stdout, stderr), run in-process through typer's CliRunner."""
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, [str(a) for a in args], prog_name="bulkrun", catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    return run
