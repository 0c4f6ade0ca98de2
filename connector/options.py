"""Every option of the ``aeron`` data source, parsed and validated in one place.

Spark hands options over as a case-insensitive mapping of strings. :func:`parse_source_options`
and :func:`parse_sink_options` turn them into frozen dataclasses; anything unknown or malformed
raises :class:`~aeron_spark.errors.ConfigurationError` naming the option and what it accepts, so a
bad query fails at ``load()`` / ``save()`` / ``start()``, before any task runs.

One section per store (:mod:`~aeron_spark.connector.stores`): the reader's and the sink's own
options and the stream server's come first; the Aeron Archive's section
(``.option("archive", ...)``: :func:`parse_archive_source_options`,
:func:`parse_archive_sink_options`) takes the same reader and sink options. An option of one
store given to the other is refused with :class:`StoreOptionError` (code
``OPTION_NOT_FOR_STORE``) naming the option and the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from aeron_spark.connector.session.settings import ClientSettings
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport import ChannelConfig, ChannelError

if TYPE_CHECKING:
    from aeron_spark.connector.formats_sbe import SbeOptions
    from aeron_spark.transport.archive.client.credentials import ArchiveCredentials

# A Spark read task unpickles its reader's options, so this module is in every Python worker:
# the SBE codecs (and their XML parser) and the archive client's package are imported by the
# parsing that needs them (issue 31 item 2: the worker's modules are walked by the gc.collect()
# after every task).

SOURCE_FORMATS = ("binary", "text", "arrow", "json", "msgpack", "sbe")
SINK_FORMATS = ("binary", "text", "arrow", "json", "msgpack", "sbe")
BAD_RECORD_POLICIES = ("fail", "drop", "column")
# maxPartitionBytes: small recording ranges packed into one task up to this many bytes (a task
# costs Spark's reused Python worker a gc.collect() and the reader a session: ~75 ms, issue 31)
DEFAULT_PARTITION_BYTES = 32 * 1024 * 1024

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

_SBE_SCHEMA = (
    "sbeSchema",
    "(required with format=sbe)",
    "format=sbe: the SBE message schema, a path to its XML file or the XML text",
)

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
    "sbeschema": _SBE_SCHEMA,
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
    "maxpartitionbytes": (
        "maxPartitionBytes",
        str(DEFAULT_PARTITION_BYTES),
        "pack consecutive small recording ranges into one input partition (one task) of at "
        "most about this many recorded bytes; a larger range is a partition of its own; "
        "minPartitions is still honoured; 1: one range a partition",
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
    "streamid": (
        "streamId",
        "(required without a stream_id column)",
        "stream to append to (every row, stream_id column or not); without it a DataFrame's "
        "stream_id column routes each row to its stream",
    ),
    "sinkid": (
        "sinkId",
        "(required for streaming)",
        "stable identity of this sink: the server "
        "commits each (sinkId, batch) once; keep it across restarts of the query",
    ),
    "batchid": (
        "batchId",
        "",
        "batch writes (df.write, e.g. in foreachBatch): this write's batch id (with sinkId), "
        "committed once per (sinkId, batchId): a write repeated with the same pair (a replayed "
        "foreachBatch batch) appends nothing; without it every batch write is a new batch",
    ),
    "format": (
        "format",
        "binary",
        "binary (a binary `value` column), text (a string `value` column), arrow (all "
        "columns; each task's Arrow batches become Arrow IPC messages of about 60 KiB), json "
        "(each row one JSON object), msgpack (each row one map) or sbe (each row one SBE message "
        "of sbeMessage)",
    ),
    "sbeschema": _SBE_SCHEMA,
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


class StoreOptionError(ConfigurationError):
    """An option the chosen store does not take (an option of the other store, or one that
    needs what this store lacks: a time index, consumer positions, ...)."""

    code = "OPTION_NOT_FOR_STORE"

    def __init__(self, name: str, value: object, store: str, why: str) -> None:
        super().__init__(name, value, f"no {name} with {store} ({why})")
        self.store = store


class ConflictingOptionsError(ConfigurationError):
    """Two options that say the same thing in different ways were both given."""

    code = "CONFLICTING_OPTIONS"


def _check_known(
    options: Mapping[str, str], known: dict[str, tuple[str, str, str]], kind: str
) -> dict[str, str]:
    lowered: dict[str, str] = {}
    archive_only = ARCHIVE_SOURCE_OPTIONS if kind == "source" else ARCHIVE_SINK_OPTIONS
    for key, value in options.items():
        name = str(key).lower()
        if name in SPARK_OPTIONS:
            continue
        if name not in known and name in archive_only:
            raise StoreOptionError(
                archive_only[name][0],
                shown(name, value),
                "the stream server",
                "an option of archive mode: set archive to the archive's control channel",
            )
        if name not in known:
            raise unknown_option(name, value, known, kind)
        lowered[name] = str(value)
    return lowered


# Kafka's source and sink options a user coming from Kafka reaches for, and ours for them
KAFKA_SPELLINGS = {
    "maxOffsetsPerTrigger": "maxMessagesPerTrigger",
    "minOffsetsPerTrigger": "minMessagesPerTrigger",
    "maxTriggerDelay": "maxTriggerDelayMs",
    "startingOffsets": "startingPositions",
    "endingOffsets": "endingPositions",
    "startingOffsetsByTimestamp": "startingPositionsByTimestamp",
    "subscribe": "streamIds",
    "assign": "streamIds",
    "topic": "streamId",
    "kafka.bootstrap.servers": "endpoint",
}
KAFKA_NAMES = {k.lower(): v for k, v in KAFKA_SPELLINGS.items()}


def unknown_option(
    key: str, value: object, known: Mapping[str, tuple[str, str, str]], kind: str
) -> ConfigurationError:
    """The error for an option no one knows. Spark hands options over in lower case, so the
    user's spelling is lost: the name is given back in the case of the closest known option
    (``maxmessagespertriger`` -> ``maxMessagesPerTriger``), which is suggested."""
    import difflib

    name = str(key).lower()
    value = shown(name, value)
    names = ", ".join(spec[0] for spec in known.values())
    # a name that kept its case is the user's own spelling; a lower-cased one is recased below
    spelled = str(key) if str(key) != name else None
    kafka = KAFKA_NAMES.get(name)
    if kafka is not None and kafka.lower() in known:
        return ConfigurationError(
            spelled or next(k for k in KAFKA_SPELLINGS if k.lower() == name),
            value,
            problem=f"not a {kind} option of this connector: Kafka's option; here it is "
            f"{kafka} (the {kind} options: {names})",
        )
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    if not close:
        return ConfigurationError(
            str(key), value, problem=f"not a known {kind} option (the {kind} options: {names})"
        )
    canonical = known[close[0]][0]
    return ConfigurationError(
        spelled or _recase(name, canonical),
        value,
        problem=f"not a known {kind} option: did you mean {canonical}? (the {kind} options: "
        f"{names})",
    )


def _recase(name: str, canonical: str) -> str:
    """``name`` (lower case) with the letters it shares with ``canonical`` in its case."""
    import difflib

    out = list(name)
    matcher = difflib.SequenceMatcher(None, name, canonical.lower(), autojunk=False)
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            out[block.a + i] = canonical[block.b + i]
    return "".join(out)


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
    max_partition_bytes: int = DEFAULT_PARTITION_BYTES  # packs small ranges into one task
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
    batch_id: int | None = None  # batch writes: the idempotence key's batch (with sink_id)
    route_by_stream_id: bool = False  # each row to the stream of its stream_id column

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
        sbe=_parse_sbe(o, fmt, sink=False),
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


# Spark SQL's type names (DataTypeAstBuilder); the number of parenthesised parameters each takes
_DDL_TYPES = {
    **dict.fromkeys(
        "boolean tinyint byte smallint short int integer bigint long float real double date "
        "timestamp timestamp_ltz timestamp_ntz string binary void variant".split(),
        (0,),
    ),
    **dict.fromkeys(("char", "character", "varchar"), (1,)),
    **dict.fromkeys(("decimal", "dec", "numeric"), (0, 1, 2)),
    "time": (0, 1),
}
_INTERVAL_UNITS = frozenset("year month day hour minute second".split())
_DDL_TOKEN = re.compile(
    r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(\w+)|(\S))"
)


def check_ddl(name: str, ddl: str) -> None:
    """Refuse, naming the option, a ``schema`` that is not Spark DDL (``"id long, price
    double"``): Spark parses it only after the source handed it over, and its parse error names
    no option. A syntax check of Spark's grammar, in Python (no JVM where options are parsed)."""
    tokens = [next(g for g in m.groups() if g is not None) for m in _DDL_TOKEN.finditer(ddl)]
    if not "".join(tokens).strip():
        raise ConfigurationError(name, ddl, problem="not Spark DDL: it names no column")
    pos = 0

    def fail(what: str) -> ConfigurationError:
        near = repr(" ".join(tokens[pos : pos + 3])) if pos < len(tokens) else "the end"
        return ConfigurationError(
            name,
            ddl,
            problem=f"not Spark DDL: {what} at {near} (columns are `name type`, e.g. "
            '"id long, price double, tags array<string>")',
        )

    def peek() -> str:
        return tokens[pos].lower() if pos < len(tokens) else ""

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens) or (expected is not None and tokens[pos].lower() != expected):
            raise fail(f"expected {expected!r}" if expected else "expected more")
        pos += 1
        return tokens[pos - 1]

    def column_name() -> None:
        token = peek()
        if not token or not (token.startswith("`") or re.fullmatch(r"\w+", token)):
            raise fail("expected a column name")
        take()

    def field(nested: bool) -> None:
        column_name()
        if peek() == ":":
            take()
        data_type()
        if peek() == "not":
            take()
            take("null")
        if peek() == "comment":
            take()
            if peek()[:1] not in ("'", '"'):
                raise fail("expected a quoted comment")
            take()

    def data_type() -> None:
        word = peek()
        if word in ("array", "map", "struct"):
            take()
            take("<")
            if word == "array":
                data_type()
            elif word == "map":
                data_type()
                take(",")
                data_type()
            elif peek() != ">":
                field(nested=True)
                while peek() == ",":
                    take()
                    field(nested=True)
            take(">")
        elif word == "interval":
            take()
            if peek() in _INTERVAL_UNITS:
                take()
                if peek() == "to":
                    take()
                    if peek() not in _INTERVAL_UNITS:
                        raise fail("expected an interval unit")
                    take()
        elif word in _DDL_TYPES:
            take()
            counts = _DDL_TYPES[word]
            given = 0
            if peek() == "(":
                take()
                while True:
                    if not peek().isdigit():
                        raise fail(f"expected a number in {word}(...)")
                    take()
                    given += 1
                    if peek() != ",":
                        break
                    take()
                take(")")
            if given not in counts:
                raise fail(f"{word} takes {' or '.join(map(str, counts))} parameter(s)")
            if word == "string" and peek() == "collate":
                take()
                take()
        else:
            raise fail("expected a type" if word else "expected a type after the column name")

    if peek() == "struct" and tokens[1:2] == ["<"]:
        data_type()  # the schema as one struct type, as Spark also takes it
    else:
        field(nested=False)
        while peek() == ",":
            take()
            field(nested=False)
    if pos < len(tokens):
        raise fail("expected ',' or the end")


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
    if o.get("schema", "").strip():
        check_ddl("schema", o["schema"].strip())
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
        "max_partition_bytes": opt("maxpartitionbytes", "maxPartitionBytes", 1, 2**53)
        or DEFAULT_PARTITION_BYTES,
    }


