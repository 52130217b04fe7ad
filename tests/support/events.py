"""A client of a job's event stream for the tests: one connection, read line by
line with a deadline per read, the events parsed as server-sent events are."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPResponse, HTTPSConnection
from typing import Any

from tests.support import tls


@dataclass(frozen=True)
class Event:
    """One event as a browser's EventSource sees it; a comment has `name` None."""

    name: str | None
    data: str = ""
    id: str | None = None
    comment: str | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.data)


class Closed(Exception):
    """The server ended the stream."""


class EventStream:
    """`GET url` with the token; `status` and `headers` at once, then `next()`."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        match = re.fullmatch(r"(https?)://([^/:]+):(\d+)(/.*)", url)
        assert match, url
        scheme, host, port, path = match.groups()
        self.conn = (
            HTTPSConnection(host, int(port), timeout=timeout, context=tls.client_context())
            if scheme == "https"
            else HTTPConnection(host, int(port), timeout=timeout)
        )
        sent = dict(headers or {})
        if token:
            sent["Authorization"] = f"Bearer {token}"
        self.conn.request("GET", path, headers=sent)
        self.response: HTTPResponse = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {key.lower(): value for key, value in self.response.getheaders()}

    def body(self) -> bytes:
        return self.response.read()

    def next(self, *, comments: bool = False) -> Event:
        """The next event (a comment too, with `comments`); `Closed` when the
        stream ended, `TimeoutError` when nothing came within the timeout."""
        fields: dict[str, str] = {}
        data: list[str] = []
        while True:
            line = self.response.readline()
            if not line:
                raise Closed()
            text = line.decode().rstrip("\r\n")
            if text == "":
                if fields or data:
                    return Event(fields.get("event", "message"), "\n".join(data), fields.get("id"))
                continue
            if text.startswith(":"):
                if comments:
                    return Event(None, comment=text[1:].strip())
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                fields[name] = value

    def events_until_closed(self, *, comments: bool = False) -> list[Event]:
        found = []
        while True:
            try:
                found.append(self.next(comments=comments))
            except Closed:
                return found

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
