"""Fetching a page a household named, without letting it reach what it should not.

The rules, and why each one:

* only `http` and `https`;
* the host is resolved once per hop with gevent's resolver, **every** address
  it resolves to is checked (`addresses.AddressPolicy`), and the TCP
  connection goes to one of those checked addresses: a second DNS answer
  (DNS rebinding) never gets a say. The name is still used for the `Host`
  header, TLS SNI and the certificate check;
* redirects are followed here, at most `max_redirects`, each hop checked
  like the first;
* a connect timeout per address, and one total deadline (`gevent.Timeout`)
  over resolution, every hop and the whole body;
* the body is read in chunks and abandoned as soon as it passes `max_bytes`.

Sockets come from `gevent.socket` and `gevent.ssl` explicitly, so the fetch
is cooperative whether or not the process is monkey-patched (gunicorn's
workers are, `flask jobs work` and the tests are not).

Errors are `FetchError`s whose message is safe to show the household: none
quotes the URL (which may carry a token) or anything the server sent. A
`429` or `503` answer also says when the server asked to be asked again
(`HTTPStatusError.retry_after_seconds`, from its `Retry-After`): a number,
never the header's text.
"""

from __future__ import annotations

import email.utils
import http.client
import math
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import gevent
import gevent.socket
import gevent.ssl

from mealquest.recipes.addresses import AddressPolicy, parse_address

USER_AGENT = "MealQuest-RecipeImport/0.1 (fetches a recipe page a household asked to import)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Answers whose `Retry-After` says when to come back: too many requests, or
# the server unavailable for now.
RETRY_AFTER_STATUSES = frozenset({429, 503})
# The longest `Retry-After` read (a year): anything longer is as good as never.
_MAX_RETRY_AFTER_SECONDS = 365 * 24 * 3600.0


class FetchError(Exception):
    """The page could not be fetched; the message is safe to show. `detail`
    is for operators (the log, `flask jobs show`): the cause, and the
    setting that decides it where one does; never the page's address."""

    transient = False

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message


class AddressNotAllowed(FetchError):
    def __init__(self) -> None:
        super().__init__(
            "that address is not allowed",
            "the host resolves to a private, loopback or reserved address, which is refused "
            "unless MEALQUEST_ALLOW_PRIVATE_URLS=true (or the address is in "
            "MEALQUEST_RECIPE_FETCH_ALLOWED_NETWORKS)",
        )


class HTTPStatusError(FetchError):
    def __init__(self, status: int, retry_after_seconds: float | None = None) -> None:
        super().__init__(
            f"the page was not found (HTTP {status})"
            if status in (404, 410)
            else f"the page could not be fetched (HTTP {status})",
            f"the site answered HTTP {status}",
        )
        self.status = status
        # A server error may pass; a 4xx says this request will never work.
        self.transient = status >= 500
        # When the server asked to be asked again (429 and 503 only), in
        # seconds from its answer; None when it did not say, or not readably.
        self.retry_after_seconds = retry_after_seconds


def retry_after_seconds(
    value: str | None, now: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> float | None:
    """A `Retry-After` header's delay in seconds: a whole number of seconds,
    or an HTTP date (judged by this host's clock: the difference is what
    matters, and a server's clock is no better); a date past is 0. None for
    a missing or unreadable value."""
    if value is None:
        return None
    text = value.strip()
    if text.isdecimal() and text.isascii():
        return min(float(text), _MAX_RETRY_AFTER_SECONDS)
    if len(text) > 64:
        return None
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment is None or moment.tzinfo is None:
        return None
    seconds = (moment - now()).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_SECONDS)


class TooSlow(FetchError):
    transient = True

    def __init__(self) -> None:
        super().__init__(
            "the page took too long to answer",
            "no answer within MEALQUEST_RECIPE_FETCH_TIMEOUT_SECONDS (or the connect timeout, "
            "MEALQUEST_RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS)",
        )


class Unreachable(FetchError):
    """Resolution failed, the connection was refused or reset, or the body was
    cut short: `reason` says which, in words a household may read."""

    transient = True

    def __init__(self, reason: str) -> None:
        super().__init__(f"the page could not be fetched ({reason})", reason)


# Why a site could not be reached, as `Unreachable` says it.
NAME_NOT_FOUND = "its site's name was not found"
REFUSED = "the site refused the connection"
CUT = "the connection was cut"
NO_ROUTE = "the site could not be reached"


class TooLarge(FetchError):
    def __init__(self) -> None:
        super().__init__("the page is too large")


class TooManyRedirects(FetchError):
    def __init__(self) -> None:
        super().__init__("the page redirected too many times")


class BadResponse(FetchError):
    def __init__(self) -> None:
        super().__init__("the page could not be fetched (the server's answer was not valid HTTP)")


class CertificateError(FetchError):
    def __init__(self) -> None:
        super().__init__("the page could not be fetched (its certificate is not valid)")


@dataclass(frozen=True)
class FetchPolicy:
    addresses: AddressPolicy = field(default_factory=AddressPolicy)
    connect_timeout_seconds: float = 5.0
    total_timeout_seconds: float = 20.0
    max_bytes: int = 4 * 1024 * 1024
    max_redirects: int = 5
    user_agent: str = USER_AGENT

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FetchPolicy:
        return cls(
            addresses=AddressPolicy.build(
                config["ALLOW_PRIVATE_URLS"], config["RECIPE_FETCH_ALLOWED_NETWORKS"]
            ),
            connect_timeout_seconds=float(config["RECIPE_FETCH_CONNECT_TIMEOUT_SECONDS"]),
            total_timeout_seconds=float(config["RECIPE_FETCH_TIMEOUT_SECONDS"]),
            max_bytes=int(config["RECIPE_FETCH_MAX_BYTES"]),
            max_redirects=int(config["RECIPE_FETCH_MAX_REDIRECTS"]),
        )


