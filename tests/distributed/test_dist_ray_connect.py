"""Without Ray installed, --ray says how to install it; an address nothing listens at fails at once
(no cluster needed for either)."""

from __future__ import annotations

import sys

import pytest

from bulkrun.distributed.cluster import (
    INSTALL_HINT,
    RayConnectError,
    RayUnavailable,
    connect,
    import_ray,
)
from bulkrun.errors import EXIT_USAGE


def test_missing_ray_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(RayUnavailable) as info:
        import_ray()
    assert str(info.value) == INSTALL_HINT and "pip install 'bulkrun[ray]'" in INSTALL_HINT
    assert info.value.exit_code == EXIT_USAGE


def test_run_on_ray_without_ray_fails_before_any_work(monkeypatch, tmp_path):
    from bulkrun.distributed.ray_driver import run_on_ray

    monkeypatch.setitem(sys.modules, "ray", None)

    class Spec:
        ray, workers, out = "default", 2, str(tmp_path / "out")

    with pytest.raises(RayUnavailable, match=r"bulkrun\[ray\]"):
        run_on_ray(Spec())
    assert not (tmp_path / "out").exists()


class _RayThatMustNotInit:
    """A stand-in for the ray module: the probe has to refuse the address before ray.init runs."""

    @staticmethod
    def is_initialized():
        return False

    @staticmethod
    def init(**_):
        raise AssertionError("ray.init was reached for an address nothing listens at")


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_an_address_nothing_listens_at_fails_fast(monkeypatch, address):
    # port 1 refuses at once; ray.init itself would retry such an address for minutes
    monkeypatch.setitem(sys.modules, "ray", _RayThatMustNotInit)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RayConnectError, match=f"at {address}") as info:
        connect(address, None)
    assert info.value.exit_code == EXIT_USAGE


def test_a_dead_ray_address_variable_fails_fast(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", _RayThatMustNotInit)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(RayConnectError, match="RAY_ADDRESS=127.0.0.1:1"):
        connect(None, None)
