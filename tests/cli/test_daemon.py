"""`bulkrun daemon`: commands started from a shell run in a child of the resident daemon, with the
shell's arguments, folder, environment and terminal, and end exactly as they would on their own:
same results, same exit codes, Ctrl-C / SIGTERM commit what is finished; a client that dies has its
job stopped; another environment or a stopped daemon runs commands in their own process.
Real processes throughout (the daemon, its children, the `bulkrun` clients), on the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers.rows import read_jsonl, texts, write_jsonl

from bulkrun.cli import main

CLIENT = "from bulkrun.cli import main; main()"
# The daemon, with ShardWriter.commit pausing after a job's first result shard where the job's own
# environment names a marker file: a signal sent once the marker exists lands mid-job.
PAUSING_DAEMON = textwrap.dedent("""
    import os, pathlib, sys, time
    from bulkrun.io import shards
    commit = shards.ShardWriter.commit
    def pausing_commit(self):
        path = commit(self)
        marker = os.environ.get("PAUSE_MARKER")
        if marker and path is not None and path.parent.name == "shards" and not os.path.exists(marker):
            pathlib.Path(marker).touch()
            time.sleep(120)  # the signal lands here
        return path
    shards.ShardWriter.commit = pausing_commit
    from bulkrun.cli import daemon_client as client, daemon_server
    path = client.socket_path(client.private_dir(create=True))
    sys.argv = ["daemon_server", "--socket", str(path), *sys.argv[1:]]
    daemon_server.main()
