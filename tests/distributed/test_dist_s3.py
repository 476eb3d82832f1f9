"""Jobs whose --out is s3://, against a real S3-protocol server on 127.0.0.1 (moto's standalone
server, started and stopped here), reached only through the standard environment variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY): a job killed with kill -9 and resumed
equals a clean run; two --shard slices then `bulkrun export`; a stale lock is taken over, a live one
is not."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid

import pytest
from helpers.models import ENGINE_FLAGS
from helpers.processes import start_until_marker
from helpers.rows import recorded_rows, texts, write_jsonl

from bulkrun.cli import main
from bulkrun.exceptions import EXIT_INCOMPLETE, EXIT_LOCKED, EXIT_OK, EXIT_ROW_ERRORS
from bulkrun.io.lock import STALE_AFTER_S

pytest.importorskip("moto", reason="moto is not installed: pip install 'bulkrun[dev]'")
pafs = pytest.importorskip("pyarrow.fs")

N_ROWS = 16
ROWS = texts(N_ROWS)
ROWS[5] = {"id": "r5", "text": ""}  # an error record travels through S3 too
FLAGS = ["--id-field", "id", "--max-tokens", "4", "--checkpoint-every", "3", "--window", "4",
         "--no-chat-template", "--quiet", *ENGINE_FLAGS]  # fmt: skip

# Runs bulkrun with its upload thread on a short period and a pause right after its first result
# shard is committed, until the upload thread has sent it: a kill -9 sent once the marker file exists
# surely lands mid-job, with committed work on S3.
PAUSE_AFTER_FIRST_UPLOAD = textwrap.dedent("""
    import pathlib, sys, time
    from bulkrun.io import mirror
    marker, sys.argv = pathlib.Path(sys.argv[1]), ["bulkrun", *sys.argv[2:]]
    init, upload = mirror._Uploader.__init__, mirror.RemoteMirror._upload
    mirror._Uploader.__init__ = lambda self, m, lock, every_s: init(self, m, lock, 0.2)
    def pausing_upload(self, rel):
        count = upload(self, rel)
        if rel.startswith("shards/") and not marker.exists():
            marker.touch()
        return count
    mirror.RemoteMirror._upload = pausing_upload
    from bulkrun.io import shards
    commit = shards.ShardWriter.commit
    def pausing_commit(self):
        path = commit(self)
        if path is not None and path.parent.name == "shards":
            while not marker.exists():  # the upload thread sends this shard
                time.sleep(0.01)
            time.sleep(120)  # the kill lands here
        return path
    shards.ShardWriter.commit = pausing_commit
    from bulkrun.cli import main
    main()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server in a child process on a free loopback port; stopped at the end."""
    port = _free_port()
    log = open(tmp_path_factory.mktemp("moto") / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"moto's server did not start (exit {server.poll()})")
            time.sleep(0.1)
    yield endpoint
    server.terminate()
    server.wait(timeout=30)
    log.close()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch) -> str:
    """A fresh bucket; the credentials and the endpoint only in the standard environment variables,
    for this process and the bulkrun processes it starts."""
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask for instance credentials
    }.items():
        monkeypatch.setenv(name, value)
    name = f"bulkrun-{uuid.uuid4().hex[:12]}"
    pafs.S3FileSystem(endpoint_override=s3_endpoint, allow_bucket_creation=True).create_dir(name)
    return name


def s3() -> pafs.FileSystem:
    return pafs.FileSystem.from_uri("s3://unused")[0]  # the endpoint from AWS_ENDPOINT_URL


def read_lines(uri: str) -> list[dict]:
    with s3().open_input_stream(uri.removeprefix("s3://")) as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def listing(uri: str) -> list[str]:
    infos = s3().get_file_info(pafs.FileSelector(uri.removeprefix("s3://"), allow_not_found=True))
    return sorted(info.base_name for info in infos)


def args(source, out: str, model, *more) -> list[str]:
    return ["generate", str(source), "--out", out, "--model", str(model), *FLAGS, *more]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("s3-input") / "in.jsonl", ROWS)


@pytest.fixture(scope="module")
def clean(source, tiny_job_model, tmp_path_factory):
    """The job's results and error records from one uninterrupted local run."""
    out = tmp_path_factory.mktemp("s3-clean") / "out"
    assert main(args(source, str(out), tiny_job_model)) == EXIT_ROW_ERRORS
    read = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]  # noqa: E731
    return read("results.jsonl"), read("errors.jsonl")


