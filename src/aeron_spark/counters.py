"""One registry of named counters, in the spirit of Aeron's ``SystemCounterDescriptor``.

Every counter any layer keeps is declared once here, as a :class:`CounterDescriptor` (a stable
``id``, a ``name``, a :class:`CounterType` and a one-line description). The counter sets that hold
the values register into :data:`REGISTRY`:

- dataclasses of integer fields (the driver's ``SystemCounters``, the handshake's
  ``ServerCounters`` and ``SealCounters``, a stream client's ``ClientCounters``) with the
  :func:`counter_set` decorator, which keeps them plain attribute increments on the hot path;
- name-keyed counts (the stream server core's, retention's) as a :class:`CounterMap`, a ``dict``
  that refuses a name nobody declared (a typo is an error, not a new counter).

Readers (``aeron-spark stat``, ``driver.counters``, ``Server.stats``,
``StreamClient.client_counters``) take their snapshots through
:meth:`CounterRegistry.snapshot`, so every exported name is a declared one.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar, TypeVar


class CounterType(enum.IntEnum):
    """Which family a counter belongs to (Aeron's counter type id)."""

    TRANSPORT = 1  # a driver's system counters
    HANDSHAKE = 2  # a handshake server's admission counters
    SEAL = 3  # what a session's opener accepted and rejected
    SERVER = 4  # the stream server core (requests, replays, sessions, sink commits)
    RETENTION = 5  # the stream server's retention runs
    # a handshake server's I/O: its HELLO images, reply publications, sealed frames (gauges too)
    HANDSHAKE_SERVER = 6
    # a stream client's (``StreamClient``) sessions replaced, retries, replays, local reads
    CLIENT = 7


@dataclass(frozen=True, slots=True)
class CounterDescriptor:
    """A declared counter: ``id`` is unique in the process, ``(type, name)`` is its key."""

    id: int
    type: CounterType
    name: str
    description: str = ""


class CounterRegistry:
    """Every declared counter, by ``(type, name)``, in declaration order (ids ascending)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[CounterType, str], CounterDescriptor] = {}
        self._lock = threading.Lock()

    def register(self, type_: CounterType, name: str, description: str = "") -> CounterDescriptor:
        """Declare ``name`` of ``type_`` (idempotent: the same key gets the same descriptor)."""
        with self._lock:
            key = (type_, name)
            found = self._by_key.get(key)
            if found is None:
                found = CounterDescriptor(len(self._by_key) + 1, type_, name, description)
                self._by_key[key] = found
            return found

    def descriptor(self, type_: CounterType, name: str) -> CounterDescriptor:
        """The descriptor of a declared counter; ``KeyError`` for an undeclared one."""
        return self._by_key[(type_, name)]

    def is_declared(self, type_: CounterType, name: str) -> bool:
        return (type_, name) in self._by_key

    def of_type(self, type_: CounterType) -> list[CounterDescriptor]:
        return [d for d in self._by_key.values() if d.type is type_]

    def __iter__(self) -> Any:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)

    def snapshot(self, type_: CounterType, values: object) -> dict[str, int]:
        """``name -> value`` of the declared counters of ``type_`` that ``values`` holds (a
        :func:`counter_set` dataclass, a :class:`CounterMap` or any mapping of declared names);
        an undeclared name is a ``KeyError`` (the registry is the one list of what is exported).
        """
        if isinstance(values, Mapping):
            items: Iterable[tuple[str, Any]] = values.items()
        elif is_dataclass(values):
            items = ((f.name, getattr(values, f.name)) for f in fields(values))
        else:
            raise TypeError(f"not a counter set: {type(values).__name__}")
        out: dict[str, int] = {}
        for name, value in items:
            self.descriptor(type_, name)
            out[name] = value
        return out


REGISTRY = CounterRegistry()

_C = TypeVar("_C")


def counter_set(type_: CounterType, registry: CounterRegistry = REGISTRY) -> Any:
    """Class decorator: declare every field of a dataclass of counts as a counter of ``type_``.

    The class gains ``counter_type`` and ``descriptors`` (field order) and stays a plain
    dataclass: incrementing a counter is an attribute add. A field's description is its
    ``metadata["description"]`` when given.
    """

    def wrap(cls: type[_C]) -> type[_C]:
        if not is_dataclass(cls):
            raise TypeError(f"{cls.__name__} must be a dataclass")
        descriptors = tuple(
            registry.register(type_, f.name, str(f.metadata.get("description", "")))
            for f in fields(cls)
        )
        cls.counter_type = type_  # type: ignore[attr-defined]
        cls.descriptors = descriptors  # type: ignore[attr-defined]
        return cls

    return wrap


_set = dict.__setitem__


class CounterMap(dict[str, int]):
    """Name-keyed counts of one :class:`CounterType`, all declared in the registry.

    ``always`` names start at zero (and so always appear in a snapshot); ``optional`` names are
    declared but appear only once counted. Setting an undeclared name raises ``KeyError``.
    """

    counter_type: ClassVar[CounterType]

    def __init__(
        self,
        type_: CounterType,
        always: Iterable[str],
        optional: Iterable[str] = (),
        registry: CounterRegistry = REGISTRY,
    ) -> None:
        always = tuple(always)
        super().__init__(dict.fromkeys(always, 0))
        self.type = type_
        self._allowed = frozenset(always) | frozenset(optional)
        for name in (*always, *optional):
            registry.register(type_, name)

    def __setitem__(self, name: str, value: int) -> None:
        if name not in self._allowed:
            raise KeyError(f"undeclared {self.type.name} counter {name!r}")
        _set(self, name, value)  # dict's own (no super() built at every count)

    def add(self, name: str, amount: int = 1) -> None:
        """Count ``amount`` more (an optional counter starts at zero)."""
        self[name] = self.get(name, 0) + amount

    def add_all(self, amounts: dict[str, int]) -> None:
        """Count each of ``amounts`` more, in one call (a publish's counters: one Python call
        where ``+=`` on each was a ``__setitem__`` call each). All or nothing: an undeclared
        name raises ``KeyError`` before any is counted."""
        if not amounts.keys() <= self._allowed:
            undeclared = sorted(amounts.keys() - self._allowed)
            raise KeyError(f"undeclared {self.type.name} counters {undeclared}")
        for name, amount in amounts.items():
            _set(self, name, self.get(name, 0) + amount)


__all__ = [
    "REGISTRY",
    "CounterDescriptor",
    "CounterMap",
    "CounterRegistry",
    "CounterType",
    "counter_set",
]
