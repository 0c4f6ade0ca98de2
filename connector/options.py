"""Every option of the ``aeron`` data source, parsed and validated in one place.

Spark hands options over as a case-insensitive mapping of strings. :func:`parse_source_options`
and :func:`parse_sink_options` turn them into frozen dataclasses; anything unknown or malformed
raises :class:`~aeron_spark.errors.ConfigurationError` naming the option and what it accepts, so a
bad query fails at ``load()`` / ``save()`` / ``start()``, before any task runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from aeron_spark.connector.formats_sbe import SbeOptions, parse_sbe_options
from aeron_spark.connector.session.settings import ClientSettings
from aeron_spark.transport import ChannelConfig, ChannelError

from aeron_spark.errors import ConfigurationError

SOURCE_FORMATS = ("binary", "text", "arrow", "json", "msgpack", "sbe")
SINK_FORMATS = ("binary", "text", "arrow", "json", "msgpack", "sbe")
BAD_RECORD_POLICIES = ("fail", "drop", "column")

# name (lower case) -> (canonical name, default text, meaning); the README's tables come from here.
# How a source or sink reaches and trusts the stream server (the same options on both sides).
_SESSION_OPTIONS: dict[str, tuple[str, str, str]] = {
    "encryption": ("encryption", "true", "seal the session with AES-GCM (must match the server)"),
    "keystore": (
        "keyStore",
        "~/.aeron-spark/keys",
        "key store directory of known server keys and of this client's identity (client.key)",
    ),
    "clientkey": (
        "clientKey",
        "",
        "file holding this client's identity private key (64 hex digits, mode 0600, owned by "
        "the executor's user) on every executor host; default: client.key in keyStore",
    ),
    "serverkey": ("serverKey", "", "pin the server's public key (hex)"),
    "trustonfirstuse": ("trustOnFirstUse", "true", "accept and remember an unknown server key"),
    "timeoutms": ("timeoutMs", "30000", "bound on connecting and on every wait for the server"),
}

SOURCE_OPTIONS: dict[str, tuple[str, str, str]] = {
    "endpoint": (
        "endpoint",
        "127.0.0.1:40123",
        "stream server host:port, or several separated by commas (all read together)",
    ),
    "streamid": ("streamId", "(required, or streamIds)", "stream to read"),
    "streamids": ("streamIds", "", "comma-separated stream ids to read together"),
    "startingpositions": (
        "startingPositions",
        "earliest",
        'earliest, latest, or JSON {"recording_id": position}; recordings not '
        "named start at earliest",
    ),
    "startingtimestamp": (
        "startingTimestamp",
        "",
        "epoch milliseconds: start each recording at its "
        "first message recorded at or after this time (overrides startingPositions)",
    ),
    "startingpositionsbytimestamp": (
        "startingPositionsByTimestamp",
        "",
        'JSON {"recording_id": epoch ms}: start each named recording at its first message '
        "recorded at or after its time (overrides startingPositions; startingTimestamp "
        "overrides it)",
    ),
    "endingtimestamp": (
        "endingTimestamp",
        "",
        "batch reads only: epoch milliseconds; end each recording before its first message "
        "recorded at or after this time (overrides endingPositions)",
    ),
    "endingpositions": (
        "endingPositions",
        "latest",
        'batch reads only: latest, or JSON {"recording_id": position}',
    ),
    "failondataloss": (
        "failOnDataLoss",
        "true",
        "fail when a wanted range was purged; false skips to the first readable position",
    ),
    "format": (
        "format",
        "binary",
        "binary (value column + metadata), text (value as string), arrow (each message an "
        "Arrow IPC stream: its columns are the rows), json (each message one JSON object), "
        "msgpack (each message one map), decoded into `schema`, or sbe (each message one SBE "
        "message of sbeMessage, typed by sbeSchema)",
    ),
    "schema": (
        "schema",
        "",
        "arrow, json, msgpack: the rows' schema as Spark DDL (default: the first message's)",
    ),
    "badrecordspolicy": (
        "badRecordsPolicy",
        "fail",
        "json, msgpack, text: a message that does not decode: fail (naming its position), "
        "drop, or column (null data, its bytes in corruptRecordColumn)",
    ),
    "corruptrecordcolumn": (
        "corruptRecordColumn",
        "_corrupt_record",
        "badRecordsPolicy=column: name of the binary column holding bad messages",
    ),
    "includemetadata": (
        "includeMetadata",
        "false",
        "json, msgpack, sbe: also give stream_id, session_id, recording_id, position, timestamp, "
        "reserved_value",
    ),
    "sbeschema": (
        "sbeSchema",
        "(required with format=sbe)",
        "format=sbe: the SBE message schema, a path to its XML file or the XML text",
    ),
    "sbemessage": (
        "sbeMessage",
        "(the schema's only message)",
        "format=sbe: the message (template) to read, by name or template id",
    ),
    "sbeenums": ("sbeEnums", "names", "format=sbe: enum columns as names (string) or raw values"),
    "sbeothertemplates": (
        "sbeOtherTemplates",
        "fail",
        "format=sbe: a message of another template or schema: fail (naming its position and "
        "template id) or skip (counted in the executor's log)",
    ),
    "maxmessagespertrigger": (
        "maxMessagesPerTrigger",
        "",
        "at most this many messages per micro-batch (over all recordings)",
    ),
    "maxbytespertrigger": (
        "maxBytesPerTrigger",
        "",
        "at most about this many recorded bytes per micro-batch (at least one message)",
    ),
    "minmessagespertrigger": (
        "minMessagesPerTrigger",
        "",
        "wait until this many messages are available (or maxTriggerDelayMs passed)",
    ),
    "maxtriggerdelayms": (
        "maxTriggerDelayMs",
        "900000",
        "with minMessagesPerTrigger: run a batch with fewer messages after this long "
        '(milliseconds, or a duration as Kafka\'s maxTriggerDelay: "30s", "15m", "1h")',
    ),
    "minpartitions": (
        "minPartitions",
        "",
        "split recording ranges at message boundaries into at least this many partitions",
    ),
    "localreads": (
        "localReads",
        "true",
        "read a range from the server's recording files when the reading process sees them "
        "(same host or shared volume; the server checks the range and proves the files are "
        "its own), else replay it over the session; false always replays",
    ),
    "readon": (
        "readOn",
        "executors",
        "streaming: executors (each task replays its range in its own session) or driver (the "
        "driver reads each micro-batch as it plans it and Spark hands the rows to the tasks "
        "with no Python worker: lowest latency for light streams; every row passes through "
        "the driver)",
    ),
    "consumerid": (
        "consumerId",
        "",
        "streaming: a stable name under which each micro-batch's commit tells the servers how "
        "far this query has read, so their retention keeps what it has not (keep it across "
        "restarts; aeron-spark consumers forget NAME when the query is gone)",
    ),
    **_SESSION_OPTIONS,
}

SINK_OPTIONS: dict[str, tuple[str, str, str]] = {
    "endpoint": ("endpoint", "127.0.0.1:40123", "stream server session endpoint host:port"),
    "streamid": ("streamId", "(required)", "stream to append to"),
    "sinkid": (
        "sinkId",
        "(required for streaming)",
        "stable identity of this sink: the server "
        "commits each (sinkId, batch) once; keep it across restarts of the query",
    ),
    "format": (
        "format",
        "binary",
        "binary (a binary `value` column), text (a string `value` column), arrow (all "
        "columns; each task's Arrow batches become Arrow IPC messages of about 60 KiB), json "
        "(each row one JSON object), msgpack (each row one map) or sbe (each row one SBE message "
        "of sbeMessage)",
    ),
    "sbeschema": (
        "sbeSchema",
        "(required with format=sbe)",
        "format=sbe: the SBE message schema, a path to its XML file or the XML text",
    ),
    "sbemessage": (
        "sbeMessage",
        "(the schema's only message)",
        "format=sbe: the message (template) each row becomes, by name or template id",
    ),
    "sbeenums": ("sbeEnums", "names", "format=sbe: enum columns hold names (string) or raw values"),
    "compression": (
        "compression",
        "none",
        "format=arrow: compress the Arrow IPC messages with lz4 or zstd (readers need nothing: "
        "Arrow IPC says how it is compressed)",
    ),
    "localwrites": (
        "localWrites",
        "true",
        "a task that can write the server's directory (same host or shared volume) writes its "
        "staged part file there itself and the server checks every record; else, or with "
        "false, it stages over its session",
    ),
    "channel": (
        "channel",
        "",
        "raw mode: publish rows straight to this Aeron channel (no server; at-least-once)",
    ),
    **_SESSION_OPTIONS,
}

StartSpec = Literal["earliest", "latest"] | dict[str, int]


def _bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigurationError(name, value, "true or false")


def _int(name: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ConfigurationError(name, value, f"an integer from {low} to {high}") from None
    if not low <= number <= high:
        raise ConfigurationError(name, value, f"an integer from {low} to {high}")
    return number


def _positions(name: str, value: str, keywords: tuple[str, ...]) -> StartSpec:
    text = value.strip()
    if text.lower() in keywords:
        return text.lower()  # type: ignore[return-value]
    expected = " or ".join(keywords) + ' or a JSON object {"recording_id": position}'
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ConfigurationError(name, value, expected) from None
    if not isinstance(parsed, dict):
        raise ConfigurationError(name, value, expected)
    out: dict[str, int] = {}
    for key, pos in parsed.items():
        rid = str(key).rpartition("/")[2]
        if not rid.isdigit():
            raise ConfigurationError(
                name,
                value,
                expected + ' with keys "recording_id" (or "host:port/recording_id" '
                "when reading from several servers)",
            )
        if not isinstance(pos, int) or isinstance(pos, bool) or pos < 0:
            raise ConfigurationError(name, value, expected + " with non-negative integer positions")
        out[str(key)] = pos
    return out


# Options Spark itself passes along with the user's (not ours to validate).
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


def _check_known(
    options: Mapping[str, str], known: dict[str, tuple[str, str, str]], kind: str
) -> dict[str, str]:
    lowered: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in SPARK_OPTIONS:
            continue
        if name not in known:
            names = ", ".join(spec[0] for spec in known.values())
            raise ConfigurationError(str(key), value, f"a known {kind} option ({names})")
        lowered[name] = str(value)
    return lowered


def _settings(o: dict[str, str]) -> ClientSettings:
    timeout_ms = _int("timeoutMs", o.get("timeoutms", "30000"), 1, 3_600_000)
    return ClientSettings(
        endpoint=o.get("endpoint", "127.0.0.1:40123").strip(),
        encryption=_bool("encryption", o.get("encryption", "true")),
        key_store_dir=o.get("keystore") or None,
        server_key=o.get("serverkey") or None,
        trust_on_first_use=_bool("trustOnFirstUse", o.get("trustonfirstuse", "true")),
        timeout_s=timeout_ms / 1000.0,
        client_key=o.get("clientkey") or None,
    )


def _stream_ids(o: dict[str, str], required: bool = True) -> tuple[int, ...]:
    ids: list[int] = []
    if "streamid" in o:
        ids.append(_int("streamId", o["streamid"], -(2**31), 2**31 - 1))
    if "streamids" in o:
        for part in o["streamids"].split(","):
            if part.strip():
                ids.append(_int("streamIds", part, -(2**31), 2**31 - 1))
    if not ids and required:
        raise ConfigurationError("streamId", None, "a stream id (option streamId or streamIds)")
    return tuple(sorted(set(ids)))


@dataclass(frozen=True, slots=True)
class SourceOptions:
    settings: ClientSettings
    stream_ids: tuple[int, ...]
    starting: StartSpec = "earliest"
    starting_timestamp_ms: int | None = None
    ending: StartSpec = "latest"
    starting_by_timestamp: dict[str, int] | None = None  # startingPositionsByTimestamp (ms)
    ending_timestamp_ms: int | None = None  # batch reads
    fail_on_data_loss: bool = True
    format: str = "binary"
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = 900_000
    min_partitions: int | None = None
    schema_ddl: str | None = None  # format=arrow/json/msgpack
    bad_records_policy: str = "fail"  # json/msgpack/text
    corrupt_record_column: str = "_corrupt_record"
    include_metadata: bool = False  # json/msgpack
    consumer_id: str | None = None  # streaming: commits positions for the servers' retention
    read_on: str = "executors"  # streaming: executors (a session per task) or driver (prefetch)
    local_reads: bool = True  # read ranges from the server's files when this host sees them
    more_settings: tuple[ClientSettings, ...] = ()  # further servers (endpoint=a:1,b:2)
    sbe: SbeOptions | None = None  # format=sbe

    @property
    def all_settings(self) -> tuple[ClientSettings, ...]:
        return (self.settings, *self.more_settings)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    settings: ClientSettings
    stream_id: int
    sink_id: str | None = None
    format: str = "binary"
    checkpoint_location: str | None = None
    channel: str | None = None  # raw mode: an Aeron channel URI
    compression: str | None = None  # format=arrow: lz4 or zstd
    local_writes: bool = True  # stage into the server's directory when this host can
    sbe: SbeOptions | None = None  # format=sbe

    @property
    def commit_identity(self) -> str | None:
        """The identity the server commits batches under: ``sinkId``, scoped to the query's
        checkpoint when Spark passes it, so a new checkpoint (a new query whose batch ids start
        again at 0) never collides with the batches of an earlier one under the same sinkId,
        while a restart from the same checkpoint keeps its identity (exactly once)."""
        if self.sink_id is None or self.checkpoint_location is None:
            return self.sink_id
        import hashlib

        digest = hashlib.sha256(self.checkpoint_location.rstrip("/").encode()).hexdigest()[:16]
        return f"{self.sink_id}@{digest}"


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    o = _check_known(options, SOURCE_OPTIONS, "source")
    endpoints = [e.strip() for e in o.get("endpoint", "127.0.0.1:40123").split(",") if e.strip()]
    if not endpoints or len(set(endpoints)) != len(endpoints):
        raise ConfigurationError(
            "endpoint", o.get("endpoint"), "host:port, or several distinct ones separated by commas"
        )
    o["endpoint"] = endpoints[0]
    fmt = o.get("format", "binary").strip().lower()
    if fmt not in SOURCE_FORMATS:
        raise ConfigurationError("format", fmt, " or ".join(SOURCE_FORMATS))
    ts = o.get("startingtimestamp")
    ets = o.get("endingtimestamp")
    settings = _settings(o)
    return SourceOptions(
        settings=settings,
        stream_ids=_stream_ids(o),
        starting=_positions(
            "startingPositions", o.get("startingpositions", "earliest"), ("earliest", "latest")
        ),
        starting_timestamp_ms=None if ts is None else _int("startingTimestamp", ts, 0, 2**53),
        ending=_positions("endingPositions", o.get("endingpositions", "latest"), ("latest",)),
        starting_by_timestamp=_by_timestamp(o.get("startingpositionsbytimestamp")),
        ending_timestamp_ms=None if ets is None else _int("endingTimestamp", ets, 0, 2**53),
        fail_on_data_loss=_bool("failOnDataLoss", o.get("failondataloss", "true")),
        format=fmt,
        **_limits(o),
        schema_ddl=o.get("schema", "").strip() or None,
        **_record_options(o, fmt),
        consumer_id=_consumer_id(o),
        read_on=_read_on(o),
        local_reads=_bool("localReads", o.get("localreads", "true")),
        more_settings=tuple(replace(settings, endpoint=e) for e in endpoints[1:]),
        sbe=parse_sbe_options(o, fmt, sink=False),
    )


def _by_timestamp(value: str | None) -> dict[str, int] | None:
    """startingPositionsByTimestamp: startingPositions' JSON with epoch ms for positions."""
    if value is None:
        return None
    name = "startingPositionsByTimestamp"
    try:
        spec = _positions(name, value, ())
    except ConfigurationError:
        raise ConfigurationError(
            name, value, 'a JSON object {"recording_id": epoch milliseconds}'
        ) from None
    assert isinstance(spec, dict)  # no keywords: a dict or an error
    return spec


