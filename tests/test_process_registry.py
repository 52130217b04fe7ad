"""Each pool enters its process in the registry of live processes, renews it
at its heartbeat's rhythm, and removes it when it stops (real pools, on both
databases)."""

from __future__ import annotations

import os
import socket

import pytest

from tests.conftest import wait_for

pytestmark = [pytest.mark.both_databases, pytest.mark.through_pgbouncer]


def live(store):
    return store.read(store.processes.live_processes, stale_after_seconds=60)


def test_a_pool_enters_its_process_renews_how_busy_it_is_and_leaves_at_stop(
    jobs, store, household, gates
):
    pool = jobs.start_pool()
    [entry] = live(store)
    assert entry.owner == pool.owner
    assert (entry.host, entry.pid) == (socket.gethostname(), os.getpid())
    assert set(entry.kinds) == set(jobs.registry.names())
    assert "wait_for_gate" in entry.kinds
    assert (entry.slots, entry.busy) == (pool.settings.workers, 0)

    jobs.enqueue("wait_for_gate", {"url": gates.url("g")}, household_id=household.household_id)
    wait_for(lambda: live(store)[0].busy == 1)
    seen = live(store)[0].last_seen_at
    wait_for(lambda: live(store)[0].last_seen_at > seen)
    gates.open("g")
    wait_for(lambda: live(store)[0].busy == 0)

    pool.stop(timeout=1)
    assert live(store) == []


def test_an_entry_removed_meanwhile_is_entered_again_at_the_next_renewal(jobs, store):
    pool = jobs.start_pool()
    store.write(store.processes.remove_process, pool.owner)
    assert live(store) == []

    wait_for(lambda: [entry.owner for entry in live(store)] == [pool.owner])
