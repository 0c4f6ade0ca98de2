"""A subscription's ``admit_source`` (issue 28, item 7: the stream server's ingest channel): a
SETUP from a host it refuses makes no image and is counted, that host's DATA elicits no SETUP
(no status message goes back to it), and an admitted host is served as before. Sans I/O."""

from __future__ import annotations

from aeron_spark.transport.protocol.frames import DATA_HEADER, SetupFrame
from aeron_spark.transport.protocol.receiver import ReceiveDispatcher, StreamInterest

STREAM = 33
ALLOWED = ("10.0.0.1", 40001)
REFUSED = ("10.0.0.2", 40001)


def _setup(session_id: int) -> bytes:
    return SetupFrame(0, session_id, STREAM, 0, 0, 64 * 1024, 1408).encode()


def _data(session_id: int) -> bytes:
    payload = b"x" * 32
    return DATA_HEADER.pack(32 + len(payload), 0, 0xC0, 1, 0, session_id, STREAM, 0, 0) + payload


def test_a_refused_host_gets_no_image_and_no_status_message() -> None:
    asked: list[str] = []

    def admit(host: str) -> bool:
        asked.append(host)
        return host == ALLOWED[0]

    dispatcher = ReceiveDispatcher()
    interest = StreamInterest(STREAM, admit_source=admit)
    dispatcher.add(interest)
    sent: list[object] = []

    def transmit(data: bytes, address: object) -> None:
        sent.append(address)

    for n in range(3):  # DATA of an unknown session, then SETUPs: nothing for the refused host
        data = _data(100 + n)
        dispatcher.on_datagram(data, len(data), REFUSED, n * 200_000_000, transmit)
        setup = _setup(100 + n)
        dispatcher.on_datagram(setup, len(setup), REFUSED, n * 200_000_000, transmit)
    assert interest.images == {} and sent == []
    assert dispatcher.setups_source_refused == 3
    assert asked == [REFUSED[0]]  # asked once per host

    data = _data(7)
    dispatcher.on_datagram(data, len(data), ALLOWED, 0, transmit)
    assert sent == [ALLOWED]  # its DATA elicits a SETUP
    setup = _setup(7)
    dispatcher.on_datagram(setup, len(setup), ALLOWED, 1, transmit)
    assert list(interest.images) == [7]
