"""What libzmq's monitor events say about a handshake (no socket needed)."""

from __future__ import annotations

import zmq

from porter_mesh.adapters.handshake import Refusal, classify

MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
EP = "tcp://127.0.0.1:5555"


def test_a_mechanism_mismatch_is_a_missing_key_on_one_side() -> None:
    keyless = classify(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, MISMATCH, EP, secured=False)
    secured = classify(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, MISMATCH, EP, secured=True)
    assert keyless is not None and keyless.refusal is Refusal.NEEDS_KEYS
    assert secured is not None and secured.refusal is Refusal.NOT_SECURED
    assert keyless.endpoint == EP and not keyless.succeeded


def test_zap_refusal_success_and_other_events() -> None:
    refused = classify(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, EP, secured=True)
    assert refused is not None and refused.refusal is Refusal.KEY_REFUSED
    done = classify(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, EP, secured=True)
    assert done is not None and done.succeeded and done.refusal is None
    # Another protocol error is a failure keys do not explain.
    other = classify(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_UNSPECIFIED,
                     EP, secured=False)
    assert other is not None and not other.succeeded and other.refusal is None
    assert classify(zmq.EVENT_CONNECTED, 7, EP, secured=False) is None