# Spark's time strings (JavaUtils.timeStringAsMs, as Kafka's maxTriggerDelay takes): a number
# with an optional unit; no unit is milliseconds.
_DURATION_UNITS_MS = {
    "": 1.0,
    "us": 0.001,
    "ms": 1.0,
    "s": 1000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
}


def _duration_ms(name: str, value: str) -> int:
    import re

    match = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", value.lower())
    if match is None or match.group(2) not in _DURATION_UNITS_MS:
        raise ConfigurationError(
            name,
            value,
            'milliseconds, or a number with a unit us, ms, s, m, min, h or d ("30s", "15m")',
        )
    ms = int(int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)])
    if ms > 2**53:
        raise ConfigurationError(name, value, f"a duration of at most {2**53} ms")
    return ms


def _read_on(o: dict[str, str]) -> str:
    value = o.get("readon", "executors").strip().lower()
    if value not in ("executors", "driver"):
        raise ConfigurationError("readOn", value, "executors or driver")
    if value == "driver" and o.get("minpartitions", "").strip():
        raise ConfigurationError(
            "minPartitions",
            o["minpartitions"],
            "no minPartitions with readOn=driver (the driver reads each micro-batch whole)",
        )
    return value


def _consumer_id(o: dict[str, str]) -> str | None:
    if "consumerid" not in o:
        return None
    value = o["consumerid"].strip()
    if not 0 < len(value) <= 200:
        raise ConfigurationError("consumerId", value, "a non-empty name of at most 200 characters")
    return value


