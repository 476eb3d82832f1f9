"""--ray / --ray-address ADDRESS / --workers / --shard: parsing and conflicts, before any work is done."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from bulkrun.cli import main
from bulkrun.cli import options as opt
from bulkrun.distributed.options import RAY_DEFAULT, check_exec_options, ray_address
from bulkrun.exceptions import EXIT_USAGE, UsageError


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--ray"], RAY_DEFAULT),
        (["--ray", "--workers", "2"], RAY_DEFAULT),
        (["--ray-address", "ray://head:10001"], "ray://head:10001"),
        (["--ray-address", "10.0.0.5:6379"], "10.0.0.5:6379"),
        (["--ray", "--ray-address", "auto"], "auto"),
        (["--ray-address=local"], "local"),
        ([], None),
    ],
)
def test_ray_options_give_the_spec_its_ray_value(argv, expected):
    """What the command line hands the job spec for `--ray` and `--ray-address ADDRESS`."""
    seen = {}
    app = typer.Typer()

    @app.command()
    def command(
        ctx: typer.Context,
        ray: opt.Ray = None,
        ray_address: opt.RayAddress = None,
        workers: opt.Workers = None,
    ):
        seen.update(opt.spec_values(ctx))

    assert CliRunner().invoke(app, argv).exit_code == 0
    assert seen.get("ray") == expected


def test_a_bad_ray_address_is_refused_with_one_line(capsys):
    """A --ray-address that is no address (here an input file's name): exit 2 before any work."""
    assert main(["generate", "--ray-address", "tickets.jsonl", "in.jsonl"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not a Ray address" in err and "Traceback" not in err


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
