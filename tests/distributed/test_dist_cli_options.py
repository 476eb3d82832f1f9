"""--ray [ADDRESS] / --workers / --shard: parsing and conflicts, before any work is done."""

from __future__ import annotations

import pytest

from bulkrun.distributed.options import RAY_DEFAULT, check_exec_options, fix_bare_ray_flag, ray_address
from bulkrun.errors import UsageError


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["run", "job.toml", "--ray"], ["run", "job.toml", f"--ray={RAY_DEFAULT}"]),
        (["classify", "--ray", "tickets.jsonl"], ["classify", f"--ray={RAY_DEFAULT}", "tickets.jsonl"]),
        (
            ["run", "j.toml", "--ray", "--workers", "2"],
            ["run", "j.toml", f"--ray={RAY_DEFAULT}", "--workers", "2"],
        ),
        (["run", "j.toml", "--ray", "ray://head:10001"], ["run", "j.toml", "--ray", "ray://head:10001"]),
        (["run", "j.toml", "--ray", "10.0.0.5:6379"], ["run", "j.toml", "--ray", "10.0.0.5:6379"]),
        (["run", "j.toml", "--ray", "auto"], ["run", "j.toml", "--ray", "auto"]),
        (["run", "j.toml", "--ray=local"], ["run", "j.toml", "--ray=local"]),
        (["generate", "--", "--ray"], ["generate", "--", "--ray"]),
    ],
)
def test_bare_ray_flag_gets_its_default(argv, expected):
    assert fix_bare_ray_flag(argv) == expected


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
