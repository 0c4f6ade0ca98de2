"""A token bucket per sender network (a /24 IPv4 or /64 IPv6 prefix), sans I/O: the rate limit
on new images a subscription makes (``setups-per-prefix-per-s``, :mod:`.receiver`) and on the
HELLOs a handshake server answers (``hellos_per_prefix_per_s``, ``handshake.machine``).

Invariants:

* Each prefix has ``rate_per_s`` tokens at most (the burst is one second's worth) and gains
  ``rate_per_s`` a second, computed from ``now_ns`` (a clock going back gains nothing); an event
  takes one token, or is refused when less than one is left.
* At most ``table_limit`` prefixes are tracked: past it, those whose bucket has refilled (as if
  never seen) are forgotten; if none has, a new prefix is refused (a flood from many networks
  cannot grow the table without bound).
"""

from __future__ import annotations

RATE_TABLE_LIMIT = 65536  # prefixes tracked at once


class PrefixRateLimiter:
    """``rate_per_s`` events a second per prefix, with a burst of as many."""

    __slots__ = ("rate_per_s", "table", "table_limit")

    def __init__(self, rate_per_s: float, table_limit: int = RATE_TABLE_LIMIT) -> None:
        self.rate_per_s = float(rate_per_s)
        self.table_limit = table_limit
        self.table: dict[str, tuple[float, int]] = {}  # prefix -> (tokens, at ns)

    def allows(self, prefix: str, now_ns: int) -> bool:
        """Take a token of ``prefix``'s bucket; False (nothing taken) when it has none."""
        rate = self.rate_per_s
        table = self.table
        tokens, at = table.get(prefix, (rate, now_ns))
        tokens = min(rate, tokens + max(now_ns - at, 0) * rate / 1e9)
        if tokens < 1.0:
            table[prefix] = (tokens, max(now_ns, at))
            return False
        if prefix not in table and len(table) >= self.table_limit:
            full = [k for k, (t, a) in table.items() if t + max(now_ns - a, 0) * rate / 1e9 >= rate]
            for key in full:
                del table[key]
            if len(table) >= self.table_limit:
                return False
        table[prefix] = (tokens - 1.0, max(now_ns, at))
        return True
