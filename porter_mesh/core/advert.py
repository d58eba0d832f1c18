"""The discovery record: what a node announces about itself, and its TXT codec.

Every node registers one zeroconf service of type ``_porter-mesh._tcp.local.`` named
``<agent>._porter-mesh._tcp.local.``. The service's TXT record carries a
:class:`PeerAdvert`, with short keys because a TXT string is limited to 255 bytes and the
whole record should fit one mDNS packet with its SRV and address records:

=====  ==============================  ==========================================
key    field                           value
=====  ==============================  ==========================================
``n``  ``name``                        agent name (same as the service instance)
``m``  ``mesh``                        mesh name; other meshes on the LAN ignore it
``ro`` ``role``                        ``architect``, ``worker``, ``reviewer``...
``pp`` ``pub_port``                    TCP port of the PUB socket
``rp`` ``router_port``                 TCP port of the ROUTER socket
``v``  ``version``                     envelope protocol version
``i``  ``incarnation``                 random per process start (decimal)
``k``  ``public_key``                  Z85 CurveZMQ public key (only with security)
``sk`` ``signing_key``                 Z85 Ed25519 key the agent signs its knowledge
                                       records with (only with security)
``s``  ``slots``                       task slots (omitted when 0)
``t``  ``tools``                       comma-separated tool names (omitted if none)
``ca`` ``carried_acks``                ``1`` when the node reads acknowledgements carried
                                       by direct messages (omitted otherwise)
=====  ==============================  ==========================================

Addresses are not in the TXT record: they come from the mDNS address records (or a
seed), and are passed to :func:`decode_txt` separately.

Names. An agent name is one DNS label and also part of a channel name
(``task:<agent>``) and a ZeroMQ identity, so it is restricted to :data:`AGENT_NAME_RE`:
1-56 characters of lowercase ASCII letters, digits, ``-`` and ``_``, starting with a
letter or digit (56, so that the agent name, ``@`` and a 6-digit mesh tag fit one DNS
label of 63 bytes: see ``porter_mesh.adapters.discovery.service_name``). Lowercase
only, because mDNS compares names case-insensitively: two agents named ``Worker`` and
``worker`` would collide on the network while looking distinct everywhere else. No
dots, because a dot would split the service instance name into several DNS labels.
Mesh names and roles follow :data:`MESH_NAME_RE` and :data:`ROLE_RE`.

The human user's names. The dashboard joins as ``porter-ui``; every command-line seat
(``send``, ``request``, ``remember``...) joins as ``porter-ui-<6 hex digits>``, a name
of its own (:func:`seat_name`), so that a command run next to the dashboard, or next to
another command, never puts two nodes of one name on the mesh. Every one of these names
is the human's (:func:`is_human`): messages from them are the human user's, and a
secured mesh binds them all to the key trusted as ``porter-ui`` (:func:`key_name`).
Replies go to the sender's own name, so each seat gets its own. Other agents should not
take a name that starts with ``porter-ui-``.

Decoding never trusts the peer: anything malformed raises :class:`FrameError` with
``reason="bad-advert"``; unknown keys are ignored so that later versions can add fields.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from porter_mesh.core.addresses import url_host
from porter_mesh.core.constants import HUMAN_AGENT
from porter_mesh.errors import ConfigError, FrameError

__all__ = [
    "AGENT_NAME_RE",
    "MAX_INCARNATION",
    "MAX_SLOTS",
    "MAX_TOOLS",
    "MAX_TXT_ENTRIES",
    "MAX_TXT_STRING",
    "MESH_NAME_RE",
    "ROLE_RE",
    "TOOL_NAME_RE",
    "TXT_KEYS",
    "PeerAdvert",
    "TxtProperties",
    "check_agent_name",
    "check_mesh_name",
    "decode_txt",
    "encode_txt",
    "is_human",
    "key_name",
    "seat_name",
]

#: Allowed agent names: one lowercase DNS label (see the module docstring for why).
AGENT_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,55}")
#: Allowed mesh names. Dots are fine here: the mesh name only travels in the TXT record.
MESH_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
#: Allowed roles.
ROLE_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
#: Allowed tool names (capabilities); the comma is the list separator in TXT.
TOOL_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: A CurveZMQ public key: 32 bytes in Z85 are 40 characters of this alphabet.
_Z85_KEY_RE: Final = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")

#: DNS-SD limits one TXT string (``key=value``) to 255 bytes.
MAX_TXT_STRING: Final = 255
#: A record with more entries than this is refused rather than scanned.
MAX_TXT_ENTRIES: Final = 64
MAX_TOOLS: Final = 64
MAX_SLOTS: Final = 1 << 16
MAX_INCARNATION: Final = (1 << 64) - 1
_MAX_VERSION: Final = 0xFFFF

# TXT keys, in the order they are written.
_K_NAME: Final = "n"
_K_MESH: Final = "m"
_K_ROLE: Final = "ro"
_K_PUB: Final = "pp"
_K_ROUTER: Final = "rp"
_K_VERSION: Final = "v"
_K_INCARNATION: Final = "i"
_K_KEY: Final = "k"
_K_SIGNING_KEY: Final = "sk"
_K_SLOTS: Final = "s"
_K_TOOLS: Final = "t"
_K_CARRIED_ACKS: Final = "ca"
#: Every key this version reads; other keys are ignored.
TXT_KEYS: Final = frozenset(
    {_K_NAME, _K_MESH, _K_ROLE, _K_PUB, _K_ROUTER, _K_VERSION, _K_INCARNATION, _K_KEY,
     _K_SIGNING_KEY, _K_SLOTS, _K_TOOLS, _K_CARRIED_ACKS}
)
_REQUIRED: Final = (_K_NAME, _K_MESH, _K_ROLE, _K_PUB, _K_ROUTER, _K_VERSION, _K_INCARNATION)
# Decimal integers only: no sign, no spaces, no underscores (int() accepts all of those).
_DECIMAL_RE: Final = re.compile(r"[0-9]{1,20}")

_Value = bytes | str | None
#: TXT properties as zeroconf gives them (bytes) or as a caller writes them (str).
TxtProperties = Mapping[bytes, _Value] | Mapping[str, _Value] | Mapping[bytes | str, _Value]


def check_agent_name(name: object) -> str:
    """Check that ``name`` can be used as an agent name on the mesh.

    Args:
        name: the candidate name.

    Returns:
        The name, unchanged.

    Raises:
        ConfigError: the name is not a string of 1-56 lowercase letters, digits, ``-`` or
            ``_`` starting with a letter or digit.
    """
    return _check_pattern(
        name,
        AGENT_NAME_RE,
        "agent name",
        "use 1-56 lowercase letters, digits, '-' or '_', starting with a letter or digit "
        "(for example 'worker-1'); agent names are one DNS label and are compared "
        "case-insensitively by mDNS",
    )


#: What a command-line seat's name starts with (then 6 hex digits).
_SEAT_PREFIX: Final = HUMAN_AGENT + "-"


def is_human(name: str | None) -> bool:
    """Whether ``name`` is one of the human user's: the dashboard's ``porter-ui`` or a
    command-line seat ``porter-ui-<suffix>`` (see the module docstring)."""
    return name is not None and (name == HUMAN_AGENT or name.startswith(_SEAT_PREFIX))


def key_name(name: str) -> str:
    """The name whose key ``name`` speaks with on a secured mesh: ``porter-ui`` for every
    seat of the human user, else ``name`` itself."""
    return HUMAN_AGENT if is_human(name) else name


def seat_name(suffix: str) -> str:
    """The name of a command-line seat of the human user: ``porter-ui-<suffix>``.

    Raises:
        ConfigError: the name would not be a valid agent name.
    """
    return check_agent_name(_SEAT_PREFIX + suffix)


def check_mesh_name(mesh: object) -> str:
    """Check that ``mesh`` can be used as a mesh name.

    Args:
        mesh: the candidate name.

    Returns:
        The name, unchanged.

    Raises:
        ConfigError: the name is not 1-63 lowercase letters, digits, ``.``, ``-`` or ``_``
            starting with a letter or digit.
    """
    return _check_pattern(
        mesh,
        MESH_NAME_RE,
        "mesh name",
        "use 1-63 lowercase letters, digits, '.', '-' or '_', starting with a letter or "
        "digit (for example 'default' or 'lab-2')",
    )


def _check_pattern(value: object, pattern: re.Pattern[str], what: str, advice: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, not {type(value).__name__}; {advice}")
    if pattern.fullmatch(value) is None:
        raise ConfigError(f"{what} {value!r} is not allowed; {advice}")
    return value


def _check_int(value: object, what: str, low: int, high: int) -> int:
    # bool is an int subclass; True as a port is a bug, not a port.
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigError(f"{what}={value} is out of range {low}..{high}")
    return value


@dataclass(frozen=True, slots=True)
class PeerAdvert:
    """What a node announces about itself; an immutable, validated value.

    Attributes:
        name: agent name (:data:`AGENT_NAME_RE`), unique on the network segment.
        role: the agent's role (:data:`ROLE_RE`).
        mesh: mesh name (:data:`MESH_NAME_RE`).
        pub_port: TCP port of the node's PUB socket (1-65535).
        router_port: TCP port of the node's ROUTER socket (1-65535).
        version: envelope protocol version the node speaks.
        incarnation: random number chosen at process start (0 .. 2**64-1).
        addresses: IP addresses the node can be reached at, preferred first.
        public_key: Z85 CurveZMQ public key (40 characters) when security is on.
        signing_key: Z85 Ed25519 public key (40 characters) that signs the agent's
            knowledge records, when security is on. Informative: replicas check
            signatures against the trusted directory, never against an advert.
        slots: task slots the node offers (workers), 0 for none.
        tools: tool names the node offers.
        carried_acks: the node reads acknowledgements carried by direct messages (see
            :mod:`porter_mesh.core.session.acks`); a node of an earlier version does
            not announce it and gets ``ack`` messages only.

    Raises:
        ConfigError: on construction, when any field is invalid.
    """

    name: str
    role: str
    mesh: str
    pub_port: int
    router_port: int
    version: int
    incarnation: int
    addresses: tuple[str, ...] = ()
    public_key: str | None = None
    slots: int = 0
    tools: tuple[str, ...] = ()
    signing_key: str | None = None
    carried_acks: bool = False

    def __post_init__(self) -> None:
        check_agent_name(self.name)
        check_mesh_name(self.mesh)
        _check_pattern(
            self.role, ROLE_RE, "role",
            "use 1-32 lowercase letters, digits, '-' or '_' (for example 'worker')",
        )
        _check_int(self.pub_port, "pub_port", 1, 65535)
        _check_int(self.router_port, "router_port", 1, 65535)
        _check_int(self.version, "version", 1, _MAX_VERSION)
        _check_int(self.incarnation, "incarnation", 0, MAX_INCARNATION)
        _check_int(self.slots, "slots", 0, MAX_SLOTS)
        if type(self.carried_acks) is not bool:
            raise ConfigError("carried_acks must be a boolean")
        if not isinstance(self.addresses, tuple):
            raise ConfigError("addresses must be a tuple of IP address strings")
        for address in self.addresses:
            _check_address(address)
        if self.public_key is not None and (
            not isinstance(self.public_key, str) or _Z85_KEY_RE.fullmatch(self.public_key) is None
        ):
            raise ConfigError(
                "public_key must be a 40-character Z85 CurveZMQ public key "
                "(as made by zmq.curve_keypair())"
            )
        if self.signing_key is not None and (
            not isinstance(self.signing_key, str)
            or _Z85_KEY_RE.fullmatch(self.signing_key) is None
        ):
            raise ConfigError("signing_key must be a 40-character Z85 Ed25519 public key")
        if not isinstance(self.tools, tuple):
            raise ConfigError("tools must be a tuple of tool names")
        if len(self.tools) > MAX_TOOLS:
            raise ConfigError(f"{len(self.tools)} tools is more than the {MAX_TOOLS} announced")
        for tool in self.tools:
            _check_pattern(
                tool, TOOL_NAME_RE, "tool name",
                "use 1-64 letters, digits, '.', '-' or '_' (for example 'memory_query')",
            )
        if self.tools and len(_K_TOOLS) + 1 + len(",".join(self.tools)) > MAX_TXT_STRING:
            raise ConfigError(
                f"the tool list is {len(','.join(self.tools))} characters, more than fits one "
                f"TXT string ({MAX_TXT_STRING} bytes); announce fewer or shorter tool names"
            )

    def endpoint_pub(self) -> str:
        """Return the ZeroMQ endpoint of the PUB socket, at the first address.

        Returns:
            ``"tcp://<address>:<pub_port>"``, with an IPv6 address in brackets.

        Raises:
            ConfigError: the advert carries no address.
        """
        return f"tcp://{self._host()}:{self.pub_port}"

    def endpoint_router(self) -> str:
        """Return the ZeroMQ endpoint of the ROUTER socket, at the first address.

        Returns:
            ``"tcp://<address>:<router_port>"``, with an IPv6 address in brackets.

        Raises:
            ConfigError: the advert carries no address.
        """
        return f"tcp://{self._host()}:{self.router_port}"

    def with_addresses(self, addresses: Sequence[str]) -> PeerAdvert:
        """Return a copy reachable at ``addresses`` (preferred first).

        Raises:
            ConfigError: an address is not an IP address.
        """
        return replace(self, addresses=tuple(addresses))

    def _host(self) -> str:
        if not self.addresses:
            raise ConfigError(
                f"advert of {self.name!r} has no address; fill addresses from the mDNS "
                "record or the seed it came from before connecting"
            )
        return url_host(self.addresses[0])


def _check_address(address: object) -> None:
    if not isinstance(address, str):
        raise ConfigError(f"address {address!r} must be a string")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(
            f"address {address!r} is not an IP address (host names are not resolved here)"
        ) from None


def encode_txt(advert: PeerAdvert) -> dict[str, str]:
    """Encode an advert as zeroconf TXT properties.

    Args:
        advert: the advert to announce (already validated by its constructor).

    Returns:
        ``{key: value}`` with the short keys of the module docstring; optional fields
        are left out when empty.
    """
    txt = {
        _K_NAME: advert.name,
        _K_MESH: advert.mesh,
        _K_ROLE: advert.role,
        _K_PUB: str(advert.pub_port),
        _K_ROUTER: str(advert.router_port),
        _K_VERSION: str(advert.version),
        _K_INCARNATION: str(advert.incarnation),
    }
    if advert.public_key is not None:
        txt[_K_KEY] = advert.public_key
    if advert.signing_key is not None:
        txt[_K_SIGNING_KEY] = advert.signing_key
    if advert.slots:
        txt[_K_SLOTS] = str(advert.slots)
    if advert.tools:
        txt[_K_TOOLS] = ",".join(advert.tools)
    if advert.carried_acks:
        txt[_K_CARRIED_ACKS] = "1"
    return txt


def _bad(message: str) -> FrameError:
    return FrameError(f"bad discovery advert: {message}", reason="bad-advert")


def _text(raw: bytes | str | None, what: str) -> str:
    if raw is None:
        raise _bad(f"{what} has no value")
    if isinstance(raw, str):
        text = raw
        size = len(raw.encode("utf-8", "surrogatepass"))
    elif isinstance(raw, bytes | bytearray):
        size = len(raw)
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"{what} is not UTF-8") from None
    else:
        raise _bad(f"{what} is a {type(raw).__name__}, not bytes or str")
    if size > MAX_TXT_STRING:
        raise _bad(f"{what} is {size} bytes, more than {MAX_TXT_STRING}")
    return text


def _decimal(text: str, what: str) -> int:
    if _DECIMAL_RE.fullmatch(text) is None:
        raise _bad(f"{what}={text[:40]!r} is not a decimal integer")
    return int(text)


def decode_txt(properties: TxtProperties, *, addresses: Sequence[str] = ()) -> PeerAdvert:
    """Decode zeroconf TXT properties into an advert.

    Args:
        properties: the service's TXT properties, keys and values as bytes or str
            (``ServiceInfo.properties`` gives bytes); a key without ``=`` maps to None.
        addresses: IP addresses the peer was seen at, preferred first.

    Returns:
        The validated advert.

    Raises:
        FrameError: with ``reason="bad-advert"``, when a required key is missing, a key
            is not UTF-8, a value is oversize, not UTF-8 or not valid for its field
            (ports outside 1-65535, names outside the allowed patterns...). Unknown keys
            are ignored.
    """
    if not isinstance(properties, Mapping):
        raise _bad(f"properties are a {type(properties).__name__}, not a mapping")
    if len(properties) > MAX_TXT_ENTRIES:
        raise _bad(f"{len(properties)} TXT entries, more than {MAX_TXT_ENTRIES}")
    fields: dict[str, str] = {}
    for raw_key, raw_value in properties.items():
        key = _text(raw_key, "a TXT key")
        if key not in TXT_KEYS:
            continue
        if key in fields:
            raise _bad(f"TXT key {key!r} appears twice")
        fields[key] = _text(raw_value, f"TXT key {key!r}")
    missing = [key for key in _REQUIRED if key not in fields]
    if missing:
        raise _bad(f"missing TXT key(s) {', '.join(missing)}")
    tools_text = fields.get(_K_TOOLS, "")
    try:
        return PeerAdvert(
            name=fields[_K_NAME],
            role=fields[_K_ROLE],
            mesh=fields[_K_MESH],
            pub_port=_decimal(fields[_K_PUB], "pub port"),
            router_port=_decimal(fields[_K_ROUTER], "router port"),
            version=_decimal(fields[_K_VERSION], "version"),
            incarnation=_decimal(fields[_K_INCARNATION], "incarnation"),
            addresses=tuple(addresses),
            public_key=fields.get(_K_KEY),
            signing_key=fields.get(_K_SIGNING_KEY),
            slots=_decimal(fields[_K_SLOTS], "slots") if _K_SLOTS in fields else 0,
            tools=tuple(tools_text.split(",")) if tools_text else (),
            carried_acks=fields.get(_K_CARRIED_ACKS) == "1",
        )
    except ConfigError as exc:
        raise _bad(str(exc)) from None
