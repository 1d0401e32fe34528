"""Where the capture stage may connect: allow-listed networks and ports, checked after DNS.

A target record is data a workload wrote, so its address is not trusted: the stage resolves
it, refuses it unless every address it resolves to is in an allowed network (private ranges by
default), on an allowed port, and never loopback, link-local or the metadata server unless
explicitly allowed, then connects to the address it checked (so a second DNS answer cannot
point the connection elsewhere).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from mldiag.errors import MldiagError
from mldiag.settings import Settings

# RFC 1918 and unique-local IPv6: where a workload's VPC addresses live.
DEFAULT_NETWORKS = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"
# The metadata servers: link-local IPv4 on every cloud, and IPv6 inside unique-local space
# (fc00::/7, allowed by default): AWS's fd00:ec2::254 and GCE's fd20:ce::254.
METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
            ipaddress.ip_address("fd20:ce::254"))

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class EgressRefused(MldiagError):
    """The target's address or port is not one the capture stage may connect to.

    Permanent: the policy refuses the same address again.
    """


def _ports(text: str) -> list[tuple[int, int]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


@dataclass(frozen=True)
class EgressPolicy:
    """Allowed networks and ports; loopback and link-local only when allowed explicitly."""

    networks: tuple[Network, ...]
    ports: tuple[tuple[int, int], ...]
    allow_loopback: bool = False
    allow_link_local: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressPolicy:
        loopback = settings.capture_allow_loopback.strip().lower()
        return cls(
            networks=tuple(ipaddress.ip_network(n.strip(), strict=False) for n in
                           (settings.capture_allowed_networks or DEFAULT_NETWORKS).split(",")
                           if n.strip()),
            ports=tuple(_ports(settings.capture_allowed_ports)),
            # "auto": on one machine (the local backend) targets are local processes.
            allow_loopback=(settings.backend == "local") if loopback == "auto"
            else loopback in ("1", "true", "yes"),
        )

    def allowed_address(self, ip: Address) -> str:
        """'' when `ip` may be connected to, else why not."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 reaches the IPv4 server
        if ip in METADATA:
            return "the metadata server"
        if ip.is_loopback:
            return "" if self.allow_loopback else "loopback"
        if ip.is_link_local:
            return "" if self.allow_link_local else "link-local"
        if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
            return "not a unicast address"
        if not any(ip.version == n.version and ip in n for n in self.networks):
            return "outside the allowed networks"
        return ""

    def check(self, address: str, port: int) -> str:
        """The IP to connect to for `address:port`; EgressRefused with the reason otherwise.

        Every address the name resolves to must be allowed, so a name with one allowed and
        one internal answer is refused."""
        if not any(lo <= port <= hi for lo, hi in self.ports):
            raise EgressRefused(f"capture refused: port {port} of {address} is not an allowed "
                                "capture port (MLDIAG_CAPTURE_ALLOWED_PORTS)")
        try:
            infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise EgressRefused(f"capture refused: {address} does not resolve: {e}") from e
        ips = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
                                 for info in infos))
        for ip in ips:
            why = self.allowed_address(ip)
            if why:
                raise EgressRefused(
                    f"capture refused: {address} resolves to {ip} ({why}); allow it with "
                    "MLDIAG_CAPTURE_ALLOWED_NETWORKS"
                    + (" or MLDIAG_CAPTURE_ALLOW_LOOPBACK=1" if why == "loopback" else ""))
        return str(ips[0])