""")
FLAGS = ["--id-field", "id", "--max-tokens", "6", "--checkpoint-every", "3", "--window", "6",
         "--max-seqs", "2", "--kv-cache-mem", "16MiB", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def env():
    """The clients' and the daemon's environment: daemons allowed, in a folder of this module's."""
    folder = tempfile.mkdtemp(prefix="bulkrun-daemon-test-", dir="/tmp")  # short: a socket path has 108 bytes
    env = {k: v for k, v in os.environ.items() if k != "BULKRUN_NO_DAEMON"}
    env["BULKRUN_DAEMON_DIR"] = f"{folder}/d"
    yield env
    subprocess.run([sys.executable, "-c", CLIENT, "daemon", "stop", "--all"], env=env, timeout=60)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(env, cli_model):
    """A running daemon with the tiny model resident; yields its status()."""
    proc = subprocess.Popen([sys.executable, "-c", PAUSING_DAEMON, "--model", str(cli_model)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while (info := status(env)) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
        time.sleep(0.05)
    yield info
    bulkrun(env, "daemon", "stop")
    proc.wait(timeout=60)


def bulkrun(env: dict, *args, cwd: Path | None = None, **popen) -> subprocess.CompletedProcess:
    """`bulkrun ARGS` as a shell runs it: a fresh process of the console script's code."""
    return subprocess.run([sys.executable, "-c", CLIENT, *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, **popen)  # fmt: skip


def status(env: dict) -> dict | None:
    """The daemon's own account (None where none answers for this environment)."""
    code = "from bulkrun.cli import daemon_client as c; import json; " \
           "f = c.private_dir(); print(json.dumps(f and c.ask(c.socket_path(f), 'status')))"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_a_command_runs_in_the_daemon_with_the_callers_folder_and_gives_its_own_results(
    tmp_path, env, daemon, cli_model
):
    assert daemon["model"]["path"] == str(cli_model)
    write_jsonl(tmp_path / "in.jsonl", texts(9))
    served = status(env)["served"]
    ran = bulkrun(env, "generate", "in.jsonl", "--out", "out", "--model", cli_model, *FLAGS, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert status(env)["served"] == served + 1  # the daemon ran it
    alone = tmp_path / "alone"
    assert (
        main(["generate", str(tmp_path / "in.jsonl"), "--out", str(alone), "--model", str(cli_model), *FLAGS])
        == 0
    )
    assert read_jsonl(tmp_path / "out" / "results.jsonl") == read_jsonl(alone / "results.jsonl")


def test_output_and_exit_codes_reach_the_caller(tmp_path, env, daemon, cli_model):
    shown = bulkrun(env, "--version")
    assert shown.returncode == 0 and shown.stdout.startswith("bulkrun ")
    bad_flag = bulkrun(env, "generate", tmp_path / "in.jsonl", "--max-tokens", "many")
    assert bad_flag.returncode == 2 and "many" in bad_flag.stderr
    rows = [*texts(4), {"id": "bad", "text": ""}]  # an empty prompt: an error record, exit 3
    write_jsonl(tmp_path / "in.jsonl", rows)
    ran = bulkrun(
        env, "generate", tmp_path / "in.jsonl", "--out", tmp_path / "out", "--model", cli_model, *FLAGS
    )
    assert ran.returncode == 3, ran.stderr
    assert len(read_jsonl(tmp_path / "out" / "results.jsonl")) == 4
    assert [e["id"] for e in read_jsonl(tmp_path / "out" / "errors.jsonl")] == ["bad"]


def _start_paused(tmp_path, env, cli_model) -> tuple[subprocess.Popen, Path]:
    """A client whose job (in the daemon) pauses right after its first result shard."""
    write_jsonl(tmp_path / "in.jsonl", texts(24))
    out, marker = tmp_path / "out", tmp_path / "first-shard-committed"
    job_env = {**env, "PAUSE_MARKER": str(marker)}
    client = subprocess.Popen([sys.executable, "-c", CLIENT, "generate", str(tmp_path / "in.jsonl"), "--out",
                               str(out), "--model", str(cli_model), *FLAGS], env=job_env,
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "stderr", "w"))  # fmt: skip
    deadline = time.monotonic() + 120
    while client.poll() is None and time.monotonic() < deadline and not marker.exists():
        time.sleep(0.01)
    assert marker.exists(), f"the job never committed a shard (exit {client.poll()})"
    return client, out


def _committed(out: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in (out / "shards").glob("*.parquet"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_caller_stops_the_job_as_it_would_stop_it_alone(
    tmp_path, env, daemon, cli_model, signum
):
    client, out = _start_paused(tmp_path, env, cli_model)
    client.send_signal(signum)
    assert client.wait(timeout=60) == 130
    err = (tmp_path / "stderr").read_text()
    assert "interrupted" in err and "Traceback" not in err
    assert not (out / "lock").exists() and 0 < _committed(out) < 24  # what was finished is kept
    resumed = bulkrun(env, "generate", tmp_path / "in.jsonl", "--out", out, "--model", cli_model, *FLAGS)
    assert resumed.returncode == 0, resumed.stderr
    assert len(read_jsonl(out / "results.jsonl")) == 24


def test_a_caller_killed_outright_has_its_job_stopped_with_its_work_kept(tmp_path, env, daemon, cli_model):
    client, out = _start_paused(tmp_path, env, cli_model)
    client.kill()  # no chance to forward anything: the daemon sees its connection close
    client.wait(timeout=60)
    deadline = time.monotonic() + 60
    while status(env)["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(env)["running"] == 0
    assert not (out / "lock").exists() and 0 < _committed(out) < 24


def test_another_environment_runs_in_its_own_process(tmp_path, env, daemon, cli_model):
    write_jsonl(tmp_path / "in.jsonl", texts(3))
    served = status(env)["served"]
    other = {**env, "BULKRUN_SOMETHING_ELSE": "1"}  # read at import time, for all the client knows
    ran = bulkrun(
        other, "generate", tmp_path / "in.jsonl", "--out", tmp_path / "o1", "--model", cli_model, *FLAGS
    )
    assert ran.returncode == 0, ran.stderr
    off = {**env, "BULKRUN_NO_DAEMON": "1"}
    ran = bulkrun(
        off, "generate", tmp_path / "in.jsonl", "--out", tmp_path / "o2", "--model", cli_model, *FLAGS
    )
    assert ran.returncode == 0, ran.stderr
    assert status(env)["served"] == served


def test_start_status_stop_and_the_idle_timeout(tmp_path, cli_model):
    folder = tempfile.mkdtemp(prefix="bulkrun-daemon-test-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "BULKRUN_NO_DAEMON"}
    env["BULKRUN_DAEMON_DIR"] = f"{folder}/d"
    try:
        started = bulkrun(env, "daemon", "start", "--model", cli_model, "--idle-minutes", "60")
        assert started.returncode == 0 and "ready" in started.stdout, started.stderr
        assert "already running" in bulkrun(env, "daemon", "start", "--model", cli_model).stdout
        dead = Path(folder, "d", "0123456789abcdef01234567.sock")  # what a daemon killed with -9 leaves
        with socket.socket(socket.AF_UNIX) as left:
            left.bind(str(dead))
        listed = bulkrun(env, "daemon", "status").stdout
        assert str(cli_model) in listed and "(this environment)" in listed and listed.count("pid ") == 1
        assert not dead.exists()
        stopped = bulkrun(env, "daemon", "stop")
        assert stopped.returncode == 0 and "stopping" in stopped.stdout
        assert status(env) is None and not list(Path(folder, "d").glob("*.sock"))
        write_jsonl(tmp_path / "in.jsonl", texts(2))  # with no daemon the command runs on its own
        ran = bulkrun(
            env, "generate", tmp_path / "in.jsonl", "--out", tmp_path / "o", "--model", cli_model, *FLAGS
        )
        assert ran.returncode == 0, ran.stderr
        assert bulkrun(env, "daemon", "start", "--no-model", "--idle-minutes", "0.05").returncode == 0
        deadline = time.monotonic() + 60
        while status(env) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status(env) is None  # it stopped itself once idle
    finally:
        bulkrun(env, "daemon", "stop", "--all")
        shutil.rmtree(folder, ignore_errors=True)


def test_a_daemon_folder_others_can_enter_is_refused(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "BULKRUN_NO_DAEMON"}
    env["BULKRUN_DAEMON_DIR"] = str(folder)
    ran = bulkrun(env, "daemon", "start", "--no-model")
    assert ran.returncode == 2 and "not private" in ran.stderr


def test_sigterm_stops_the_daemon_cleanly():
    folder = tempfile.mkdtemp(prefix="bulkrun-daemon-test-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "BULKRUN_NO_DAEMON"}
    env["BULKRUN_DAEMON_DIR"] = f"{folder}/d"
    try:
        assert bulkrun(env, "daemon", "start", "--no-model").returncode == 0
        os.kill(status(env)["pid"], signal.SIGTERM)  # as a system shutdown would
        deadline = time.monotonic() + 60
        while status(env) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(env) is None and not list(Path(folder, "d").glob("*.sock"))
        log = next(Path(folder, "d").glob("*.log")).read_text()
        assert "stopped" in log and "Traceback" not in log
    finally:
        bulkrun(env, "daemon", "stop", "--all")
        shutil.rmtree(folder, ignore_errors=True)
