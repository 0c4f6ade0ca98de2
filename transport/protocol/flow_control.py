"""Sender-side flow control of one publication, sans I/O: status messages and ``now_ns`` in, the
sender limit out. Three strategies, chosen by the channel's ``fc`` parameter as in Aeron
(``aeron_flow_control.c``, ``aeron_min_flow_control.c``, ``AbstractMinMulticastFlowControl``):

* ``max`` (the default; :class:`FlowControl`): the most advanced receiver sets the pace. A slow
  receiver of several (dynamic MDC, several archives recording one publication) falls behind and
  loses what the others have moved past.
* ``min[,t:TIMEOUT][,g:/N]`` (:class:`MinFlowControl`): the slowest receiver heard from within
  ``TIMEOUT`` (default 5 s, Aeron's ``aeron.flow.control.receiver.timeout``) sets the pace; a
  silent one is dropped after it, so a dead receiver stalls the others for at most ``TIMEOUT``.
* ``tagged[,g:TAG[/N]][,t:TIMEOUT]``: as ``min`` over the receivers whose status messages carry
  the group tag ``TAG`` (a subscription's ``gtag``); others receive but do not hold the sender.
  While no tagged receiver is known, any receiver's SM moves the limit.

``/N`` (either strategy) is the group's minimum size: until ``N`` counted receivers are known the
limit does not move and the publication is not connected. The text is validated by
:func:`parse_flow_control` (a :class:`ValueError` naming what was wrong).

Invariants:

* ``sender_limit`` never goes down: ``max(limit, sm_position + receiver_window)`` over every
  status message (the most advanced receiver sets the pace, as Aeron's default
  ``max`` multicast strategy and its unicast one).
* A receiver is connected while its last SM is at most ``connection_timeout_ns`` old
  (Aeron's ``aeron.publication.connection.timeout``, 5 s by default: the driver's
  ``DriverConfig.publication_connection_timeout_ns``); an EOS SM removes it at once.
* ``has_initial_connection`` becomes True with the first SM and never goes back (the sender
  sends data only after it, as Aeron's).
* ``retransmit_window`` is the receiver window of the last SM: it bounds what one linger of
  retransmits may resend (see :mod:`.retransmit`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONNECTION_TIMEOUT_NS = 5_000_000_000
RECEIVER_TIMEOUT_NS = 5_000_000_000  # Aeron's aeron.flow.control.receiver.timeout default

_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)?$")
_UNITS_NS = {None: 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass(frozen=True)
class FlowControlPolicy:
    """A channel's ``fc`` parameter, validated."""

    strategy: str = "max"  # max, min or tagged
    receiver_timeout_ns: int = RECEIVER_TIMEOUT_NS
    group_tag: int | None = None  # tagged: the receivers' gtag that counts
    group_min_size: int = 0


def parse_flow_control(text: str) -> FlowControlPolicy:
    """``max``, ``min[,t:5s][,g:/N]`` or ``tagged[,g:TAG[/N]][,t:5s]`` (Aeron's syntax)."""
    strategy, *args = text.split(",")
    if strategy not in ("max", "min", "tagged"):
        raise ValueError(f"strategy {strategy!r}: max, min or tagged")
    if strategy == "max" and args:
        raise ValueError("max takes no arguments")
    timeout, tag, size = RECEIVER_TIMEOUT_NS, None, 0
    for arg in args:
        if arg.startswith("t:"):
            m = _DURATION.match(arg[2:])
            if m is None or int(m.group(1)) == 0:
                raise ValueError(f"{arg!r}: t:<positive duration>, e.g. t:5s or t:500ms")
            timeout = int(m.group(1)) * _UNITS_NS[m.group(2)]
        elif arg.startswith("g:"):
            tag_text, slash, size_text = arg[2:].partition("/")
            if tag_text:
                if strategy != "tagged":
                    raise ValueError(f"{arg!r}: a group tag needs the tagged strategy")
                try:
                    tag = int(tag_text)
                except ValueError:
                    raise ValueError(f"{arg!r}: g:<64-bit integer tag>[/<group size>]") from None
                if not -(2**63) <= tag < 2**63:
                    raise ValueError(f"{arg!r}: the tag must fit 64 bits")
            if slash:
                if not size_text.isdigit() or int(size_text) > 1 << 16:
                    raise ValueError(f"{arg!r}: /<group size from 0 to 65536>")
                size = int(size_text)
            elif not tag_text:
                raise ValueError(f"{arg!r}: g:<tag>, g:/<size> or g:<tag>/<size>")
        else:
            raise ValueError(f"{arg!r}: t:<timeout> or g:<tag>/<size>")
    if strategy == "tagged" and tag is None:
        raise ValueError("tagged needs g:<tag> (the subscriptions' gtag)")
    return FlowControlPolicy(strategy, timeout, tag, size)


