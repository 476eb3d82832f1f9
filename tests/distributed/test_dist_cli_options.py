"""--ray [ADDRESS] / --workers / --shard: parsing and conflicts, before any work is done."""

from __future__ import annotations

import pytest

import click

from bulkrun.cli import main
from bulkrun.cli.options import DIST_OPTIONS, options
from bulkrun.distributed.options import RAY_DEFAULT, check_exec_options, ray_address
from bulkrun.errors import EXIT_USAGE, UsageError


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--ray"], RAY_DEFAULT),
        (["--ray", "--workers", "2"], RAY_DEFAULT),
        (["--ray", "ray://head:10001"], "ray://head:10001"),
        (["--ray", "10.0.0.5:6379"], "10.0.0.5:6379"),
        (["--ray", "auto"], "auto"),
        (["--ray=local"], "local"),
        ([], None),
    ],
)
def test_ray_option_takes_an_optional_address(argv, expected):
    """What the command line hands the job spec for `--ray [ADDRESS]` (click's optional value)."""
    seen = {}

    @click.command()
    @options(DIST_OPTIONS)
    def command(opts):
        seen.update(opts)

    command.main(argv, standalone_mode=False)
    assert seen.get("ray") == expected


def test_a_bare_ray_before_the_input_is_refused_with_one_line(capsys):
    """`--ray tickets.jsonl` would take the file as the address: exit 2 before any work, saying so."""
    assert main(["generate", "--ray", "tickets.jsonl"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not a Ray address" in err and "--ray=ADDRESS" in err and "Traceback" not in err


def test_ray_address_maps_the_default_to_rays_own_choice():
    assert ray_address(RAY_DEFAULT) is None
    assert ray_address(True) is None
    assert ray_address("ray://h:10001") == "ray://h:10001"


@pytest.mark.parametrize(
    "ray,workers,shard,needle",
    [
        (RAY_DEFAULT, None, "0/2", "cannot be combined"),
        (None, 2, None, "--workers applies to Ray runs only"),
        (RAY_DEFAULT, 0, None, "at least 1"),
        (None, None, "2/2", "0-based"),
        ("tickets.jsonl", None, None, "not a Ray address"),
    ],
)
def test_conflicting_options_are_refused(ray, workers, shard, needle):
    with pytest.raises(UsageError, match=needle):
        check_exec_options(ray, workers, shard)


def test_valid_combinations_pass():
    check_exec_options(RAY_DEFAULT, 2, None)
    check_exec_options("ray://h:10001", None, None)
    check_exec_options(None, None, "1/2")
    check_exec_options(None, None, None)
