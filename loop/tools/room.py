"""Where the http tools may connect (DESIGN.md §19, "Rooms"): not the loop's own site, not what
the operator denies, and not this host unless the operator lists the receiver.

Decided on the address a connection is made to, when it is made: `connect` (which the http
tools' connections use instead of `socket.create_connection`) resolves the host name once,
judges each address, and connects the socket to an address that passed — never to the name
again, so a name that resolves elsewhere a moment later (DNS rebinding) reaches nothing that was
not judged. A plan's URL is judged when it is written too, as far as its name and a literal
address tell (`problem`): a name's addresses are known only when it is resolved.

For a host name, one of its addresses and the port, in this order:

1. the site, LOOP_SITE_ADDRESSES (`host:port`, where daphne listens; `0.0.0.0` or `::` stands for
   every address of this host): refused, whatever else is listed;
2. LOOP_HTTP_DENY (CIDRs, addresses and host names, `.example.com` for a domain and every name
   below it, each with an optional `:port`): refused;
3. LOOP_HTTP_ALLOW (the same forms): allowed — the receivers the operator runs on this host;
4. this host (a loopback or unspecified address, or an address of one of its interfaces) and
   the names and addresses in ALLOWED_HOSTS (the site under the names it answers to, behind a
   proxy on any port): refused;
5. anything else: allowed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.http.request import validate_host

from .. import numbers
from .base import ToolError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAME = re.compile(r"\.?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?")
_DEFAULT_TIMEOUT: Any = socket._GLOBAL_DEFAULT_TIMEOUT  # type: ignore[attr-defined]


class Refused(ToolError):
    """The http tools may not connect there; the message names the address, port and rule."""


@dataclass(frozen=True)
class Entry:
    """One entry of LOOP_HTTP_DENY, LOOP_HTTP_ALLOW or LOOP_SITE_ADDRESSES: a network (an
    address is one of a single address) or a host name, and a port or any."""

    text: str
    network: Network | None = None
    name: str | None = None  # lower case; ".example.com": the domain and every name below it
    port: int | None = None

    def names(self, host: str) -> bool:
        if self.name is None:
            return False
        if self.name.startswith("."):
            return host == self.name[1:] or host.endswith(self.name)
        return host == self.name

    def covers(self, host: str, address: Address | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.names(host):
            return True
        return address is not None and self.network is not None and address in self.network


def _host(text: str) -> str:
    return text.strip().strip("[]").rstrip(".").lower()


def _address(text: str) -> Address | None:
    try:
        found = ipaddress.ip_address(_host(text).split("%")[0])
    except ValueError:
        return None
    if isinstance(found, ipaddress.IPv6Address) and found.ipv4_mapped is not None:
        return found.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return found


def parse(entry: str, *, port_required: bool = False) -> Entry:
    """One entry; ValueError naming it unless it reads as a CIDR, an address or a host name
    with an optional `:port` (an IPv6 address with a port in brackets: `[::1]:8000`)."""
    text = entry.strip()
    host, port = text, None
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r}: an IPv6 address in brackets, then an optional :port")
        host, port = inside, rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    if port is not None:
        try:
            number = numbers.whole(port, "port", low=1, high=65535)
        except numbers.NotANumber as exc:
            raise ValueError(f"{entry!r}: {exc}") from None
    elif port_required:
        raise ValueError(f"{entry!r}: give the address and its port, host:port")
    else:
        number = None
    if "/" in host:
        try:
            return Entry(text, network=ipaddress.ip_network(host, strict=False), port=number)
        except ValueError:
            raise ValueError(f"{entry!r}: not a network (CIDR, such as 10.0.0.0/8)") from None
    address = _address(host)
    if address is not None:
        return Entry(text, network=ipaddress.ip_network(address), port=number)
    name = _host(host)
    if not name or not _NAME.fullmatch(name):
        raise ValueError(f"{entry!r}: not an address, a network or a host name")
    return Entry(text, name=name, port=number)


def parse_all(entries: Iterable[str], *, port_required: bool = False) -> tuple[Entry, ...]:
    return tuple(parse(entry, port_required=port_required) for entry in entries)


@lru_cache(maxsize=32)
def _entries(entries: tuple[str, ...], port_required: bool = False) -> tuple[Entry, ...]:
    return parse_all(entries, port_required=port_required)


def own(address: Address) -> bool:
    """Whether `address` is this host's: loopback, unspecified (0.0.0.0 and :: reach this host),
    or an address one of its interfaces has (a socket can be bound to it)."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
    except OSError:
        return False
    return True