@pytest.fixture(scope="module")
def tiny_job_model(tmp_path_factory):
    from helpers.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("s3-tiny-llama"))


def test_a_job_killed_with_kill_9_resumes_from_s3_and_equals_a_clean_run(
    bucket, source, clean, tiny_job_model, tmp_path
):
    run = f"s3://{bucket}/run"
    marker = tmp_path / "first-shard-uploaded"
    with open(tmp_path / "stderr", "w") as stderr:
        proc = start_until_marker(PAUSE_AFTER_FIRST_UPLOAD, marker, args(source, run, tiny_job_model), stderr)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    uploaded = listing(f"{run}/shards")
    assert uploaded and "lock" in listing(run)  # committed work and the dead run's lock are on S3
    assert "results.jsonl" not in listing(run)
    assert main(args(source, run, tiny_job_model)) == EXIT_ROW_ERRORS  # takes the dead run's lock
    results, errors = clean
    assert read_lines(f"{run}/results.jsonl") == results
    assert read_lines(f"{run}/errors.jsonl") == errors
    assert json.loads(s3().open_input_stream(f"{bucket}/run/report.json").read())["out"] == run
    assert "lock" not in listing(run)
    pafs.copy_files(f"{bucket}/run", str(tmp_path / "copy"), source_filesystem=s3())
    assert sorted(recorded_rows(tmp_path / "copy")) == list(range(N_ROWS))  # every row exactly once


def test_two_shard_slices_then_export_on_s3(bucket, source, clean, tiny_job_model, capsys):
    run = f"s3://{bucket}/sliced"
    assert main(args(source, run, tiny_job_model, "--shard", "0/2")) in (EXIT_OK, EXIT_ROW_ERRORS)
    assert main(["export", run]) == EXIT_INCOMPLETE  # slice 1/2 has not run yet
    assert main(args(source, run, tiny_job_model, "--shard", "1/2")) in (EXIT_OK, EXIT_ROW_ERRORS)
    assert main(["export", run]) == EXIT_OK  # export succeeds; the row errors are in errors.jsonl
    results, errors = clean
    assert read_lines(f"{run}/results.jsonl") == results
    assert read_lines(f"{run}/errors.jsonl") == errors
    assert sorted(n for n in listing(f"{run}/slices")) == ["s0of2.json", "s1of2.json"]
    capsys.readouterr()
    assert main(["status", run, "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["done"] == N_ROWS


def _lock(bucket: str, run: str, heartbeat_age_s: float) -> None:
    """A lock left by a run on another host, whose heartbeat is `heartbeat_age_s` old."""
    now = time.time()
    lock = {"pid": 4242, "hostname": "another-host", "started": now - 7200, "token": "feed",
            "heartbeat": now - heartbeat_age_s}  # fmt: skip
    with s3().open_output_stream(f"{bucket}/{run}/lock") as f:
        f.write(json.dumps(lock).encode())


def test_a_stale_lock_on_s3_is_taken_over_and_a_live_one_refused(
    bucket, source, clean, tiny_job_model, capsys
):
    _lock(bucket, "live", heartbeat_age_s=1)
    assert main(args(source, f"s3://{bucket}/live", tiny_job_model)) == EXIT_LOCKED
    assert "in use" in capsys.readouterr().err
    assert listing(f"s3://{bucket}/live") == ["lock"]  # nothing done, the holder's lock kept

    _lock(bucket, "stale", heartbeat_age_s=STALE_AFTER_S + 60)
    assert main(args(source, f"s3://{bucket}/stale", tiny_job_model)) == EXIT_ROW_ERRORS
    assert read_lines(f"s3://{bucket}/stale/results.jsonl") == clean[0]
    assert "lock" not in listing(f"s3://{bucket}/stale")