def _record_options(o: dict[str, str], fmt: str) -> dict[str, Any]:
    policy = o.get("badrecordspolicy", "fail").strip().lower()
    if policy not in BAD_RECORD_POLICIES:
        raise ConfigurationError("badRecordsPolicy", policy, " or ".join(BAD_RECORD_POLICIES))
    if policy != "fail" and fmt not in ("json", "msgpack", "text"):
        raise ConfigurationError(
            "badRecordsPolicy",
            policy,
            f"fail with format={fmt} (only json, msgpack and text have bad records)",
        )
    column = o.get("corruptrecordcolumn", "_corrupt_record").strip()
    if not column or "`" in column:
        raise ConfigurationError("corruptRecordColumn", column, "a column name without backticks")
    metadata = _bool("includeMetadata", o.get("includemetadata", "false"))
    if metadata and fmt not in ("json", "msgpack", "sbe"):
        raise ConfigurationError(
            "includeMetadata",
            "true",
            f"false with format={fmt} (binary "
            "and text always have the metadata columns; arrow has none)",
        )
    if "schema" in o and fmt in ("binary", "text", "sbe"):
        raise ConfigurationError(
            "schema",
            o["schema"],
            f"no schema with format={fmt} (its "
            "columns are fixed, or sbeSchema's); use arrow, json or msgpack",
        )
    return {
        "bad_records_policy": policy,
        "corrupt_record_column": column,
        "include_metadata": metadata,
    }


