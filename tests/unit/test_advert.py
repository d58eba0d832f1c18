"""The discovery record and its TXT codec (pure, no sockets)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core.advert import (
    MAX_TXT_ENTRIES,
    MAX_TXT_STRING,
    PeerAdvert,
    check_agent_name,
    check_mesh_name,
    decode_txt,
    encode_txt,
)
from porter_mesh.core.constants import HUMAN_AGENT, PROTOCOL_VERSION
from porter_mesh.errors import ConfigError, FrameError

KEY = "rq:^D$Pg*lPBB}cuF}i<&wEfX$i3m(g!vk%9zC1!"  # a real Z85 public key


def advert(**changes: object) -> PeerAdvert:
    base = PeerAdvert(
        name="worker-1",
        role="worker",
        mesh="default",
        pub_port=5601,
        router_port=5602,
        version=PROTOCOL_VERSION,
        incarnation=2**63 + 17,
        addresses=("127.0.0.1",),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def wire(txt: dict[str, str]) -> dict[bytes, bytes | None]:
    """What zeroconf hands over after a round trip: bytes keys and values."""
    return {k.encode(): v.encode() for k, v in txt.items()}


def test_round_trip_minimal() -> None:
    ad = advert()
    txt = encode_txt(ad)
    assert set(txt) == {"n", "m", "ro", "pp", "rp", "v", "i"}
    assert decode_txt(wire(txt), addresses=ad.addresses) == ad


def test_round_trip_full() -> None:
    ad = advert(public_key=KEY, slots=3, tools=("bash", "read_file", "memory.query"),
                signing_key=KEY[::-1])
    assert encode_txt(ad)["sk"] == KEY[::-1]
    assert decode_txt(wire(encode_txt(ad)), addresses=("127.0.0.1",)) == ad
    assert decode_txt(encode_txt(ad), addresses=("127.0.0.1",)) == ad  # str keys too


def test_carried_acks_are_announced_only_when_read() -> None:
    ad = advert(carried_acks=True)
    assert encode_txt(ad)["ca"] == "1"
    assert decode_txt(wire(encode_txt(ad)), addresses=ad.addresses) == ad
    # A node of an earlier version says nothing: it gets ack messages only.
    assert "ca" not in encode_txt(advert())
    assert not decode_txt(wire(encode_txt(advert())), addresses=("127.0.0.1",)).carried_acks


def test_every_txt_string_fits() -> None:
    ad = advert(public_key=KEY, slots=65536, tools=tuple(f"tool-{i:02d}" for i in range(30)))
    for key, value in encode_txt(ad).items():
        assert len(key) + 1 + len(value.encode()) <= MAX_TXT_STRING


def test_unknown_keys_are_ignored() -> None:
    props = wire(encode_txt(advert()))
    props[b"future"] = b"x" * 300
    props[b"flag"] = None
    assert decode_txt(props, addresses=("127.0.0.1",)) == advert()


def test_endpoints() -> None:
    assert advert().endpoint_pub() == "tcp://127.0.0.1:5601"
    assert advert().endpoint_router() == "tcp://127.0.0.1:5602"
    v6 = advert(addresses=("fd00::5", "10.0.0.1"))
    assert v6.endpoint_pub() == "tcp://[fd00::5]:5601"
    assert advert(addresses=()).with_addresses(["10.1.2.3"]).endpoint_router() == (
        "tcp://10.1.2.3:5602"
    )
    with pytest.raises(ConfigError, match="no address"):
        advert(addresses=()).endpoint_pub()


@pytest.mark.parametrize(
    "name", ["worker-1", HUMAN_AGENT, "a", "0", "x" * 56, "under_score", "9lives"]
)
def test_good_agent_names(name: str) -> None:
    assert check_agent_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "Worker", "a.b", "-lead", "_lead", "x" * 57, "a b", "a:b", "é", "a\n", "task:x", 5],
)
def test_bad_agent_names(name: object) -> None:
    with pytest.raises(ConfigError, match="agent name") as info:
        check_agent_name(name)
    assert "lowercase" in str(info.value)


def test_mesh_names() -> None:
    assert check_mesh_name("lab.team-2") == "lab.team-2"
    for bad in ("", "Lab", ".x", "m" * 64, "a/b"):
        with pytest.raises(ConfigError, match="mesh name"):
            check_mesh_name(bad)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"pub_port": 0}, "pub_port"),
        ({"router_port": 65536}, "router_port"),
        ({"pub_port": True}, "pub_port"),
        ({"version": 0}, "version"),
        ({"incarnation": -1}, "incarnation"),
        ({"incarnation": 2**64}, "incarnation"),
        ({"addresses": ("localhost",)}, "not an IP address"),
        ({"addresses": ["127.0.0.1"]}, "tuple"),
        ({"public_key": "short"}, "Z85"),
        ({"signing_key": "short"}, "Z85"),
        ({"slots": -1}, "slots"),
        ({"tools": ("a,b",)}, "tool name"),
        ({"tools": tuple(f"t{i}" for i in range(65))}, "tools"),
        ({"tools": tuple("x" * 60 + str(i) for i in range(5))}, "TXT string"),
        ({"role": "Boss"}, "role"),
        ({"mesh": "Mesh"}, "mesh name"),
    ],
)
def test_invalid_adverts_are_config_errors(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        advert(**changes)


def bad(props: dict[bytes | str, bytes | str | None], match: str) -> None:
    with pytest.raises(FrameError, match=match) as info:
        decode_txt(props)
    assert info.value.reason == "bad-advert"


def test_missing_keys() -> None:
    props = wire(encode_txt(advert()))
    del props[b"pp"], props[b"i"]
    bad(dict(props), "missing TXT key.*pp.*i")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (b"pp", b"http", "pub port"),
        (b"pp", b"0", "pub_port"),
        (b"rp", b"70000", "router_port"),
        (b"rp", b"-5", "router port"),
        (b"rp", b" 5", "router port"),
        (b"rp", b"5_000", "router port"),
        (b"i", b"1" * 21, "incarnation"),
        (b"i", b"18446744073709551616", "incarnation"),
        (b"n", b"Evil.Name", "agent name"),
        (b"n", b"../../etc", "agent name"),
        (b"m", b"", "mesh name"),
        (b"ro", b"x" * 40, "role"),
        (b"k", b"not-a-key", "Z85"),
        (b"n", b"\xff\xfe", "not UTF-8"),
        (b"n", None, "no value"),
        (b"t", b"a,,b", "tool name"),
        (b"m", b"m" * 300, "more than 255"),
        (b"s", b"lots", "slots"),
    ],
)
def test_malformed_values(key: bytes, value: bytes | None, match: str) -> None:
    props: dict[bytes | str, bytes | str | None] = dict(wire(encode_txt(advert())))
    props[key] = value
    bad(props, match)


def test_malformed_records() -> None:
    good: dict[bytes | str, bytes | str | None] = dict(wire(encode_txt(advert())))
    bad({**good, b"\xc3\x28": b"x"}, "not UTF-8")
    bad({**good, "n": "worker-1"}, "twice")
    bad({**good, **{f"x{i}".encode(): b"" for i in range(MAX_TXT_ENTRIES)}}, "entries")
    bad({**good, b"n": 5}, "int")  # type: ignore[dict-item]
    bad([], "mapping")  # type: ignore[arg-type]
    with pytest.raises(FrameError, match="not an IP address"):
        decode_txt(good, addresses=("example.org",))


@given(st.dictionaries(st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=300))))
def test_arbitrary_records_never_escape_as_other_errors(
    props: dict[bytes, bytes | None],
) -> None:
    try:
        decode_txt(props)  # type: ignore[arg-type]
    except FrameError as exc:
        assert exc.reason == "bad-advert"


@given(
    name=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,62}", fullmatch=True),
    pub=st.integers(1, 65535),
    incarnation=st.integers(0, 2**64 - 1),
    slots=st.integers(0, 64),
)
def test_round_trip_property(name: str, pub: int, incarnation: int, slots: int) -> None:
    ad = advert(name=name, pub_port=pub, incarnation=incarnation, slots=slots)
    assert decode_txt(wire(encode_txt(ad)), addresses=ad.addresses) == ad


def test_the_humans_names_and_the_key_they_speak_with() -> None:
    from porter_mesh.core.advert import is_human, key_name, seat_name

    seat = seat_name("3fa2c1")
    assert seat == "porter-ui-3fa2c1"
    assert is_human(HUMAN_AGENT) and is_human(seat)
    for other in ("worker-1", "porter", "porter-uix", "ui-porter-ui", "", None):
        assert not is_human(other), other
    assert key_name(seat) == key_name(HUMAN_AGENT) == HUMAN_AGENT
    assert key_name("worker-1") == "worker-1"
    with pytest.raises(ConfigError):
        seat_name("Not A Label")


def test_url_host_brackets_ipv6_only() -> None:
    from porter_mesh.core.addresses import url_host

    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("localhost") == "localhost"
    assert url_host("::1") == "[::1]"
    assert url_host("fe80::1%lo") == "[fe80::1%lo]"
    assert url_host("[::1]") == "[::1]"
