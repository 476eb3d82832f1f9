"""Job specs: TOML keys, flag overrides, unknown keys and bad values refused with the key named."""

from __future__ import annotations

import pytest

from bulkrun.exceptions import SpecError, UsageError
from bulkrun.job.spec import build_spec, parse_checkpoint, parse_size, spec_from_file


def _write(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_toml_spec_with_kebab_and_snake_keys_and_flag_overrides(tmp_path):
    path = _write(
        tmp_path,
        'task = "generate"\ninput = "in.jsonl"\ntemperature = 1\nmax-tokens = 12\nstop = "END"\n'
        "checkpoint_every = 500\nn = 2\n",
    )
    spec = spec_from_file(path, {"temperature": 0.3, "quiet": True})
    assert spec.temperature == 0.3 and isinstance(spec.temperature, float)
    assert spec.max_tokens == 12 and spec.stop == ["END"] and spec.n == 2
    assert spec.checkpoint_every == "500" and spec.quiet is True


def test_task_options_are_accepted_for_their_task_only(tmp_path):
    spec = spec_from_file(
        _write(tmp_path, 'task = "summarize"\ninput = "a.jsonl"\ninstruction = "Be brief."\n')
    )
    assert spec.task_options == {"instruction": "Be brief."}
    assert spec.max_tokens == 160  # the task's own default
    with pytest.raises(SpecError, match="unknown option 'instruction'.*task 'generate'"):
        spec_from_file(_write(tmp_path, 'task = "generate"\ninput = "a.jsonl"\ninstruction = "x"\n'))


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    with pytest.raises(SpecError, match="unknown option 'temprature'.*did you mean 'temperature'"):
        spec_from_file(_write(tmp_path, 'input = "a.jsonl"\ntemprature = 0.5\n'))


@pytest.mark.parametrize(
    "text, message",
    [
        ('input = "a.jsonl"\nmax_tokens = "many"\n', "option 'max_tokens'.*must be int"),
        ('input = "a.jsonl"\nchat_template = "yes"\n', "option 'chat_template'.*must be bool"),
        ('input = "a.jsonl"\n[sampling]\ntemperature = 1\n', "is a table"),
        ('input = "a.jsonl"\ntemperature = -1\n', "temperature must be >= 0"),
        ('input = "a.jsonl"\ncheckpoint_every = "soon"\n', "checkpoint-every"),
        ('input = "a.jsonl"\nkv_cache_bytes = "lots"\n', "invalid size"),
        ('input = "a.jsonl"\nprompt_template = "{a.b}"\n', "plain"),
        ('input = "a.jsonl"\nshard = "4/4"\n', "shard"),
        ('input = "a.jsonl"\nkernels = "cutlass"\n', "unknown kernel backend 'cutlass'"),
        ('task = "nope"\ninput = "a.jsonl"\n', "unknown task 'nope'"),
        ("input = \n", "not valid TOML"),
    ],
)
def test_invalid_specs_are_usage_errors(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        spec_from_file(_write(tmp_path, text))


def test_missing_spec_file_and_missing_input(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        spec_from_file(tmp_path / "no-such-job.toml")
    with pytest.raises(UsageError, match="no input"):
        build_spec([("cli", {"task": "generate"})])


def test_result_options_leave_out_mechanics():
    a = build_spec([("x", {"input": "a", "window": 10, "max_num_seqs": 4, "temperature": 0.5})])
    b = build_spec([("x", {"input": "b", "window": 99, "kernels": "reference", "temperature": 0.5})])
    from bulkrun.tasks.generate import GenerateTask

    assert a.result_options(GenerateTask) == b.result_options(GenerateTask)


def test_value_parsers():
    assert parse_checkpoint("500") == (500, None)
    assert parse_checkpoint("60s") == (None, 60.0)
    assert parse_checkpoint("500, 2m") == (500, 120.0)
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("512MB") == 512 * 10**6 and parse_size(4096) == 4096
    with pytest.raises(UsageError):
        parse_checkpoint("0")


@pytest.mark.parametrize("backend", ["auto", "triton", "cpu", "reference"])
def test_every_kernel_backend_is_accepted_on_a_device_it_runs_on(tmp_path, backend):
    device = "cuda" if backend == "triton" else "cpu"
    text = f'input = "a.jsonl"\nkernels = "{backend}"\ndevice = "{device}"\n'
    assert spec_from_file(_write(tmp_path, text)).kernels == backend


@pytest.mark.parametrize(("backend", "device"), [("triton", "cpu"), ("cpu", "cuda"), ("cpu", "cuda:1")])
def test_a_kernel_backend_the_device_cannot_run_is_a_usage_error(tmp_path, backend, device):
    text = f'input = "a.jsonl"\nkernels = "{backend}"\ndevice = "{device}"\n'
    with pytest.raises(UsageError, match=f"--kernels {backend}"):
        spec_from_file(_write(tmp_path, text))


def test_a_device_torch_does_not_know_is_a_usage_error(tmp_path):
    text = 'input = "a.jsonl"\nkernels = "cpu"\ndevice = "gpu0"\n'
    with pytest.raises(UsageError, match="device must be cpu or cuda"):
        spec_from_file(_write(tmp_path, text))


def test_ray_runs_leave_the_kernel_backend_to_their_workers(tmp_path):
    # the driver may have no GPU while every worker has one
    text = 'input = "a.jsonl"\nkernels = "triton"\ndevice = "cpu"\nray = "10.0.0.1:6379"\n'
    assert spec_from_file(_write(tmp_path, text)).kernels == "triton"
