"""Every module of the service is placed in the architecture: named by
exactly one item of the import-linter layers contract (pyproject.toml), so
that the contract checks its imports. A module in no layer would have its
imports checked by nothing; one in two, by a contract that contradicts
itself. Package `__init__` modules that hold no code are containers, and so
are those that only re-export (`mealquest.jobs`, the kind author's API):
import-linter follows every chain through them, so a module of a lower layer
that imports such a facade is still caught when the facade reaches up."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mealquest"


def _layer_items() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [layers] = [
        contract
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers"
    ]
    items = []
    for layer in layers["layers"]:
        for item in layer.replace("|", ":").split(":"):
            items.append(f"mealquest.{item.strip()}")
    return items


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _holds_code(path: Path) -> bool:
    """Whether the module does more than document itself and re-export names."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return any(not _declares(node) for node in body)


def _declares(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return True
    return isinstance(node, ast.Assign) and [
        target.id for target in node.targets if isinstance(target, ast.Name)
    ] == ["__all__"]


def test_every_module_is_in_exactly_one_layer():
    items = _layer_items()
    misplaced = {}
    for name, path in _modules().items():
        if name == "mealquest" or (path.name == "__init__.py" and not _holds_code(path)):
            continue
        covering = [item for item in items if name == item or name.startswith(item + ".")]
        if len(covering) != 1:
            misplaced[name] = covering
    assert misplaced == {}, misplaced


def test_the_kind_authors_api_loads_nothing_of_the_service_the_runner_or_the_web():
    # A kind's module imports `mealquest.jobs`; once that loaded the whole
    # service (123 modules, the pool among them), through the app factory in
    # `mealquest/__init__.py` and an import of the service in `authoring`.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; import mealquest.jobs; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('mealquest'))))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = json.loads(loaded.stdout)
    above = [
        name
        for name in modules
        if name.startswith(
            ("mealquest.jobs.runner", "mealquest.jobs.service", "mealquest.jobs.web")
        )
        or name == "mealquest.application"
    ]
    assert above == []
    assert len(modules) <= 40, modules
