"""Cutting stamped round trips into stages (bench.bench_rtt_stages): the figures in
docs/performance.md are only as right as this bookkeeping."""

from __future__ import annotations

from bench.bench_rtt_stages import ECHO_MARKS, PING_MARKS, STAGES, Stamps, cut


def stamps_of(events: list[tuple[int, str]]) -> Stamps:
    stamps = Stamps()
    for t, mark in events:
        stamps.times.setdefault(mark, []).append(t)
    return stamps


def ping_trip(t: int) -> list[tuple[int, str]]:
    """One trip of the pinging side starting at ``t``, with the stray stamps a real one
    has: a flush after the reply (acknowledgements) and an empty wake-up before it."""
    return [(t, "call"), (t + 10, "flush"), (t + 30, "presend"), (t + 80, "sent"),
            (t + 150, "read"),  # woke, found nothing
            (t + 400, "read"), (t + 430, "direct"), (t + 500, "accept"),
            (t + 530, "returned"), (t + 540, "flush")]


def echo_trip(t: int) -> list[tuple[int, str]]:
    """One trip of the echoing side, after a control message (a hello, say) that it
    read and decoded just before the trip's own message."""
    return [(t + 60, "read"), (t + 70, "direct"), (t + 100, "read"), (t + 130, "direct"),
            (t + 200, "accept"), (t + 230, "flush"), (t + 270, "presend"), (t + 320, "sent")]


def test_trips_take_each_mark_in_order_and_the_last_read_of_the_message() -> None:
    ping = stamps_of([e for start in (0, 1000) for e in ping_trip(start)])
    assert ping.trips(PING_MARKS) == [[0, 10, 30, 80, 400, 430, 500, 530],
                                      [1000, 1010, 1030, 1080, 1400, 1430, 1500, 1530]]
    echo = stamps_of([e for start in (0, 1000) for e in echo_trip(start)])
    assert echo.trips(ECHO_MARKS) == [[100, 130, 200, 230, 270, 320],
                                      [1100, 1130, 1200, 1230, 1270, 1320]]


def test_cut_matches_each_trip_with_the_echo_inside_it_and_skips_the_warmup() -> None:
    ping = stamps_of([e for start in (0, 1000, 2000) for e in ping_trip(start)])
    # The echo missed the first trip's stamps (it started late): nothing matches it.
    echo = stamps_of([e for start in (1000, 2000) for e in echo_trip(start)])
    got = cut(ping.trips(PING_MARKS), echo.trips(ECHO_MARKS), warmup=1)
    assert got["trip"] == [0.53, 0.53]
    stage = {what: values for _, _, _, what, _ in STAGES for values in [got[what]]}
    assert stage["ping: ZeroMQ send call"] == [0.05, 0.05]
    assert stage["wire to echo: I/O threads, TCP, wake-up"] == [0.02, 0.02]  # 80 -> 100
    assert stage["echo: decode, session checks, acks"] == [0.07, 0.07]
    assert stage["wire back: I/O threads, TCP, wake-up"] == [0.08, 0.08]  # 320 -> 400
    assert stage["ping: inbox, the receiver woken"] == [0.03, 0.03]
    # The stages tile the trip: nothing is counted twice or left out.
    assert sum(got[what][0] for _, _, _, what, _ in STAGES) == got["trip"][0]

    alone = cut(ping.trips(PING_MARKS), echo.trips(ECHO_MARKS), warmup=0)
    assert len(alone["trip"]) == 2  # the unmatched first trip is left out, not mis-cut


def test_an_echo_that_reads_before_the_send_call_returns_is_still_its_trip() -> None:
    # The ping's I/O thread took its core during the send, wrote the message, and the
    # echo read it on the other core before the send call returned (at t + 80).
    ping = stamps_of(ping_trip(0))
    echo = stamps_of([(70, "read"), (130, "direct"), (200, "accept"), (230, "flush"),
                      (270, "presend"), (320, "sent")])
    got = cut(ping.trips(PING_MARKS), echo.trips(ECHO_MARKS), warmup=0)
    assert got["trip"] == [0.53]
    assert got["wire to echo: I/O threads, TCP, wake-up"] == [-0.01]
    assert sum(got[what][0] for _, _, _, what, _ in STAGES) == got["trip"][0]