# A sink DataFrame column naming each row's stream (as Kafka's sink routes by a `topic` column).
ROUTING_COLUMN = "stream_id"


def parse_sink_options(options: Mapping[str, str], routed: bool = False) -> SinkOptions:
    """The sink's options; ``routed``: the DataFrame has a ``stream_id`` column. Without a
    ``streamId`` option it routes each row to its stream; with one, ``streamId`` names the stream
    of every row (as Kafka's ``topic`` option overrides a ``topic`` column: a copy of a source
    DataFrame, which has the column, keeps working) and the column is data like any other."""
    o = _check_known(options, SINK_OPTIONS, "sink")
    ids = _stream_ids(o, required=False)
    if not ids:
        if not routed:
            raise ConfigurationError("streamId", None, "a stream id (option streamId or streamIds)")
        if o.get("channel", "").strip():
            raise ConfigurationError(
                "streamId",
                None,
                f"a stream id in raw mode (channel): it publishes every row to streamId and "
                f"does not route by a {ROUTING_COLUMN} column",
            )
    if len(ids) > 1:
        raise ConfigurationError("streamId", ids, "exactly one stream id for a sink")
    fmt = o.get("format", "binary").strip().lower()
    if fmt not in SINK_FORMATS:
        raise ConfigurationError("format", fmt, " or ".join(SINK_FORMATS))
    sink_id = o.get("sinkid")
    if sink_id is not None and not sink_id.strip():
        raise ConfigurationError("sinkId", sink_id, "a non-empty identity")
    batch_id = None
    if "batchid" in o:
        batch_id = _int("batchId", o["batchid"], 0, 2**63 - 1)
        if sink_id is None:
            raise ConfigurationError(
                "sinkId", None, "a stable sink identity with batchId (the pair is committed once)"
            )
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
        stream_id=ids[0] if ids else 0,  # unused when routed
        sink_id=sink_id,
        format=fmt,
        checkpoint_location=checkpoint,
        channel=channel,
        compression=None if compression == "none" else compression,
        local_writes=_bool("localWrites", o.get("localwrites", "true")),
        sbe=_parse_sbe(o, fmt, sink=True),
        batch_id=batch_id,
        route_by_stream_id=routed and not ids,
    )