def _site(host: str, address: Address | None, port: int) -> str | None:
    for entry in _entries(tuple(settings.LOOP_SITE_ADDRESSES), True):
        if entry.port != port:
            continue
        wildcard = entry.network is not None and entry.network.network_address.is_unspecified
        if entry.covers(host, address, port) or (wildcard and address is not None and own(address)):
            return f"port {port} of {address or host} is the loop's own site (LOOP_SITE_ADDRESSES)"
        if entry.name and address is not None and address in _resolved(entry.name, port):
            return f"port {port} of {address} is the loop's own site (LOOP_SITE_ADDRESSES)"
    return None


def _resolved(name: str, port: int) -> set[Address]:
    try:
        infos = socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM)
    except OSError:
        return set()
    return {a for info in infos if (a := _address(str(info[4][0]))) is not None}


def _allowed_hosts(host: str, address: Address | None) -> bool:
    """Whether the URL names the site as it answers (ALLOWED_HOSTS, Django's matching; `*`
    names everything, so it names nothing here)."""
    patterns = [p for p in settings.ALLOWED_HOSTS if p != "*"]
    shown = f"[{host}]" if ":" in host else host
    if validate_host(shown, patterns):
        return True
    if address is None:
        return False
    return any(_address(p) == address for p in patterns)


def refusal(host: str, address: Address | None, port: int) -> str | None:
    """Why the http tools may not connect to `address` (None: not known yet, a name not
    resolved) for `host` and `port`; None if they may."""
    host = _host(host)
    site = _site(host, address, port)
    if site:
        return site
    for entry in _entries(tuple(settings.LOOP_HTTP_DENY)):
        if entry.covers(host, address, port):
            return f"{address or host} port {port} is denied (LOOP_HTTP_DENY {entry.text!r})"
    if any(e.covers(host, address, port) for e in _entries(tuple(settings.LOOP_HTTP_ALLOW))):
        return None
    if address is not None and own(address):
        return (
            f"{address} is this host's own address; a receiver here must be listed "
            "in LOOP_HTTP_ALLOW"
        )
    if _allowed_hosts(host, address):
        return f"{host} is the loop's own site (ALLOWED_HOSTS)"
    return None


def problem(host: str, port: int) -> str | None:
    """`refusal` as far as the URL tells before anything is resolved: its name, or its literal
    address (`localhost` is 127.0.0.1 wherever it is resolved)."""
    name = _host(host)
    if name == "localhost" or name.endswith(".localhost"):
        return refusal(host, ipaddress.IPv4Address("127.0.0.1"), port)
    return refusal(host, _address(host), port)


def connect(
    address: tuple[str, int],
    timeout: Any = _DEFAULT_TIMEOUT,
    source_address: tuple[str, int] | None = None,
) -> socket.socket:
    """`socket.create_connection`, judging each address the name resolves to before it
    connects to it: a socket connected to an address `refusal` allows. Refused (a ToolError)
    if every address was refused; OSError as `create_connection` raises it otherwise (a name
    that does not resolve, every allowed address refusing the connection)."""
    host, port = address
    refused: list[str] = []
    error: OSError | None = None
    for family, kind, proto, _, where in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        found = _address(str(where[0]))
        why = refusal(host, found, port) if found is not None else f"{where[0]} is no address"
        if why:
            refused.append(why)
            continue
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(where)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    if error is not None:
        raise error
    raise Refused(f"refused: {refused[0] if refused else f'{host} has no address'}")
