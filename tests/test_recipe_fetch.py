"""The fetcher and its address policy, called directly against a real loopback server."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import gevent
import pytest
from gevent import monkey

from mealquest.recipes.addresses import AddressPolicy, is_public
from mealquest.recipes.fetch import (
    AddressNotAllowed,
    CertificateError,
    FetchPolicy,
    HTTPStatusError,
    TooSlow,
    Unreachable,
    fetch,
    retry_after_seconds,
)
from tests.conftest import wait_for
from tests.support.pages import PageServer, Reply

# The limit is a deadline for a loaded machine, never what ends a test that
# passes: a test about the limit sets its own.
LOOPBACK_OK = FetchPolicy(addresses=AddressPolicy(allow_private=True), total_timeout_seconds=60)


@pytest.fixture
def pages() -> Iterator[PageServer]:
    server = PageServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # shared (carrier-grade NAT)
        "169.254.169.254",  # link-local: cloud metadata
        "0.0.0.0",
        "224.0.0.1",  # multicast
        "240.0.0.1",  # reserved
        "255.255.255.255",
        "192.0.2.1",  # documentation
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fec0::1",  # site-local
        "ff02::1",  # multicast
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2001:db8::1",
    ],
)
def test_non_public_addresses_are_refused(address):
    ip = ipaddress.ip_address(address)
    assert not is_public(ip)
    assert not AddressPolicy().allows(ip)
    assert AddressPolicy(allow_private=True).allows(ip)


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_are_allowed(address):
    assert AddressPolicy().allows(ipaddress.ip_address(address))


def test_allowed_networks_let_through_only_themselves():
    policy = AddressPolicy.build(False, ["10.1.2.0/24"])

    assert policy.allows(ipaddress.ip_address("10.1.2.3"))
    assert policy.allows(ipaddress.ip_address("::ffff:10.1.2.3"))
    assert not policy.allows(ipaddress.ip_address("10.1.3.1"))
    assert not policy.allows(ipaddress.ip_address("127.0.0.1"))


@pytest.mark.parametrize(
    ("value", "allowed"),
    [(True, True), (False, False), (1, True), (0, False), ("on", True), ("no", False)],
)
def test_the_private_flag_is_read_strictly(value, allowed):
    assert AddressPolicy.build(value, []).allow_private is allowed


@pytest.mark.parametrize("value", ["maybe", 2, None, "disable"])
def test_an_unreadable_private_flag_is_refused(value):
    with pytest.raises(ValueError, match="ALLOW_PRIVATE_URLS"):
        AddressPolicy.build(value, [])


def test_allowed_networks_may_be_a_comma_separated_string():
    policy = AddressPolicy.build(False, "10.1.2.0/24, 192.168.5.0/24")
    assert policy.allows(ipaddress.ip_address("192.168.5.9"))


NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("Fri, 02 Jan 2026 03:05:05 GMT", 60.0),  # a minute after NOW
        ("Thu, 01 Jan 2026 00:00:00 GMT", 0.0),  # past: at once
        ("99999999999999999999", 365 * 24 * 3600.0),  # a year at most
        (None, None),
        ("", None),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("\uff11\uff12", None),  # full-width digits are not seconds
        ("Fri, 02 Jan 2026 03:05:05", None),  # no zone: not an HTTP date
        ("x" * 10_000, None),
    ],
)
def test_a_retry_after_header_is_read_as_seconds_or_an_http_date(value, seconds):
    assert retry_after_seconds(value, now=lambda: NOW) == seconds


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_answer_says_when_to_come_back_and_nothing_else_of_the_server(pages, status):
    secret_header = f"120, {SECRET_TEXT}"
    pages.add(
        "/one", Reply(status=status, headers={"Retry-After": "120"}, body=SECRET_TEXT.encode())
    )
    pages.add("/two", Reply(status=status, headers={"Retry-After": secret_header}))

    with pytest.raises(HTTPStatusError) as told:
        fetch(pages.url("/one"), LOOPBACK_OK)
    assert (told.value.status, told.value.retry_after_seconds) == (status, 120.0)
    assert str(told.value) == f"the page could not be fetched (HTTP {status})"
    with pytest.raises(HTTPStatusError) as unreadable:
        fetch(pages.url("/two"), LOOPBACK_OK)
    assert unreadable.value.retry_after_seconds is None
    assert SECRET_TEXT not in str(unreadable.value)
    # Another status's Retry-After is no say of when to come back.
    pages.add("/gone", Reply(status=404, headers={"Retry-After": "5"}))
    with pytest.raises(HTTPStatusError) as gone:
        fetch(pages.url("/gone"), LOOPBACK_OK)
    assert gone.value.retry_after_seconds is None


SECRET_TEXT = "token=sk_live_from_the_server"


def test_the_request_names_the_host_and_the_service(pages):
    pages.page("/page", b"<html></html>")

    page = fetch(pages.url("/page?q=1", host="localhost"), LOOPBACK_OK)

    assert page.body == b"<html></html>"
    request = pages.requests[0]
    assert request["host"] == f"localhost:{pages.port}"
    assert request["user-agent"].startswith("MealQuest")


def test_refused_before_any_connection(pages):
    pages.page("/page", b"<html></html>")

    with pytest.raises(AddressNotAllowed):
        fetch(pages.url("/page"), FetchPolicy())
    assert pages.total_hits == 0


def test_a_fetch_lets_other_greenlets_run_in_an_unpatched_process(pages):
    """The tests' process is not monkey-patched: only gevent's own sockets keep the hub free."""
    assert not monkey.is_module_patched("socket")
    release = threading.Event()
    pages.add("/slow", Reply(body=b"<html>late</html>", stall_after=3, stall=release))
    ticks = []

    def tick() -> None:
        while True:
            ticks.append(1)
            gevent.sleep(0.005)

    ticker = gevent.spawn(tick)
    fetcher = gevent.spawn(fetch, pages.url("/slow"), LOOPBACK_OK)
    try:
        wait_for(lambda: pages.hits["/slow"] == 1)
        seen = len(ticks)
        wait_for(lambda: len(ticks) > seen + 20)  # the hub runs while the fetch waits
        assert not fetcher.dead
        release.set()
        assert fetcher.get(timeout=60).body == b"<html>late</html>"
    finally:
        ticker.kill()


def test_the_total_limit_covers_a_body_that_trickles(pages):
    pages.add("/stalled", Reply(body=b"<html>never</html>", stall_after=5))

    with pytest.raises(TooSlow) as raised:
        fetch(pages.url("/stalled"), FetchPolicy(AddressPolicy(True), total_timeout_seconds=0.2))
    assert str(raised.value) == "the page took too long to answer"


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, list[str]]]:
    """A TLS server with a self-signed certificate; records the SNI names it is sent."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names: list[str] = []
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with context.wrap_socket(conn, server_side=True):
                pass
        except OSError:
            pass  # the client refuses the certificate mid-handshake: expected

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], names
    listener.close()
    thread.join(timeout=5)


def test_https_checks_the_certificate_of_the_name(tls_server):
    port, names = tls_server

    with pytest.raises(CertificateError):
        fetch(f"https://localhost:{port}/", LOOPBACK_OK)
    assert names == ["localhost"]  # SNI carries the name, the socket went to 127.0.0.1


def test_a_page_that_cannot_be_reached_says_why_in_safe_words(pages):
    closed = PageServer().start()
    closed.stop()  # nothing listens there now: the connection is refused
    with pytest.raises(Unreachable) as refused:
        fetch(closed.url("/recipe"), LOOPBACK_OK)
    assert refused.value.message == (
        "the page could not be fetched (the site refused the connection)"
    )
    with pytest.raises(HTTPStatusError) as missing:
        fetch(pages.url("/nowhere"), LOOPBACK_OK)
    assert missing.value.message == "the page was not found (HTTP 404)"


def test_a_refused_address_names_the_setting_to_the_operator_only(pages):
    with pytest.raises(AddressNotAllowed) as refused:
        fetch(pages.url("/nowhere"), FetchPolicy())
    assert refused.value.message == "that address is not allowed"
    assert "MEALQUEST_ALLOW_PRIVATE_URLS=true" in refused.value.detail
