"""A client's network, as the voter identity an attacker cannot reset. No Django.

A session costs nothing to replace (a private window, cleared cookies), so a campaign that
starts every battle in a fresh session has no voter key with enough votes to judge. Its
addresses cost more: the network key groups a client by its network (the /24 of an IPv4
address, the /64 of an IPv6 one, which is what one home, office or phone line is usually given),
so the anomaly detection can judge the votes of a network taken together. Only a keyed hash of
the network is kept, never the address.
"""

import hashlib
import hmac
import ipaddress

IPV4_PREFIX = 24
IPV6_PREFIX = 64


def client_network(address: str) -> str | None:
    """The network (CIDR) an address belongs to, or None for something that is not an address
    (a test client's "testclient", an empty string). An IPv4-mapped IPv6 address
    (``::ffff:192.0.2.1``, a dual-stack socket's view of an IPv4 peer) is its IPv4 address."""
    try:
        parsed = ipaddress.ip_address(address.strip().split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    prefix = IPV4_PREFIX if parsed.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{parsed}/{prefix}", strict=False))


def network_key(address: str | None, secret: bytes) -> str:
    """A keyed hash (HMAC-SHA256) of the address's network; "" when there is no address."""
    network = client_network(address) if address else None
    if network is None:
        return ""
    return hmac.new(secret, f"network:{network}".encode(), hashlib.sha256).hexdigest()
