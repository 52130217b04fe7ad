"""Conditional reads of a job or a batch: the `ETag`, `304`, and the long poll.

An answer's `ETag` is the version of what it shows (`"7"`). With
`If-None-Match` naming it, the answer is `304` while nothing changed; with
`wait` as well, the request is held (`hold`) until it changes or `wait`
seconds pass. What is final cannot change: its long poll is answered at
once. A held request counts with the household's streams and the process's
held requests; past either, it is answered at once, as without `wait`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from marshmallow import ValidationError

from mealquest.auth import bearer_token
from mealquest.households import digest_of_wellformed
from mealquest.jobs.errors import ProcessHoldsTooMany, TooManyStreams
from mealquest.jobs.service.live import Live
from mealquest.jobs.service.watcher import TOKEN, Credential, WatcherClosed

# Far above any list of our tags a client keeps; a longer header is refused
# rather than parsed.
IF_NONE_MATCH_MAX_LENGTH = 1000


def etag_headers(what: str) -> dict[str, dict[str, Any]]:
    """The `ETag` answer header of `what` ("job", "batch") in the document."""
    return {
        "ETag": {
            "description": (
                f'the {what}\'s version, quoted (`"7"`): send it back as `If-None-Match`'
            ),
            "required": True,
            "schema": {"type": "string", "pattern": '^"[0-9]+"$'},
        }
    }


def if_none_match_parameter(what: str, changes: str) -> dict[str, Any]:
    """The `If-None-Match` parameter of `what`, which `changes` wakes a long poll."""
    return {
        "name": "If-None-Match",
        "required": False,
        "description": (
            f"the `ETag` of the version the client has: `304` while the {what} is still at it "
            f"(with `wait`, once {changes} or the wait is over)"
        ),
        "schema": {"type": "string", "maxLength": IF_NONE_MATCH_MAX_LENGTH},
    }


def check_if_none_match() -> None:
    """Refuse an `If-None-Match` too long to be ours (ValidationError naming it)."""
    if len(request.headers.get("If-None-Match", "")) > IF_NONE_MATCH_MAX_LENGTH:
        raise ValidationError(
            {"If-None-Match": [f"must be at most {IF_NONE_MATCH_MAX_LENGTH} characters"]}
        )


def etag(version: int) -> str:
    return f'"{version}"'


def not_modified(version: int) -> bool:
    """Whether the request's `If-None-Match` names `version`."""
    tags = request.if_none_match
    return bool(tags) and tags.contains_weak(str(version))


def unchanged(app: Flask, version: int) -> Response:
    """`304`, with the version's `ETag`."""
    answer: Response = app.response_class(status=304)
    answer.headers["ETag"] = etag(version)
    return answer


def token_credential() -> Credential | None:
    """The request's token, as a watch's credential: a held request ends
    when it is revoked."""
    digest = digest_of_wellformed(bearer_token())
    return None if digest is None else Credential(TOKEN, digest)


def hold(live: Live, household_id: int, seconds: float, changed: Callable[[float], bool]) -> bool:
    """Hold a long poll while `changed(seconds)` waits; whether to read again.
    A long poll the household's or the process's held requests leave no room
    for is not held, nor one whose worker is stopping: it is answered at
    once (the client asks again)."""
    try:
        place = live.places.take(household_id)
    except (TooManyStreams, ProcessHoldsTooMany):
        return False
    try:
        return changed(min(seconds, live.max_seconds))
    except WatcherClosed:
        return False
    finally:
        live.places.release(place)
