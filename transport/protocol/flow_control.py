"""Sender-side flow control of one publication (Aeron's ``aeron_flow_control.c``, unicast and
max-of-receivers strategy), sans I/O: status messages and ``now_ns`` in, the sender limit out.

Invariants:

* ``sender_limit`` never goes down: ``max(limit, sm_position + receiver_window)`` over every
  status message (the most advanced receiver sets the pace, as Aeron's default
  ``max`` multicast strategy and its unicast one).
* A receiver is connected while its last SM is at most ``connection_timeout_ns`` old
  (Aeron's ``PUBLICATION_CONNECTION_TIMEOUT``, 5 s); an EOS SM removes it at once.
* ``has_initial_connection`` becomes True with the first SM and never goes back (the sender
  sends data only after it, as Aeron's).
* ``retransmit_window`` is the receiver window of the last SM: it bounds what one linger of
  retransmits may resend (see :mod:`.retransmit`).
"""

from __future__ import annotations

CONNECTION_TIMEOUT_NS = 5_000_000_000


class FlowControl:
    """The receivers of one publication and how far the sender may go."""

    __slots__ = (
        "connection_timeout_ns",
        "has_initial_connection",
        "receivers",
        "retransmit_window",
        "sender_limit",
    )

    def __init__(
        self,
        start_position: int,
        window: int,
        connection_timeout_ns: int = CONNECTION_TIMEOUT_NS,
    ) -> None:
        self.sender_limit = start_position
        self.receivers: dict[int, int] = {}  # receiver_id -> time of its last SM
        self.has_initial_connection = False
        self.retransmit_window = window
        self.connection_timeout_ns = connection_timeout_ns

    def on_status_message(
        self, receiver_id: int, sm_position: int, receiver_window: int, now_ns: int
    ) -> None:
        """A receiver's SM (not EOS, not a SETUP request): it is connected; the limit moves."""
        self.receivers[receiver_id] = now_ns
        self.has_initial_connection = True
        if receiver_window > 0:
            self.retransmit_window = receiver_window
        proposed = sm_position + receiver_window
        if proposed > self.sender_limit:
            self.sender_limit = proposed

    def on_end_of_stream(self, receiver_id: int) -> None:
        """The receiver closed its image (an EOS SM): no longer connected."""
        self.receivers.pop(receiver_id, None)

    def expire(self, now_ns: int) -> bool:
        """Forget receivers silent for longer than the connection timeout; True if any went."""
        timeout = self.connection_timeout_ns
        expired = [rid for rid, seen in self.receivers.items() if now_ns - seen > timeout]
        for rid in expired:
            del self.receivers[rid]
        return bool(expired)

    def next_expiry_ns(self) -> int | None:
        """When the receiver heard from least recently times out (None: no receiver)."""
        if not self.receivers:
            return None
        return min(self.receivers.values()) + self.connection_timeout_ns + 1
