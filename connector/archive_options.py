"""Options of the ``aeron`` source in archive mode: ``.option("archive", "<control channel>")``.

Archive mode reads the recordings of a real Aeron Archive instead of a stream server's. Its own
options are :data:`ARCHIVE_SOURCE_OPTIONS`; the payload and trigger options are the source's
(:func:`~aeron_spark.connector.options.parse_source_options` parses them, so they mean the same);
options that only make sense with a stream server are refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aeron_spark.connector.options import (
    SOURCE_OPTIONS,
    SPARK_OPTIONS,
    SinkOptions,
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import ChannelConfig, ChannelError
from aeron_spark.transport.archive.client import ArchiveClient

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

DEFAULT_STAGING_STREAM_ID = 0x5AFE0021  # staging recordings' stream id (not a row stream)

# Stream-server options that archive mode does not take, and why.
_NOT_IN_ARCHIVE_MODE = {
    "endpoint": "archive mode reads the archive named by `archive`, not a stream server",
    "consumerid": "an Aeron Archive keeps no consumer positions (purge it yourself)",
    "localreads": "archive mode always replays through the archive",
    "readon": "archive mode reads on executors",
    "startingtimestamp": "an Aeron Archive keeps no per-message time index",
    "startingpositionsbytimestamp": "an Aeron Archive keeps no per-message time index",
    "endingtimestamp": "an Aeron Archive keeps no per-message time index",
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


def _split_options(
    options: Mapping[str, str], own: Mapping[str, object]
) -> tuple[dict[str, str], dict[str, str]]:
    rest: dict[str, str] = {}
    mine: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in own:
            mine[name] = str(value)
        elif name in _NOT_IN_ARCHIVE_MODE:
            spelled = SOURCE_OPTIONS[name][0]  # Spark hands options over in lower case
            raise ConfigurationError(
                spelled, value, f"no {spelled} with archive ({_NOT_IN_ARCHIVE_MODE[name]})"
            )
        else:
            rest[str(key)] = value
    return mine, rest


def _connect_parts(mine: dict[str, str]) -> tuple[str, int, str | None]:
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
    return control, stream, mine.get("archiveresponsehost", "").strip() or None


def parse_archive_source_options(options: Mapping[str, str]) -> ArchiveSourceOptions:
    mine, rest = _split_options(options, ARCHIVE_SOURCE_OPTIONS)
    control, stream, host = _connect_parts(mine)
    source = parse_source_options(rest)
    if source.read_on != "executors":
        raise ConfigurationError("readOn", source.read_on, "executors in archive mode")
    return ArchiveSourceOptions(
        connect=ArchiveConnect(control, stream, host, source.settings.timeout_s),
        channel=mine.get("channel", "").strip(),
        source=source,
    )


# name (lower case) -> (canonical name, default text, meaning) of the sink in archive mode.
ARCHIVE_SINK_OPTIONS: dict[str, tuple[str, str, str]] = {
    "archive": ARCHIVE_SOURCE_OPTIONS["archive"],
    "channel": (
        "channel",
        "(required with archive)",
        "a UDP channel on the archive's host the archive subscribes to, where batches are "
        "appended to the sink's target recording, e.g. aeron:udp?endpoint=archive-host:40456 "
        "(term-length and mtu in it shape a new target; default 1m and 1408)",
    ),
    "archivestagingchannel": (
        "archiveStagingChannel",
        "(channel)",
        "the UDP channel on the archive's host tasks stage their rows on",
    ),
    "archivestagingstreamid": (
        "archiveStagingStreamId",
        str(DEFAULT_STAGING_STREAM_ID),
        "the stream id of staging recordings (not the target's)",
    ),
    "archivecontrolstreamid": ARCHIVE_SOURCE_OPTIONS["archivecontrolstreamid"],
    "archiveresponsehost": ARCHIVE_SOURCE_OPTIONS["archiveresponsehost"],
}
_TARGET_TERM_LENGTH = 1 << 20
# Parameters the sink sets itself on the channels it publishes on and records.
SINK_SET_PARAMS = (
    "session-id",
    "alias",
    "init-term-id",
    "term-id",
    "term-offset",
    "term-length",
    "mtu",
)


@dataclass(frozen=True, slots=True)
class ArchiveSinkOptions:
    connect: ArchiveConnect
    channel: str  # the target's channel, without the parameters the sink sets
    staging_channel: str
    staging_stream_id: int
    term_length: int  # of a new target recording and of staging recordings
    mtu: int
    sink: SinkOptions  # stream id, sinkId, format, timeout


def _udp_channel(name: str, text: str) -> tuple[str, ChannelConfig]:
    try:
        config = ChannelConfig.from_uri(text)
    except ChannelError as exc:
        raise ConfigurationError(name, text, f"an Aeron UDP channel URI ({exc})") from None
    if config.media != "udp" or config.endpoint is None or config.spy:
        raise ConfigurationError(
            name,
            text,
            "a UDP channel with an endpoint on the archive's host, "
            "e.g. aeron:udp?endpoint=archive-host:40456",
        )
    head, _, query = text.partition("?")
    kept = [p for p in query.split("|") if p and p.split("=", 1)[0] not in SINK_SET_PARAMS]
    return head + "?" + "|".join(kept), config


def parse_archive_sink_options(options: Mapping[str, str]) -> ArchiveSinkOptions:
    mine, rest = _split_options(options, ARCHIVE_SINK_OPTIONS)
    for key in rest:
        if key.lower() == "localwrites":
            raise ConfigurationError("localWrites", rest[key], "no localWrites with archive")
    control, stream, host = _connect_parts(mine)
    if not mine.get("channel", "").strip():
        raise ConfigurationError(
            "channel",
            None,
            "a UDP channel on the archive's host for the sink's target recording with "
            "archive, e.g. aeron:udp?endpoint=archive-host:40456",
        )
    channel, config = _udp_channel("channel", mine["channel"].strip())
    staging_text = mine.get("archivestagingchannel", "").strip() or mine["channel"].strip()
    staging, _ = _udp_channel("archiveStagingChannel", staging_text)
    try:
        staging_stream = int(mine.get("archivestagingstreamid", DEFAULT_STAGING_STREAM_ID))
    except ValueError:
        staging_stream = None  # type: ignore[assignment]
    if staging_stream is None or not -(2**31) <= staging_stream < 2**31:
        raise ConfigurationError(
            "archiveStagingStreamId", mine.get("archivestagingstreamid"), "an int32 stream id"
        )
    sink = parse_sink_options(rest)
    if staging_stream == sink.stream_id:
        raise ConfigurationError(
            "archiveStagingStreamId", staging_stream, "a stream id other than the target's"
        )
    query = mine["channel"].partition("?")[2]
    has = {p.split("=", 1)[0] for p in query.split("|") if p}
    return ArchiveSinkOptions(
        connect=ArchiveConnect(control, stream, host, sink.settings.timeout_s),
        channel=channel,
        staging_channel=staging,
        staging_stream_id=staging_stream,
        term_length=config.term_length if "term-length" in has else _TARGET_TERM_LENGTH,
        mtu=config.mtu,
        sink=sink,
    )


def connect(c: ArchiveConnect) -> ArchiveClient:
    """A control session with the archive ``c`` names (the source's and the sink's)."""
    return ArchiveClient.connect(
        c.control_channel,
        control_stream_id=c.control_stream_id,
        response_host=c.response_host,
        timeout_s=c.timeout_s,
    )


__all__ = [
    "ARCHIVE_SINK_OPTIONS",
    "ARCHIVE_SOURCE_OPTIONS",
    "ArchiveConnect",
    "ArchiveSinkOptions",
    "ArchiveSourceOptions",
    "connect",
    "DEFAULT_STAGING_STREAM_ID",
    "parse_archive_sink_options",
    "SPARK_OPTIONS",
    "is_archive_mode",
    "parse_archive_source_options",
]
