"""Host addresses as they appear inside URLs and ZeroMQ endpoints.

An IPv6 literal contains colons, which would be read as the port separator in
``tcp://host:port`` or ``http://host:port``; RFC 3986 puts it in brackets. This is the one
place that rule lives.
"""

from __future__ import annotations

__all__ = ["url_host"]


def url_host(host: str) -> str:
    """Return ``host`` as it is written before ``:port`` in an endpoint or URL.

    Args:
        host: an IPv4 address, an IPv6 address (without brackets) or a host name.

    Returns:
        ``"[<host>]"`` for an IPv6 address (any host containing a colon), ``host``
        unchanged otherwise. An address already in brackets is returned unchanged.
    """
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