class FlowControl:
    """The receivers of one publication and how far the sender may go."""

    __slots__ = (
        "connection_timeout_ns",
        "expire_check_ns",
        "has_initial_connection",
        "receivers",
        "retransmit_window",
        "sender_limit",
    )

    # connected as soon as any receiver's SM was heard (is_connected is bool(receivers)): a
    # publication then knows without asking (a Python call) after each SM
    connected_by_any_sm = True

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
        # (the time, the timeout) before which expire() finds no receiver silent too long (a
        # receiver's last SM only moves later): expire() is called on every send (issue 31)
        self.expire_check_ns = (0, connection_timeout_ns)

    @property
    def is_connected(self) -> bool:
        """Someone receives (and, for a group, enough of them)."""
        return bool(self.receivers)

    def refresh(self) -> None:
        """Receivers were removed from :attr:`receivers` from outside (a destination dropped)."""

    def on_status_message(
        self,
        receiver_id: int,
        sm_position: int,
        receiver_window: int,
        now_ns: int,
        group_tag: int | None = None,
    ) -> None:
        """A receiver's SM (not EOS, not a SETUP request): it is connected; the limit moves."""
        # _heard, inline (an idle stream's every SM comes here: one Python call, not two)
        self.receivers[receiver_id] = now_ns
        self.has_initial_connection = True
        if receiver_window > 0:
            self.retransmit_window = receiver_window
        proposed = sm_position + receiver_window
        if proposed > self.sender_limit:
            self.sender_limit = proposed

    def _heard(self, receiver_id: int, sm_position: int, receiver_window: int, now_ns: int) -> int:
        """Note a receiver's SM; the limit it proposes (its position + window)."""
        self.receivers[receiver_id] = now_ns
        self.has_initial_connection = True
        if receiver_window > 0:
            self.retransmit_window = receiver_window
        return sm_position + receiver_window

    def on_end_of_stream(self, receiver_id: int) -> None:
        """The receiver closed its image (an EOS SM): no longer connected."""
        self.receivers.pop(receiver_id, None)

    def expire(self, now_ns: int) -> bool:
        """Forget receivers silent for longer than the connection timeout; True if any went."""
        timeout = self.connection_timeout_ns
        check = self.expire_check_ns
        if now_ns < check[0] and check[1] == timeout:
            return False
        receivers = self.receivers
        expired = [rid for rid, seen in receivers.items() if now_ns - seen > timeout]
        for rid in expired:
            del receivers[rid]
        oldest = min(receivers.values()) if receivers else now_ns
        self.expire_check_ns = (min(oldest, now_ns) + timeout + 1, timeout)
        return bool(expired)

    def next_expiry_ns(self) -> int | None:
        """When the receiver heard from least recently times out (None: no receiver)."""
        if not self.receivers:
            return None
        return min(self.receivers.values()) + self.connection_timeout_ns + 1


