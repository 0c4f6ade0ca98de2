"""Transition tables of the transport's lifecycles (publication, image), after the handshake's.

A lifecycle is an enum of states, an enum of events and one table ``{(state, event): next}``.
:func:`step` is the only way a state changes: a pair the table does not list is a bug on our side
(the events are our own decisions, never a peer's bytes), raised as
:class:`~aeron_spark.transport.errors.LocalProtocolError`.

:func:`reaches` answers the question the tests ask of every table: from which states can the
final one be reached at all.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from aeron_spark.transport.errors import LocalProtocolError

S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


def step(table: Mapping[tuple[S, E], S], state: S, event: E, what: str) -> S:
    """The state after ``event`` in ``state``; raises LocalProtocolError if the table has none."""
    try:
        return table[(state, event)]
    except KeyError:
        raise LocalProtocolError(
            f"{what}: {event.value!r} is not allowed in state {state.value!r}"
        ) from None


def reaches(table: Mapping[tuple[S, E], S], final: S) -> set[S]:
    """The states from which some sequence of the table's transitions ends in ``final``."""
    found = {final}
    grew = True
    while grew:
        grew = False
        for (state, _), target in table.items():
            if target in found and state not in found:
                found.add(state)
                grew = True
    return found


__all__ = ["reaches", "step"]
