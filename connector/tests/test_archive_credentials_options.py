"""archiveCredentials / archiveCredentialsFile of archive mode without Spark or an archive: both
forms parse to the ArchiveCredentials the tasks connect with, both at once and the other store
are refused with coded errors, and the secret never shows (repr, errors, a pickled task)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from aeron_spark.connector.options import (
    ArchiveConnect,
    StoreOptionError,
    parse_archive_sink_options,
    parse_archive_source_options,
    parse_sink_options,
    parse_source_options,
)
from aeron_spark.connector.stores.archive import ArchiveStore
from aeron_spark.errors import ConfigurationError
from aeron_spark.transport.archive.client.credentials import ArchiveCredentials

ARCHIVE = "aeron:udp?endpoint=127.0.0.1:8010"
SECRET = "s3cr3t-archive-credential-Zq9"
SOURCE = {"archive": ARCHIVE, "streamid": "7"}
SINK = {"archive": ARCHIVE, "streamid": "7", "channel": "aeron:udp?endpoint=127.0.0.1:40456"}


def _never_shows(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text) and SECRET not in repr(text)


@pytest.mark.parametrize("parse", [parse_archive_source_options, parse_archive_sink_options])
def test_credentials_as_text_or_a_file_reach_the_connect(parse: object, tmp_path: Path) -> None:
    base = SOURCE if parse is parse_archive_source_options else SINK
    as_text = parse({**base, "archivecredentials": SECRET})  # type: ignore[operator]
    assert as_text.connect.credentials == ArchiveCredentials(SECRET)
    path = tmp_path / "archive.credentials"
    path.write_bytes(SECRET.encode() + b"\n")
    as_file = parse({**base, "archiveCredentialsFile": str(path)})  # type: ignore[operator]
    path.unlink()  # read once on the driver: the options carry the credentials, not the path
    assert as_file.connect.credentials.encoded == SECRET.encode()
    assert parse(dict(base)).connect.credentials is None  # type: ignore[operator]
    _never_shows(as_text, as_text.connect, as_file, as_file.connect)
    assert "credentials" not in repr(as_text.connect)


def test_credentials_travel_pickled_to_tasks_and_stay_hidden() -> None:
    o = parse_archive_source_options({**SOURCE, "archiveCredentials": SECRET})
    store = ArchiveStore(o.connect, o.channel)
    data = pickle.dumps(store)
    back = pickle.loads(data)
    assert back.connect.credentials.encoded == SECRET.encode()
    assert back.connect == o.connect and isinstance(back.connect, ArchiveConnect)
    _never_shows(back, back.connect, back.connect.credentials)


@pytest.mark.parametrize("parse", [parse_archive_source_options, parse_archive_sink_options])
def test_both_forms_at_once_are_refused_without_quoting_the_secret(
    parse: object, tmp_path: Path
) -> None:
    base = SOURCE if parse is parse_archive_source_options else SINK
    path = tmp_path / "c"
    path.write_text(SECRET)
    with pytest.raises(ConfigurationError) as info:
        parse({**base, "archivecredentials": SECRET, "archivecredentialsfile": str(path)})  # type: ignore[operator]
    assert info.value.code == "CONFLICTING_OPTIONS"
    assert info.value.name == "archiveCredentials" and "not both" in str(info.value)
    _never_shows(info.value, info.value.value, info.value.args)


@pytest.mark.parametrize(
    ("options", "name", "says"),
    [
        ({"archivecredentials": ""}, "archiveCredentials", "non-empty"),
        (
            {"archivecredentialsfile": "/nonexistent/aeron-spark/creds"},
            "archiveCredentialsFile",
            "cannot be read",
        ),
        ({"archivecredentialsfile": " "}, "archiveCredentialsFile", "path of a file"),
        ({"archivecredentials": "x" * (64 * 1024 + 1)}, "archiveCredentials", "at most 65536"),
    ],
)
def test_bad_credentials_options_name_what_is_wrong(
    options: dict[str, str], name: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_archive_source_options({**SOURCE, **options})
    assert info.value.name == name and says in str(info.value)


def test_an_empty_or_oversized_credentials_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"\n")
    with pytest.raises(ConfigurationError, match="is empty") as info:
        parse_archive_source_options({**SOURCE, "archivecredentialsfile": str(path)})
    assert info.value.name == "archiveCredentialsFile" and info.value.value == str(path)
    path.write_bytes(SECRET.encode() * 4000)
    with pytest.raises(ConfigurationError, match="at most 65536 bytes") as info:
        parse_archive_source_options({**SOURCE, "archivecredentialsfile": str(path)})
    assert info.value.name == "archiveCredentialsFile" and info.value.value == str(path)
    _never_shows(info.value, info.value.args)


@pytest.mark.parametrize(
    ("parse", "name"),
    [
        (parse_source_options, "archivecredentials"),
        (parse_source_options, "archivecredentialsfile"),
        (parse_sink_options, "archivecredentials"),
        (parse_sink_options, "archivecredentialsfile"),
    ],
)
def test_the_stream_server_refuses_them_without_quoting_the_secret(
    parse: object, name: str
) -> None:
    options = {"endpoint": "127.0.0.1:1", "streamid": "1", name: SECRET}
    with pytest.raises(StoreOptionError) as info:
        parse(options)  # type: ignore[operator]
    assert info.value.code == "OPTION_NOT_FOR_STORE"
    assert info.value.name.lower() == name
    if name == "archivecredentials":
        _never_shows(info.value, info.value.value, info.value.args)


@pytest.mark.parametrize("misspelled", ["archivecredential", "archivecredentails", "archivesecret"])
def test_a_misspelled_credentials_option_is_named_but_its_value_hidden(misspelled: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_archive_source_options({**SOURCE, misspelled: SECRET})
    assert info.value.name.lower() == misspelled
    _never_shows(info.value, info.value.value, info.value.args)
