"""The command line: help everywhere, version, clean one-line failures with documented exit codes."""

from __future__ import annotations

import json

import pytest
from helpers.cli_commands import command_paths
from helpers.models import ENGINE_FLAGS
from helpers.rows import texts, write_jsonl

from bulkrun import __version__
from bulkrun.exceptions import (
    EXIT_INPUT,
    EXIT_JOB_CHANGED,
    EXIT_LOCKED,
    EXIT_MODEL,
    EXIT_OK,
    EXIT_ROW_ERRORS,
    EXIT_USAGE,
)
from bulkrun.io.lock import JobLock

COMMANDS = command_paths()  # ("generate",), ..., ("batch", "prepare"), ...


def test_the_job_commands_are_all_there():
    assert {"generate", "summarize", "run", "status", "export"} <= {path[0] for path in COMMANDS}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(bulkrun, command):
    code, out, _ = bulkrun(*command, "--help")
    assert code == EXIT_OK
    assert "Usage" in out and len(out.splitlines()) > 5


def test_top_level_help_and_version(bulkrun):
    code, out, _ = bulkrun("--help")
    assert code == EXIT_OK and all(path[0] in out for path in COMMANDS)
    code, out, _ = bulkrun("--version")
    assert code == EXIT_OK and out.strip() == f"bulkrun {__version__}"


def _one_clean_line(err: str) -> None:
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("bulkrun: error:")]) == 1


def test_unknown_option_is_a_usage_error(bulkrun, tmp_path):
    code, _, err = bulkrun("generate", tmp_path / "x.jsonl", "--temprature", "1")
    assert code == EXIT_USAGE and "No such option" in err and "Traceback" not in err


def test_missing_input_stops_before_any_work(bulkrun, tmp_path, cli_model):
    code, _, err = bulkrun("generate", tmp_path / "nope.jsonl", "--model", cli_model, "--out", tmp_path / "o")
    assert code == EXIT_INPUT and "does not exist" in err
    _one_clean_line(err)
    assert not (tmp_path / "o").exists()


def test_model_not_found(bulkrun, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", texts(2))
    code, _, err = bulkrun("generate", path, "--model", "/no/such/path", "--out", tmp_path / "o")
    assert code == EXIT_MODEL and "/no/such/path" in err
    _one_clean_line(err)


def test_a_file_that_is_not_a_gguf_is_a_model_error(bulkrun, tmp_path, monkeypatch):
    monkeypatch.setenv("BULKRUN_CACHE_DIR", str(tmp_path / "cache"))
    path = write_jsonl(tmp_path / "in.jsonl", texts(2))
    (tmp_path / "broken.gguf").write_text("not a gguf")
    code, _, err = bulkrun("generate", path, "--model", tmp_path / "broken.gguf", "--out", tmp_path / "o")
    assert code == EXIT_MODEL and "broken.gguf" in err and "not a readable GGUF" in err
    _one_clean_line(err)


def test_invalid_spec_names_the_key(bulkrun, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text('task = "generate"\ninput = "in.jsonl"\nmax_tokenz = 3\n')
    code, _, err = bulkrun("run", spec)
    assert code == EXIT_USAGE and "max_tokenz" in err and "max_tokens" in err
    _one_clean_line(err)


def test_bad_values_are_usage_errors(bulkrun, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", texts(2))
    for args in (["--top-p", "0"], ["--checkpoint-every", "often"], ["--shard", "3/3"], ["--workers", "2"]):
        code, _, err = bulkrun("generate", path, *args)
        assert code == EXIT_USAGE, args
        _one_clean_line(err)


def test_kernels_the_device_cannot_run_are_usage_errors(bulkrun, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", texts(2))
    code, _, err = bulkrun(
        "generate", path, "--device", "cpu", "--kernels", "triton", "--out", tmp_path / "o"
    )
    assert code == EXIT_USAGE and "--kernels triton needs a CUDA device" in err
    _one_clean_line(err)
    assert not (tmp_path / "o").exists()


def test_row_errors_exit_code_lock_and_changed_job(bulkrun, tmp_path, cli_model):
    rows = texts(4) + [{"id": "bad", "text": ""}]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    args = ["generate", path, "--model", cli_model, "--out", out, "--id-field", "id", "--max-tokens", "3",
            "--quiet", *ENGINE_FLAGS]  # fmt: skip
    code, _, err = bulkrun(*args)
    assert code == EXIT_ROW_ERRORS and err == ""  # --quiet: nothing on stderr
    assert [e["id"] for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())] == ["bad"]
    with JobLock(out / "lock"):
        code, _, err = bulkrun(*args)
    assert code == EXIT_LOCKED and "in use" in err
    code, _, err = bulkrun(*args, "--max-tokens", "4")
    assert code == EXIT_JOB_CHANGED and "max_tokens: 3 -> 4" in err and "--restart" in err
    code, _, _ = bulkrun(*args, "--max-tokens", "4", "--restart")
    assert code == EXIT_ROW_ERRORS


def test_status_and_export_on_a_non_job(bulkrun, tmp_path):
    for command in ("status", "export"):
        code, _, err = bulkrun(command, tmp_path)
        assert code == EXIT_INPUT and "no bulkrun job" in err
