"""The real job layer door (bulkrun.distributed.ray_worker), with every finished item slowed down.

Tests that kill a worker or the driver mid-job use it (run_on_ray(spec, runner="helpers.slow_joblayer")) so
that "mid-job" holds on any machine: a slice lasts seconds however fast the engine is. Results are
unchanged: only the pace differs.
"""

from __future__ import annotations

import time

from bulkrun.distributed import ray_worker as joblayer

ITEM_DELAY_S = 0.1

build_engine = joblayer.build_engine
driver_session = joblayer.driver_session


def run_slice(spec, partition, engine, on_progress):
    calls = [0]

    def slowed(items: int, tokens: int) -> None:
        if calls[0]:  # the first call reports the rows already committed; then one per item
            time.sleep(ITEM_DELAY_S)
        calls[0] += 1
        on_progress(items, tokens)

    return joblayer.run_slice(spec, partition, engine, slowed)
