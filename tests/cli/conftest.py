"""Fixtures for CLI tests: the tiny byte-level model (real engine), and a runner for `bulkrun ...`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "job"))

from jobtest_helpers import make_tiny_model  # noqa: E402

from bulkrun.cli import main  # noqa: E402

# Small engine settings so a test allocates megabytes, not a free-memory-sized KV cache.
ENGINE_FLAGS = ["--kv-cache-mem", "16MiB", "--max-seqs", "16", "--max-batch-tokens", "512"]


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
