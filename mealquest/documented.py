"""Exceptions that say what they are: each class's docstring is its message.

Each layer has one base (`StoreError` for the databases, `JobsError` for the
runner, `HouseholdError`, `OperatorError`, ...) built on these, so that
`raise StoreBusy()` carries the sentence its class documents, and the
sentence is written once, where a reader of the class finds it.
"""

from __future__ import annotations


def first_paragraph(cls: type) -> str:
    """The first paragraph of `cls`'s docstring, on one line."""
    doc = cls.__doc__ or cls.__name__
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


class DocumentedError(Exception):
    """An error whose message, unless one is given, is its class's docstring."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(first_paragraph(type(self)) if message is None else message)


class DocumentedInterrupt(BaseException):
    """What the runner throws into a handler to end it (a BaseException, like
    gevent's Timeout and GreenletExit, so that a handler's `except Exception`
    cannot swallow it); its message, unless one is given, is its docstring."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(first_paragraph(type(self)) if message is None else message)