# ------------------------------------------------------------------ store: Aeron Archive
# ``.option("archive", "<control channel>")`` reads the recordings of a real Aeron Archive, and
# the sink appends to one target recording there. Its own options are below; the reader's and
# the sink's options are parsed by parse_source_options / parse_sink_options, so they mean the
# same; the stream server's own options are refused (_NOT_IN_ARCHIVE_MODE says why).

# name (lower case) -> (canonical name, default text, meaning); for the README's table.
ARCHIVE_SOURCE_OPTIONS: dict[str, tuple[str, str, str]] = {
    "archive": (
        "archive",
        "(required for archive mode)",
        "the archive's control request channel, e.g. aeron:udp?endpoint=archive-host:8010; "
        "for the source, several comma-separated, in preference order: replicas of one "
        "another (a recording and its copies are one partition; reads go on from the next "
        "replica when one fails)",
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
    "archivecredentials": (
        "archiveCredentials",
        "(none)",
        "the encoded credentials (UTF-8 text) for an archive that authenticates its control "
        "sessions (Spark's default spark.redaction.regex hides it in plans, as it matches "
        "'credential'); prefer archiveCredentialsFile",
    ),
    "archivecredentialsfile": (
        "archiveCredentialsFile",
        "(none)",
        "a file holding the credentials (its bytes, one trailing newline dropped), read once "
        "on the driver (executors need no copy)",
    ),
    "recheckintervalms": (
        "recheckIntervalMs",
        "5000",
        "with several archives: the least time between two probes of an archive that failed "
        "lately, made because only it can confirm a sink's batch (per archive and process; "
        "100 to 30000)",
    ),
}

# Options whose value is a secret: never quoted in an error, a repr or a log.
SECRET_OPTIONS = frozenset({"archivecredentials"})
_SECRET_WORDS = ("credential", "secret", "password", "token")


def shown(name: str, value: object) -> object:
    """``value`` as an error may quote it: ``"<hidden>"`` for a secret option, or a name
    that looks like one (a misspelled ``archiveCredentials`` is still a secret)."""
    import difflib

    lowered = str(name).lower()
    if (
        lowered in SECRET_OPTIONS
        or any(w in lowered for w in _SECRET_WORDS)
        or difflib.get_close_matches(lowered, SECRET_OPTIONS, n=1, cutoff=0.75)
    ):
        return None if value is None else "<hidden>"
    return value


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
    # archiveCredentials / archiveCredentialsFile, resolved on the driver (never shown)
    credentials: ArchiveCredentials | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ArchiveSourceOptions:
    connect: ArchiveConnect
    channel: str  # recordings whose stripped channel contains this ("" : all)
    source: SourceOptions  # stream ids, positions, limits, format
    # ``archive`` naming several control channels: the ones after the first (``connect``), in
    # preference order; the source then reads the set of replicas (stores/replicas)
    replicas: tuple[ArchiveConnect, ...] = ()
    # recheckIntervalMs: an archive marked failed is probed again for a confirmation only it
    # can give at most this often (per archive and process)
    recheck_interval_s: float = 5.0

    @property
    def connects(self) -> tuple[ArchiveConnect, ...]:
        """Every archive named, in preference order."""
        return (self.connect, *self.replicas)


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
            spelled = {**SOURCE_OPTIONS, **SINK_OPTIONS}[name][0]  # Spark lower-cases options
            raise StoreOptionError(spelled, value, "archive", _NOT_IN_ARCHIVE_MODE[name])
        else:
            rest[str(key)] = value
    return mine, rest


def _check_control_channel(name: str, text: str, expected: str) -> None:
    """``text`` an archive's control request channel (UDP, with an endpoint), or
    :class:`ConfigurationError` naming option ``name`` and what was ``expected``."""
    try:
        config = ChannelConfig.from_uri(text)
    except ChannelError:
        config = None
    if config is None or config.media != "udp" or config.endpoint is None:
        raise ConfigurationError(name, text, expected)


def _connect_parts(mine: dict[str, str]) -> tuple[str, int, str | None]:
    control = mine.get("archive", "").strip()
    _check_control_channel(
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


def _parse_sbe(o: Mapping[str, str], fmt: str, *, sink: bool) -> SbeOptions | None:
    from aeron_spark.connector.formats_sbe import parse_sbe_options

    return parse_sbe_options(o, fmt, sink)


def _credentials(mine: dict[str, str]) -> ArchiveCredentials | None:
    """``archiveCredentials`` (text) or ``archiveCredentialsFile`` (read here, on the driver,
    so the tasks carry the credentials and executors need no copy of the file)."""
    from aeron_spark.transport.archive.client.credentials import (
        MAX_CREDENTIALS_BYTES,
        ArchiveCredentials,
    )

    text = mine.get("archivecredentials")
    path = mine.get("archivecredentialsfile")
    if text is not None and path is not None:
        raise ConflictingOptionsError(
            "archiveCredentials",
            "<hidden>",
            "archiveCredentials or archiveCredentialsFile, not both",
        )
    if text is not None:
        if not text:
            raise ConfigurationError("archiveCredentials", "<hidden>", "non-empty credentials")
        if len(text.encode("utf-8")) > MAX_CREDENTIALS_BYTES:
            raise ConfigurationError(
                "archiveCredentials", "<hidden>", f"at most {MAX_CREDENTIALS_BYTES} bytes"
            )
        return ArchiveCredentials(text)
    if path is not None:
        if not path.strip():
            raise ConfigurationError("archiveCredentialsFile", path, "the path of a file")
        try:
            credentials = ArchiveCredentials.from_file(path.strip())
        except ConfigurationError as exc:
            if exc.name == "archiveCredentialsFile":
                raise
            raise ConfigurationError(
                "archiveCredentialsFile", path.strip(), f"a file of {exc.expected}"
            ) from None
        if not credentials.encoded:
            raise ConfigurationError(
                "archiveCredentialsFile", path.strip(), problem="is empty (no credentials in it)"
            )
        return credentials
    return None


# a comma before "aeron:" separates control channels (a comma inside a URI, as in tags=1,2, is
# followed by something else)
_CHANNEL_LIST = re.compile(r"\s*,\s*(?=aeron:)")


def control_channels(text: str) -> list[str]:
    """The control channels ``archive`` names: one, or several separated by commas (each
    checked as the single one is, none twice)."""
    channels = [c.strip() for c in _CHANNEL_LIST.split(text.strip())]
    seen: set[str] = set()
    for c in channels:
        if c in seen:
            raise ConfigurationError("archive", text, f"distinct control channels ({c} twice)")
        seen.add(c)
    return channels


def parse_archive_source_options(options: Mapping[str, str]) -> ArchiveSourceOptions:
    mine, rest = _split_options(options, ARCHIVE_SOURCE_OPTIONS)
    channels = control_channels(mine.get("archive", ""))
    connects = []
    for one in channels:
        control, stream, host = _connect_parts({**mine, "archive": one})
        connects.append((control, stream, host))
    source = parse_source_options(rest)
    if source.read_on != "executors":
        raise ConfigurationError("readOn", source.read_on, "executors in archive mode")
    credentials = _credentials(mine)
    first, *others = (
        ArchiveConnect(control, stream, host, source.settings.timeout_s, credentials)
        for control, stream, host in connects
    )
    recheck_ms = _int("recheckIntervalMs", mine.get("recheckintervalms", "5000"), 100, 30_000)
    return ArchiveSourceOptions(
        connect=first,
        channel=mine.get("channel", "").strip(),
        source=source,
        replicas=tuple(others),
        recheck_interval_s=recheck_ms / 1000.0,
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
    "archivecredentials": ARCHIVE_SOURCE_OPTIONS["archivecredentials"],
    "archivecredentialsfile": ARCHIVE_SOURCE_OPTIONS["archivecredentialsfile"],
    "replicas": (
        "replicas",
        "(none)",
        "comma-separated control request channels of replica archives; after each commit the "
        "sink asks each to replicate the target recording (same credentials as archive)",
    ),
    "mininsyncreplicas": (
        "minInSyncReplicas",
        "1",
        "archives (the primary counts as one, Kafka's meaning) that must hold a batch's END "
        "marker before its commit completes; fewer: NOT_ENOUGH_REPLICAS, nothing acknowledged",
    ),
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
    replicas: tuple[ArchiveConnect, ...] = ()  # replica archives the target is replicated to
    min_insync_replicas: int = 1  # archives holding a batch's END before its commit completes


def archive_channel(channel: str, control_channel: str) -> str:
    """``channel`` with its endpoint's host replaced by ``control_channel``'s: the same port on
    another archive's host (where a promoted replica receives the sink's appends and stages)."""
    endpoint = ChannelConfig.from_uri(control_channel).endpoint
    port = ChannelConfig.from_uri(channel).endpoint
    assert endpoint is not None and port is not None
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return re.sub(r"endpoint=[^|]*", f"endpoint={host}:{port.port}", channel, count=1)


def sink_on_archive(o: ArchiveSinkOptions, k: int) -> ArchiveSinkOptions:
    """The sink's options with archive ``k`` (0: ``archive``, k: the k-th replica) as the
    primary: its control channel, ``channel`` and the staging channel on its host, the others
    (the configured primary first) as its replicas."""
    if k == 0:
        return o
    archives = (o.connect, *o.replicas)
    chosen = archives[k]
    return replace(
        o,
        connect=chosen,
        channel=archive_channel(o.channel, chosen.control_channel),
        staging_channel=archive_channel(o.staging_channel, chosen.control_channel),
        replicas=tuple(a for i, a in enumerate(archives) if i != k),
    )


def _replicas(mine: dict[str, str], primary: ArchiveConnect) -> tuple[ArchiveConnect, ...]:
    """``replicas``: control channels of other archives, each once, none the primary."""
    text = mine.get("replicas", "").strip()
    out: list[ArchiveConnect] = []
    seen = {primary.control_channel}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        _check_control_channel(
            "replicas",
            item,
            "comma-separated UDP control request channels of replica archives, e.g. "
            "aeron:udp?endpoint=replica-host:8010",
        )
        if item in seen:
            raise ConfigurationError(
                "replicas", item, "each replica once, and not the archive itself"
            )
        seen.add(item)
        out.append(replace(primary, control_channel=item))
    return tuple(out)


def _min_insync(mine: dict[str, str], replicas: int) -> int:
    text = mine.get("mininsyncreplicas", "1").strip()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= replicas + 1:
        raise ConfigurationError(
            "minInSyncReplicas",
            text,
            f"an int from 1 to {replicas + 1} (the archive and its {replicas} replicas)",
        )
    return value


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
            raise StoreOptionError(
                "localWrites", rest[key], "archive", "archive mode stages through the archive"
            )
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
    connect = ArchiveConnect(control, stream, host, sink.settings.timeout_s, _credentials(mine))
    replicas = _replicas(mine, connect)
    return ArchiveSinkOptions(
        connect=connect,
        channel=channel,
        staging_channel=staging,
        staging_stream_id=staging_stream,
        term_length=config.term_length if "term-length" in has else _TARGET_TERM_LENGTH,
        mtu=config.mtu,
        sink=sink,
        replicas=replicas,
        min_insync_replicas=_min_insync(mine, len(replicas)),
    )
