"""Every driver provides every statement of the contract, with its signature.

The type checker holds each driver module to its `Protocol`; this holds the
running code to it too, so a statement one driver lacks, or takes other
arguments for, fails here on either database.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

from mealquest.db import driver
from mealquest.db.postgresql.store import PostgresStore
from mealquest.db.sqlite.store import SqliteStore

# The statement sets of the contract, and the store attribute each is found at.
SETS = {
    "jobs": driver.JobStatements,
    "households": driver.HouseholdStatements,
    "recipes": driver.RecipeStatements,
    "periodic": driver.PeriodicStatements,
    "retention": driver.RetentionStatements,
    "operators": driver.OperatorStatements,
    "sessions": driver.SessionStatements,
    "operations": driver.OperationStatements,
    "flow": driver.FlowStatements,
    "processes": driver.ProcessStatements,
    "streams": driver.StreamStatements,
    "audit": driver.AuditStatements,
    "history": driver.HistoryStatements,
    "batches": driver.BatchStatements,
    "signals": driver.SignalStatements,
}
STORES = {"sqlite": SqliteStore, "postgresql": PostgresStore}


def members(protocol: type) -> dict[str, inspect.Signature]:
    names = [
        name
        for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("_")
    ]
    return {name: inspect.signature(getattr(protocol, name)) for name in names}


def test_every_statement_set_of_the_store_is_checked_here():
    properties = {name for name, value in vars(driver.Store).items() if isinstance(value, property)}
    assert properties - {"broken"} == set(SETS)


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("set_name", SETS)
def test_the_driver_provides_every_statement_with_its_signature(store_name, set_name):
    module = getattr(STORES[store_name], set_name)
    assert isinstance(module, ModuleType)
    for name, wanted in members(SETS[set_name]).items():
        function = getattr(module, name, None)
        assert callable(function), f"{module.__name__} has no {name}"
        assert_signature_fits(f"{module.__name__}.{name}", inspect.signature(function), wanted)


def assert_signature_fits(where: str, got: inspect.Signature, wanted: inspect.Signature) -> None:
    """`got` takes every call `wanted` describes, and the same types: its
    positional parameters in the same order, its keyword-only ones by the
    same names, the same defaults, and nothing more that a call must give."""
    wanted_params = [p for p in wanted.parameters.values() if p.name != "self"]
    got_params = list(got.parameters.values())
    positional = [p for p in wanted_params if p.kind is p.POSITIONAL_ONLY]
    keywords = {p.name: p for p in wanted_params if p.kind is p.KEYWORD_ONLY}
    got_positional = [
        p for p in got_params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    assert len(got_positional) >= len(positional), f"{where}: too few positional parameters"
    for mine, theirs in zip(got_positional, positional, strict=False):
        assert mine.annotation == theirs.annotation, f"{where}: {mine.name}'s type"
        assert mine.default == theirs.default, f"{where}: {mine.name}'s default"
    for extra in got_positional[len(positional) :]:
        assert extra.name in keywords or extra.default is not extra.empty, (
            f"{where}: {extra.name} is not in the contract"
        )
    by_name = {p.name: p for p in got_params}
    for name, theirs in keywords.items():
        mine = by_name.get(name)
        assert mine is not None, f"{where}: no {name}="
        assert mine.kind is not mine.POSITIONAL_ONLY, f"{where}: {name} is positional only"
        assert mine.annotation == theirs.annotation, f"{where}: {name}'s type"
        assert mine.default == theirs.default, f"{where}: {name}'s default"
    for mine in got_params:
        if mine.name not in keywords and mine not in got_positional:
            assert mine.default is not mine.empty, f"{where}: {mine.name} is not in the contract"
    assert got.return_annotation == wanted.return_annotation, f"{where}: its result's type"