def _limits(o: dict[str, str]) -> dict[str, Any]:
    def opt(key: str, name: str, low: int, high: int) -> int | None:
        return _int(name, o[key], low, high) if o.get(key, "").strip() else None

    raw = o.get("maxtriggerdelayms", "").strip()
    delay = _duration_ms("maxTriggerDelayMs", raw) if raw else None
    return {
        "max_messages_per_trigger": opt("maxmessagespertrigger", "maxMessagesPerTrigger", 1, 2**53),
        "max_bytes_per_trigger": opt("maxbytespertrigger", "maxBytesPerTrigger", 1, 2**53),
        "min_messages_per_trigger": opt("minmessagespertrigger", "minMessagesPerTrigger", 1, 2**53),
        "max_trigger_delay_ms": 900_000 if delay is None else delay,
        "min_partitions": opt("minpartitions", "minPartitions", 1, 100_000),
    }


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    o = _check_known(options, SINK_OPTIONS, "sink")
    ids = _stream_ids(o)
    if len(ids) != 1:
        raise ConfigurationError("streamId", ids, "exactly one stream id for a sink")
    fmt = o.get("format", "binary").strip().lower()
    if fmt not in SINK_FORMATS:
        raise ConfigurationError("format", fmt, " or ".join(SINK_FORMATS))
    sink_id = o.get("sinkid")
    if sink_id is not None and not sink_id.strip():
        raise ConfigurationError("sinkId", sink_id, "a non-empty identity")
    checkpoint = next(
        (str(v) for k, v in options.items() if str(k).lower() == "checkpointlocation"), None
    )
    channel = o.get("channel", "").strip() or None
    if channel is not None:
        try:
            config = ChannelConfig.from_uri(channel)
        except ChannelError as exc:
            raise ConfigurationError("channel", channel, f"an Aeron channel URI ({exc})") from None
        if config.spy:
            raise ConfigurationError("channel", channel, "a publication channel, not aeron-spy:")
    compression = o.get("compression", "none").strip().lower()
    if compression not in ("none", "lz4", "zstd"):
        raise ConfigurationError("compression", compression, "none, lz4 or zstd")
    if compression != "none" and fmt != "arrow":
        raise ConfigurationError(
            "compression",
            compression,
            f"none with format={fmt} (only arrow messages are compressed)",
        )
    return SinkOptions(
        settings=_settings(o),
        stream_id=ids[0],
        sink_id=sink_id,
        format=fmt,
        checkpoint_location=checkpoint,
        channel=channel,
        compression=None if compression == "none" else compression,
        local_writes=_bool("localWrites", o.get("localwrites", "true")),
        sbe=parse_sbe_options(o, fmt, sink=True),
    )
