"""Which network addresses a fetch may connect to.

A household names the URL, so without this check it could make the service
read its own metadata endpoint (169.254.169.254), an admin port on loopback or
anything else on the private network. The check is made on every address a
name resolves to, after resolution, so every spelling of an address (decimal,
hex, IPv4-mapped IPv6, a name pointing at 127.0.0.1) is judged by what it is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64).
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4 or NAT64 address leads to, if it is one."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in network for network in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    """True for a globally routable unicast address; False for private,
    loopback, link-local, multicast, reserved, unspecified and shared ones."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            # The socket reaches the IPv4 address itself: judge that.
            return is_public(ip.ipv4_mapped)
        inner = _embedded_ipv4(ip)
        if inner is not None and not is_public(inner):
            return False
        if ip.is_site_local:
            return False
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def parse_address(text: str) -> IPAddress:
    """An address as `getaddrinfo` gives it (an IPv6 scope id is dropped)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("ALLOW_PRIVATE_URLS must be true or false")


@dataclass(frozen=True)
class AddressPolicy:
    """`allow_private` lifts the check (development, tests serving pages on
    loopback); `allowed_networks` lets through chosen private networks only."""

    allow_private: bool = False
    allowed_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def build(cls, allow_private: object, allowed_networks: Iterable[str] | str) -> AddressPolicy:
        """From configuration values, refusing any it cannot read exactly: a
        misread `ALLOW_PRIVATE_URLS` would open the private network."""
        if isinstance(allowed_networks, str):
            allowed_networks = [part for part in allowed_networks.split(",") if part.strip()]
        networks = tuple(
            ipaddress.ip_network(text.strip(), strict=False) for text in allowed_networks
        )
        return cls(_flag(allow_private), networks)

    def allows(self, ip: IPAddress) -> bool:
        if self.allow_private:
            return True
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip.version == net.version and ip in net for net in self.allowed_networks):
            return True
        return is_public(ip)
