"""Without Ray installed, --ray says how to install it (no cluster needed for this)."""

from __future__ import annotations

import sys

import pytest

from bulkrun.distributed.ray_connect import INSTALL_HINT, RayUnavailable, import_ray
from bulkrun.errors import EXIT_USAGE


def test_missing_ray_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(RayUnavailable) as info:
        import_ray()
    assert str(info.value) == INSTALL_HINT and "pip install 'bulkrun[ray]'" in INSTALL_HINT
    assert info.value.exit_code == EXIT_USAGE


def test_run_on_ray_without_ray_fails_before_any_work(monkeypatch, tmp_path):
    from bulkrun.distributed.ray_runner import run_on_ray

    monkeypatch.setitem(sys.modules, "ray", None)

    class Spec:
        ray, workers, out = "default", 2, str(tmp_path / "out")

    with pytest.raises(RayUnavailable, match=r"bulkrun\[ray\]"):
        run_on_ray(Spec())
    assert not (tmp_path / "out").exists()
