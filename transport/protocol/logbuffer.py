"""Log buffer geometry and position arithmetic, as in Aeron's ``LogBufferDescriptor``.

A log buffer is three term partitions of ``term_length`` bytes each, followed by a metadata
region. A stream *position* is a 64-bit byte count since the start of the stream::

    position = (int32_wrap(term_id - initial_term_id) << log2(term_length)) + term_offset

The inverse takes the same initial term id. Term ids wrap around as 32-bit signed integers.
Partition index = (position >> shift) % 3 = (term_id - initial_term_id) % 3.

Everything above the transport (archive, handshake, connector) speaks in positions.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

from aeron_spark.transport.errors import ChannelError
from aeron_spark.transport.protocol.frames import DATA_HEADER_LENGTH, FRAME_ALIGNMENT

PARTITION_COUNT = 3
TERM_MIN_LENGTH = 64 * 1024
TERM_MAX_LENGTH = 1024 * 1024 * 1024
MAX_UDP_PAYLOAD_LENGTH = 65504
MAX_MESSAGE_LENGTH_CAP = 16 * 1024 * 1024
DEFAULT_MTU_LENGTH = 1408
DEFAULT_TERM_LENGTH = 16 * 1024 * 1024
DEFAULT_IPC_TERM_LENGTH = 64 * 1024 * 1024
DEFAULT_RECEIVER_WINDOW_LENGTH = 128 * 1024
RESERVED_SESSION_ID_LOW = -1
RESERVED_SESSION_ID_HIGH = 1000
LOG_META_DATA_LENGTH = 4096

_INT32_MASK = 0xFFFFFFFF


def allocate_log(length: int) -> mmap.mmap:
    """Zeroed memory for an in-process log buffer (a publication's or an image's terms).

    Anonymous private memory: the kernel hands out zero pages as they are first touched, so a
    session whose terms are mostly never written (most are: a control exchange, a short replay)
    does not pay for zeroing all of them up front, as ``bytearray(length)`` would (24 MiB for an
    8 MiB term, on every connect)."""
    return mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


#: Consumed bytes of a log given back to the kernel at a time (one ``madvise`` each): at most
#: this, at least a page, and an eighth of a term on small terms.
RELEASE_CHUNK = 1024 * 1024


def release_chunk(term_length: int) -> int:
    return max(mmap.PAGESIZE, min(RELEASE_CHUNK, term_length // 8))


def release_range(log: mmap.mmap, start: int, end: int) -> int:
    """Give the pages wholly inside bytes ``[start, end)`` of an :func:`allocate_log` log back to
    the kernel (``MADV_DONTNEED``): they read as zeros after, as a cleaned term does, and cost no
    memory until written again. Returns the bytes given back.

    A log's terms are touched as they are written and zeroing a term to clean it keeps its pages:
    a session's logs each grew to their three terms' size however slowly they were written (a
    server's session 2 x 24 MiB; issue 31 item 6, the soak's growth without a plateau)."""
    page = mmap.PAGESIZE
    low = -(-start // page) * page
    high = end // page * page
    if high <= low:
        return 0
    log.madvise(mmap.MADV_DONTNEED, low, high - low)
    return high - low


def release_positions(log: mmap.mmap, start: int, end: int, shift: int) -> int:
    """:func:`release_range` over the stream positions ``[start, end)``, in however many terms
    (partitions) they lie."""
    term_length = 1 << shift
    released = 0
    while start < end:
        term_start = start >> shift << shift
        stop = min(end, term_start + term_length)
        base = ((start >> shift) % PARTITION_COUNT) * term_length - term_start
        released += release_range(log, base + start, base + stop)
        start = stop
    return released


def wrap_int32(value: int) -> int:
    """``value`` reduced to a signed 32-bit integer, as Java/C int arithmetic would wrap it."""
    value &= _INT32_MASK
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_term_length(term_length: int, name: str = "term-length") -> int:
    if not (is_power_of_two(term_length) and TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH):
        raise ChannelError(
            name, term_length, "a power of two from 65536 (64 KiB) to 1073741824 (1 GiB)"
        )
    return term_length


def check_mtu(mtu: int, name: str = "mtu") -> int:
    if not (DATA_HEADER_LENGTH < mtu <= MAX_UDP_PAYLOAD_LENGTH and mtu % FRAME_ALIGNMENT == 0):
        raise ChannelError(name, mtu, "a multiple of 32 greater than 32 and at most 65504")
    return mtu


def position_bits_to_shift(term_length: int) -> int:
    return term_length.bit_length() - 1


def compute_position(term_id: int, term_offset: int, shift: int, initial_term_id: int) -> int:
    """Stream position of ``term_offset`` within ``term_id``."""
    return (wrap_int32(term_id - initial_term_id) << shift) + term_offset


def compute_term_id(position: int, shift: int, initial_term_id: int) -> int:
    return wrap_int32(initial_term_id + (position >> shift))


def compute_term_offset(position: int, term_length: int) -> int:
    return position & (term_length - 1)


def index_by_position(position: int, shift: int) -> int:
    return (position >> shift) % PARTITION_COUNT


def index_by_term(initial_term_id: int, term_id: int) -> int:
    return wrap_int32(term_id - initial_term_id) % PARTITION_COUNT


def max_message_length(term_length: int) -> int:
    """Largest message a publication accepts: min(term_length / 8, 16 MiB)."""
    return min(term_length // 8, MAX_MESSAGE_LENGTH_CAP)


def max_payload_length(mtu: int) -> int:
    """Largest payload carried by one frame."""
    return mtu - DATA_HEADER_LENGTH


def receiver_window_length(
    term_length: int, initial_window: int = DEFAULT_RECEIVER_WINDOW_LENGTH
) -> int:
    """Receiver window: the configured initial window, capped at half a term."""
    return min(initial_window, term_length // 2)


def is_reserved_session_id(session_id: int) -> bool:
    return RESERVED_SESSION_ID_LOW <= session_id <= RESERVED_SESSION_ID_HIGH


@dataclass(frozen=True, slots=True)
class LogGeometry:
    """The fixed shape of one log buffer, validated on construction."""

    term_length: int
    mtu: int
    initial_term_id: int

    def __post_init__(self) -> None:
        check_term_length(self.term_length)
        check_mtu(self.mtu)
        if self.mtu > self.term_length // 2:
            raise ChannelError(
                "mtu", self.mtu, f"at most half the term length ({self.term_length // 2})"
            )

    @property
    def shift(self) -> int:
        return position_bits_to_shift(self.term_length)

    @property
    def max_message_length(self) -> int:
        return max_message_length(self.term_length)

    @property
    def max_payload_length(self) -> int:
        return max_payload_length(self.mtu)

    @property
    def log_length(self) -> int:
        return PARTITION_COUNT * self.term_length + LOG_META_DATA_LENGTH

    def position(self, term_id: int, term_offset: int) -> int:
        return compute_position(term_id, term_offset, self.shift, self.initial_term_id)

    def term_id(self, position: int) -> int:
        return compute_term_id(position, self.shift, self.initial_term_id)

    def term_offset(self, position: int) -> int:
        return position & (self.term_length - 1)

    def partition(self, position: int) -> int:
        return (position >> self.shift) % PARTITION_COUNT

    def framed_length(self, message_length: int) -> int:
        """Bytes of term a message of ``message_length`` occupies once fragmented and aligned."""
        max_payload = self.max_payload_length
        if message_length <= max_payload:
            return _align(message_length + DATA_HEADER_LENGTH)
        full, last = divmod(message_length, max_payload)
        length = full * _align(max_payload + DATA_HEADER_LENGTH)
        if last:
            length += _align(last + DATA_HEADER_LENGTH)
        return length


def _align(value: int) -> int:
    return (value + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