@dataclass(frozen=True)
class Page:
    url: str
    """The address the body came from (after redirects)."""
    content_type: str | None
    body: bytes


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str


def _target(url: str) -> _Target:
    """Split a URL into what a request needs; anything but http(s) is not allowed."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise AddressNotAllowed() from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise AddressNotAllowed()
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in path):
        raise AddressNotAllowed()
    # The request line is ASCII: percent-encode what is not (an IRI such as
    # `/soupe-à-l-oignon`, or a raw UTF-8 `Location`), leaving escapes and
    # reserved characters as they are.
    path = quote(path, safe="/%:@!$&'()*+,;=-._~?")
    return _Target(scheme, parts.hostname, port or _DEFAULT_PORTS[scheme], path)


def _resolve(target: _Target, policy: AddressPolicy) -> list[tuple[int, tuple[Any, ...]]]:
    """Every (family, sockaddr) the host resolves to; refuses the lot if any is not allowed.

    One refused address refuses the host: connecting only to the allowed ones
    would still let a name that also points inside be probed.
    """
    try:
        infos = gevent.socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError):
        raise Unreachable(NAME_NOT_FOUND) from None
    resolved: list[tuple[int, tuple[Any, ...]]] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            ip = parse_address(str(sockaddr[0]))
        except ValueError:
            raise AddressNotAllowed() from None
        if not policy.allows(ip):
            raise AddressNotAllowed()
        if (family, sockaddr) not in resolved:
            resolved.append((family, sockaddr))
    if not resolved:
        raise Unreachable(NAME_NOT_FOUND)
    return resolved


def _connect(addresses: Iterable[tuple[int, tuple[Any, ...]]], timeout: float) -> socket.socket:
    """A TCP connection to the first checked address that answers."""
    last_error: OSError | None = None
    for family, sockaddr in addresses:
        sock = gevent.socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as error:
            sock.close()
            last_error = error
            continue
        return sock
    raise last_error or OSError("no address to connect to")


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection whose socket goes to an address checked beforehand.

    `host` stays the name (Host header, SNI, certificate check); `connect`
    never resolves it again.
    """

    def __init__(
        self,
        target: _Target,
        addresses: list[tuple[int, tuple[Any, ...]]],
        *,
        connect_timeout: float,
        read_timeout: float,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(target.host, target.port, timeout=read_timeout)
        self.default_port = _DEFAULT_PORTS[target.scheme]
        self._addresses = addresses
        self._connect_timeout = connect_timeout
        self._tls = tls

    def connect(self) -> None:
        sock = _connect(self._addresses, self._connect_timeout)
        sock.settimeout(self.timeout)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        self.sock = sock


def _tls_context() -> ssl.SSLContext:
    # gevent.ssl.create_default_context() hands back the stdlib class in an
    # unpatched process; gevent's own SSLContext makes gevent sockets.
    context = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_default_certs()
    return context


def fetch(url: str, policy: FetchPolicy) -> Page:
    """GET `url` under `policy`; raises a `FetchError` (safe message) on any failure."""
    timer = gevent.Timeout(policy.total_timeout_seconds)
    timer.start()
    try:
        return _follow(url, policy)
    except gevent.Timeout as timeout:
        if timeout is not timer:
            raise
        raise TooSlow() from None
    finally:
        timer.close()


def _follow(url: str, policy: FetchPolicy) -> Page:
    for _hop in range(policy.max_redirects + 1):
        target = _target(url)
        addresses = _resolve(target, policy.addresses)
        try:
            outcome = _request(target, addresses, policy)
        except FetchError:
            raise
        except ssl.SSLCertVerificationError:
            raise CertificateError() from None
        except TimeoutError:
            raise TooSlow() from None
        except ConnectionRefusedError:
            raise Unreachable(REFUSED) from None
        except (ConnectionError, http.client.IncompleteRead):  # reset, aborted, cut short
            raise Unreachable(CUT) from None
        except OSError:
            raise Unreachable(NO_ROUTE) from None
        except (http.client.HTTPException, UnicodeError, ValueError):
            raise BadResponse() from None
        if isinstance(outcome, Page):
            return Page(url, outcome.content_type, outcome.body)
        url = urljoin(url, outcome)
    raise TooManyRedirects()


def _request(
    target: _Target, addresses: list[tuple[int, tuple[Any, ...]]], policy: FetchPolicy
) -> Page | str:
    """One GET: the page, or the Location of a redirect."""
    connection = _PinnedConnection(
        target,
        addresses,
        connect_timeout=policy.connect_timeout_seconds,
        read_timeout=policy.total_timeout_seconds,
        tls=_tls_context() if target.scheme == "https" else None,
    )
    try:
        connection.request(
            "GET",
            target.path,
            headers={
                "User-Agent": policy.user_agent,
                "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.1",
                "Accept-Encoding": "identity",
                "Connection": "close",
            },
        )
        response = connection.getresponse()
        if response.status in _REDIRECTS:
            location = response.getheader("Location")
            if not location:
                raise HTTPStatusError(response.status)
            return location.strip()
        if response.status in RETRY_AFTER_STATUSES:
            raise HTTPStatusError(
                response.status, retry_after_seconds(response.getheader("Retry-After"))
            )
        if not 200 <= response.status < 300:
            raise HTTPStatusError(response.status)
        body = _read_capped(response, policy.max_bytes)
        return Page("", response.getheader("Content-Type"), body)
    finally:
        connection.close()


def _read_capped(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    declared = response.getheader("Content-Length", "")
    if declared.strip().isdigit() and int(declared) > max_bytes:
        raise TooLarge()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read(min(_CHUNK, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge()
        chunks.append(chunk)
