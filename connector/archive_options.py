"""Options of the ``aeron`` source in archive mode: ``.option("archive", "<control channel>")``.

Archive mode reads the recordings of a real Aeron Archive instead of a stream server's. Its own
options are :data:`ARCHIVE_SOURCE_OPTIONS`; the payload and trigger options are the source's
(:func:`~aeron_spark.connector.options.parse_source_options` parses them, so they mean the same);
options that only make sense with a stream server are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aeron_spark.connector.options import SPARK_OPTIONS, SourceOptions, parse_source_options
from aeron_spark.transport import ChannelConfig, ChannelError

from aeron_spark.errors import ConfigurationError

# name (lower case) -> (canonical name, default text, meaning); for the README's table.
ARCHIVE_SOURCE_OPTIONS: dict[str, tuple[str, str, str]] = {
    "archive": (
        "archive",
        "(required for archive mode)",
        "the archive's control request channel, e.g. aeron:udp?endpoint=archive-host:8010",
    ),
    "channel": (
        "channel",
        "(any)",
        "only recordings whose channel contains this text (e.g. aeron:udp?endpoint=host:40456)",
    ),
    "archivecontrolstreamid": (
        "archiveControlStreamId",
        "10",
        "the archive's control request stream id",
    ),
    "archiveresponsehost": (
        "archiveResponseHost",
        "(the local address routing to the archive)",
        "the address of this host the archive sends responses and replays to",
    ),
}

# Stream-server options that archive mode does not take, and why.
_NOT_IN_ARCHIVE_MODE = {
    "endpoint": "archive mode reads the archive named by `archive`, not a stream server",
    "consumerid": "an Aeron Archive keeps no consumer positions (purge it yourself)",
    "localreads": "archive mode always replays through the archive",
    "readon": "archive mode reads on executors",
    "startingtimestamp": "an Aeron Archive keeps no per-message time index",
    "encryption": "the archive control protocol has no encryption",
    "keystore": "the archive control protocol has no server keys",
    "serverkey": "the archive control protocol has no server keys",
    "trustonfirstuse": "the archive control protocol has no server keys",
}


@dataclass(frozen=True, slots=True)
class ArchiveConnect:
    """How a task reaches the archive (small, frozen, picklable)."""

    control_channel: str
    control_stream_id: int = 10
    response_host: str | None = None
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class ArchiveSourceOptions:
    connect: ArchiveConnect
    channel: str  # recordings whose stripped channel contains this ("" : all)
    source: SourceOptions  # stream ids, positions, limits, format


def is_archive_mode(options: Mapping[str, str]) -> bool:
    return any(str(k).lower() == "archive" for k in options)


def parse_archive_source_options(options: Mapping[str, str]) -> ArchiveSourceOptions:
    rest: dict[str, str] = {}
    mine: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in ARCHIVE_SOURCE_OPTIONS:
            mine[name] = str(value)
        elif name in _NOT_IN_ARCHIVE_MODE:
            raise ConfigurationError(
                str(key), value, f"no {key} with archive ({_NOT_IN_ARCHIVE_MODE[name]})"
            )
        else:
            rest[str(key)] = value
    control = mine.get("archive", "").strip()
    try:
        config = ChannelConfig.from_uri(control)
    except ChannelError:
        config = None
    if config is None or config.media != "udp" or config.endpoint is None:
        raise ConfigurationError(
            "archive",
            control,
            "the archive's UDP control request channel, e.g. aeron:udp?endpoint=archive-host:8010",
        )
    try:
        stream = int(mine.get("archivecontrolstreamid", "10"))
    except ValueError:
        stream = None
    if stream is None or not -(2**31) <= stream < 2**31:
        raise ConfigurationError(
            "archiveControlStreamId", mine.get("archivecontrolstreamid"), "an int32 stream id"
        )
    source = parse_source_options(rest)
    if source.read_on != "executors":
        raise ConfigurationError("readOn", source.read_on, "executors in archive mode")
    host = mine.get("archiveresponsehost", "").strip() or None
    return ArchiveSourceOptions(
        connect=ArchiveConnect(control, stream, host, source.settings.timeout_s),
        channel=mine.get("channel", "").strip(),
        source=source,
    )


__all__ = [
    "ARCHIVE_SOURCE_OPTIONS",
    "ArchiveConnect",
    "ArchiveSourceOptions",
    "SPARK_OPTIONS",
    "is_archive_mode",
    "parse_archive_source_options",
]