class MinFlowControl(FlowControl):
    """``fc=min`` and ``fc=tagged``: the slowest counted receiver sets the pace (module doc).

    ``receivers`` holds every receiver heard from (liveness, as :class:`FlowControl`);
    ``counted`` the position + window of those that hold the sender (all for ``min``, the tagged
    ones for ``tagged``), each dropped after the policy's receiver timeout or its EOS.
    """

    __slots__ = ("counted", "counted_seen", "policy")
    connected_by_any_sm = False  # a group may need more receivers

    def __init__(
        self,
        start_position: int,
        window: int,
        policy: FlowControlPolicy,
        connection_timeout_ns: int = CONNECTION_TIMEOUT_NS,
    ) -> None:
        super().__init__(start_position, window, connection_timeout_ns)
        self.policy = policy
        self.counted: dict[int, int] = {}  # receiver_id -> its last SM position + window
        self.counted_seen: dict[int, int] = {}  # receiver_id -> time of its last counted SM

    @property
    def is_connected(self) -> bool:
        return bool(self.receivers) and len(self.counted) >= self.policy.group_min_size

    def _matches(self, group_tag: int | None) -> bool:
        policy = self.policy
        return policy.strategy == "min" or group_tag == policy.group_tag

    def _move(self, proposed: int | None) -> None:
        """The limit from the counted receivers (or ``proposed`` while none is counted)."""
        counted = self.counted
        if len(counted) < self.policy.group_min_size:
            return
        if counted:
            proposed = min(counted.values())
        if proposed is not None and proposed > self.sender_limit:
            self.sender_limit = proposed

    def on_status_message(
        self,
        receiver_id: int,
        sm_position: int,
        receiver_window: int,
        now_ns: int,
        group_tag: int | None = None,
    ) -> None:
        proposed = self._heard(receiver_id, sm_position, receiver_window, now_ns)
        counted = self.counted
        if self._matches(group_tag):
            if receiver_id in counted:
                counted[receiver_id] = max(counted[receiver_id], proposed)
                self.counted_seen[receiver_id] = now_ns
            elif not counted or proposed >= min(counted.values()) - receiver_window:
                # as Aeron: a receiver more than a window behind the slowest is not waited for
                # (what it misses is gone from the others' past); it still receives
                counted[receiver_id] = proposed
                self.counted_seen[receiver_id] = now_ns
        self._move(proposed)

    def on_end_of_stream(self, receiver_id: int) -> None:
        super().on_end_of_stream(receiver_id)
        self.counted.pop(receiver_id, None)
        self.counted_seen.pop(receiver_id, None)
        self._move(None)

    def refresh(self) -> None:
        gone = [rid for rid in self.counted if rid not in self.receivers]
        for rid in gone:
            del self.counted[rid]
            del self.counted_seen[rid]
        if gone:
            self._move(None)

    def expire(self, now_ns: int) -> bool:
        expired = super().expire(now_ns)
        timeout = self.policy.receiver_timeout_ns
        silent = [rid for rid, seen in self.counted_seen.items() if now_ns - seen > timeout]
        for rid in silent:
            del self.counted[rid]
            del self.counted_seen[rid]
        if expired or silent:
            self.refresh()
        return expired or bool(silent)

    def next_expiry_ns(self) -> int | None:
        nearest = super().next_expiry_ns()
        if self.counted_seen:
            mine = min(self.counted_seen.values()) + self.policy.receiver_timeout_ns + 1
            nearest = mine if nearest is None else min(nearest, mine)
        return nearest


def make_flow_control(
    policy: FlowControlPolicy | None,
    start_position: int,
    window: int,
    connection_timeout_ns: int = CONNECTION_TIMEOUT_NS,
) -> FlowControl:
    """The strategy ``policy`` names (None or ``max``: :class:`FlowControl`), its receivers
    connected while their last SM is at most ``connection_timeout_ns`` old."""
    if policy is None or policy.strategy == "max":
        return FlowControl(start_position, window, connection_timeout_ns)
    return MinFlowControl(start_position, window, policy, connection_timeout_ns)
