"""The monitoring files shipped in deploy/: the Prometheus alerting rules
(valid to `promtool check rules`, and firing as `promtool test rules`
says they should) and the Grafana dashboard; every query of either names
only metrics the service exports, as a real scrape of `/metrics` lists them.

promtool is Debian's `prometheus` package, which `scripts/test` installs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mealquest.operators import create_operator

pytestmark = pytest.mark.sqlite_only(
    "the shipped rules and dashboard name the same metrics whatever the database"
)

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "mealquest.json"

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?=\s*(\(?))")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_KEYWORDS |= {"group_left", "group_right"}
_LABEL_VALUES = re.compile(r"^label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*\w+\s*\)$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers, less what
    is inside strings, label matchers, ranges and grouping clauses, less the
    functions (an identifier before a parenthesis) and the keywords."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    return {
        match.group(0)
        for match in _IDENTIFIER.finditer(text)
        if not match.group(1) and match.group(0) not in _KEYWORDS
    }


def test_metric_names_reads_what_a_query_names():
    assert metric_names(
        'sum by (le, kind) (rate(mealquest_job_wait_seconds_bucket{kind=~"$kind"}[5m])) '
        "/ on (kind) group_left max(mealquest_jobs) > bool 0.5 unless up"
    ) == {"mealquest_job_wait_seconds_bucket", "mealquest_jobs", "up"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing: `scripts/test` installs Debian's prometheus package"
        if os.environ.get("CI"):
            raise AssertionError(message)
        pytest.skip(message)
    return found


def alert_expressions() -> dict[str, str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def dashboard_queries() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = {
        f"{panel['title']} {target['refId']}": target["expr"]
        for panel in dashboard["panels"]
        for target in panel["targets"]
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            match = _LABEL_VALUES.match(query)
            assert match, f"variable {variable['name']}: not label_values(metric, label)"
            queries[f"${variable['name']}"] = match.group(1)
    return queries


@pytest.fixture
def exported(app, client, store):
    """Every series name a scrape of this service can carry (from its TYPE
    lines: a histogram's buckets, sum and count; a counter's total)."""
    operator = create_operator(store, "Prometheus")
    answer = client.get("/metrics", headers={"Authorization": f"Bearer {operator.token}"})
    assert answer.status_code == 200
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", answer.get_data(as_text=True), re.M):
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    assert "mealquest_job_wait_seconds_bucket" in names
    assert "mealquest_job_runs_total" in names
    return names


def test_the_alerts_and_the_dashboard_name_only_metrics_the_service_exports(exported):
    queries = {**alert_expressions(), **dashboard_queries()}
    assert len(alert_expressions()) >= 4
    for where, expr in queries.items():
        names = metric_names(expr)
        assert names, f"{where}: names no metric"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"
    # Every metric the service exports is watched somewhere.
    watched = set().union(*(metric_names(expr) for expr in queries.values()))
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in exported}
    assert {re.sub(r"_(bucket|sum|count)$", "", name) for name in watched} == families


def test_the_alerting_rules_are_valid_and_fire_as_their_tests_say():
    tool = promtool()
    checked = subprocess.run(
        [tool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a test that makes it fire.
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == set(alert_expressions())


def test_the_dashboards_queries_are_valid_promql(tmp_path):
    tool = promtool()
    # Each query as a recording rule, with Grafana's variables as a query would have them.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:query_{index}",
                        "expr": expr.replace("$__rate_interval", "5m").replace("$kind", ".*"),
                    }
                    for index, expr in enumerate(dashboard_queries().values())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"]
    assert dashboard["panels"]
    assert all(panel["targets"] for panel in dashboard["panels"])
