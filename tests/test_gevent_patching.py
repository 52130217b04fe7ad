"""gevent's monkey-patching with the installed distributions read once.

Each probe runs in a fresh interpreter: patching cannot be undone, and the
test process itself is not patched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO

pytestmark = pytest.mark.sqlite_only("a process's start; no database is opened")

# Counts the readings of the installed distributions that `patch` makes,
# then says what the process ended with.
_COUNTING_PROBE = """
import json, sys
from importlib import metadata

readings = 0
_distributions = metadata.distributions

def distributions(**params):
    global readings
    readings += 1
    return _distributions(**params)

metadata.distributions = distributions
original = metadata.entry_points
{patch}
from gevent import monkey
print(json.dumps({{
    "readings": readings,
    "patched": monkey.is_module_patched("socket") and monkey.is_module_patched("threading"),
    "entry_points_restored": metadata.entry_points is original,
}}))
"""


def _probe(code: str, *args: str, cwd: Path = REPO) -> dict:
    completed = subprocess.run(
        [sys.executable, *args] if args else [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_gevents_own_patching_reads_every_distribution_at_each_plugin_lookup():
    # What the module is for: gevent's `patch_all` looks its plugins up at
    # each of its events, each a reading of every installed distribution.
    found = _probe(_COUNTING_PROBE.format(patch="from gevent import monkey; monkey.patch_all()"))
    assert found["patched"] is True
    assert found["readings"] > 10


def test_patch_all_reads_the_distributions_once_and_gives_entry_points_back():
    found = _probe(
        _COUNTING_PROBE.format(
            patch="from mealquest import gevent_patching; gevent_patching.patch_all()"
        )
    )
    assert found == {"readings": 1, "patched": True, "entry_points_restored": True}


def test_a_lookup_inside_finds_what_the_standard_library_finds():
    from importlib import metadata

    from mealquest.gevent_patching import entry_points_read_once

    # gevent's own plugin (its signal subscriber) is in one of its groups.
    groups = ("console_scripts", "gevent.plugins.monkey.will_patch_all")
    outside = {group: sorted(metadata.entry_points(group=group)) for group in groups}
    with entry_points_read_once():
        inside = {group: sorted(metadata.entry_points(group=group)) for group in groups}
    assert inside == outside
    assert [point.value for point in inside[groups[1]]] == ["gevent.monkey:_subscribe_signal_os"]
    assert "flask" in {point.name for point in inside["console_scripts"]}


def test_the_launcher_runs_a_module_patched_with_its_arguments(tmp_path):
    (tmp_path / "probe_module.py").write_text(
        "import json, sys\n"
        "from gevent import monkey\n"
        "print(json.dumps({'patched': monkey.is_module_patched('socket'),"
        " 'arguments': sys.argv[1:], 'name': __name__}))\n"
    )
    found = _probe(
        "", "-m", "mealquest.gevent_patching", "probe_module", "jobs", "--flag", cwd=tmp_path
    )
    assert found == {"patched": True, "arguments": ["jobs", "--flag"], "name": "__main__"}


def test_the_launcher_without_a_module_says_how_to_call_it():
    completed = subprocess.run(
        [sys.executable, "-m", "mealquest.gevent_patching"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert completed.returncode == 1
    assert completed.stderr.strip() == "usage: python -m mealquest.gevent_patching MODULE [ARGS]"
