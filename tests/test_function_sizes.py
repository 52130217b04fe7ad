"""No function of the service is longer than a reader can hold at once: 80
lines at most, and 60 in the drivers' claims, whose parts each build one
part of the statement. A longer one is a sign that two things share it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mealquest"
MOST_LINES = 80
MOST_LINES_IN_CLAIMS = 60


def _functions(path: Path) -> list[tuple[str, int]]:
    return [
        (
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}",
            node.end_lineno - node.lineno + 1,
        )
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    ]


def test_no_function_is_longer_than_a_reader_can_hold():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        most = MOST_LINES_IN_CLAIMS if path.name == "claim.py" else MOST_LINES
        long.update({name: lines for name, lines in _functions(path) if lines > most})
    assert long == {}


def test_each_driver_has_its_claim_in_a_module_of_its_own():
    for driver in ("sqlite", "postgresql"):
        names = {name.split()[-1] for name, _ in _functions(PACKAGE / "db" / driver / "claim.py")}
        assert {"claim", "has_due_job"} <= names
