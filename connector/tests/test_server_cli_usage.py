"""Usage errors of ``aeron-spark server`` are caught before anything starts (exit code 2)."""

from __future__ import annotations

import pytest

from aeron_spark.cli import main as cli_main
from aeron_spark.connector.server import ServerConfig
from aeron_spark.errors import ConfigurationError


def test_port_65535_is_a_usage_error_naming_the_highest_usable_port(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path / "data"
    assert cli_main(["server", "--dir", str(directory), "--port", "65535"]) == 2
    err = capsys.readouterr().err
    assert "port=65535" in err and "65534" in err and "port + 1" in err
    assert "control" not in err  # not the internal reply address the server derives from it
    assert not directory.exists()  # refused before anything was created


@pytest.mark.parametrize("port", [-1, 65535, 70000])
def test_config_refuses_ports_without_a_reply_port(tmp_path, port: int) -> None:
    with pytest.raises(ConfigurationError, match="65534"):
        ServerConfig(directory=str(tmp_path), port=port)


def test_highest_usable_port_is_accepted(tmp_path) -> None:
    assert ServerConfig(directory=str(tmp_path), port=65534).port == 65534


def test_memory_and_ingest_options_reach_the_config(tmp_path) -> None:
    from aeron_spark.connector.server.cli import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--dir", str(tmp_path), "--ingest-allow", "10.0.0.0/8", "--ingest-allow", "::1"]
        + ["--max-incomplete-bytes", "64M", "--max-incomplete-bytes-per-session", "8M"]
        + ["--incomplete-message-timeout-seconds", "5"]
    )
    config = config_from_args(args)
    assert config.ingest_allow == ("10.0.0.0/8", "::1")
    assert (config.max_incomplete_bytes, config.max_incomplete_bytes_per_session) == (
        64 << 20,
        8 << 20,
    )
    assert config.incomplete_message_timeout_s == 5.0


def test_max_per_key_reaches_the_config_and_a_bad_one_is_a_usage_error(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.cli import build_parser, config_from_args

    parse = build_parser().parse_args
    assert config_from_args(parse(["--dir", str(tmp_path)])).max_per_key is None  # half
    args = parse(["--dir", str(tmp_path), "--max-clients", "8", "--max-per-key", "3"])
    assert config_from_args(args).max_per_key == 3
    directory = tmp_path / "data"
    assert cli_main(["server", "--dir", str(directory), "--max-per-key", "0"]) == 2
    assert "max_per_key=0" in capsys.readouterr().err
    assert not directory.exists()  # refused before anything was created


def test_session_lease_reaches_the_config_and_a_bad_one_is_a_usage_error(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from aeron_spark.connector.server.cli import build_parser, config_from_args

    parse = build_parser().parse_args
    assert config_from_args(parse(["--dir", str(tmp_path)])).session_lease_ns == 60 * 10**9
    args = parse(["--dir", str(tmp_path), "--session-lease-seconds", "7.5"])
    assert config_from_args(args).session_lease_ns == 7_500_000_000
    directory = tmp_path / "data"
    assert cli_main(["server", "--dir", str(directory), "--session-lease-seconds", "0"]) == 2
    assert "invalid --session-lease-seconds=0.0" in capsys.readouterr().err
    assert not directory.exists()


@pytest.mark.parametrize("seconds", ["1", "2.5", "4.9"])
def test_a_session_lease_too_short_to_renew_is_refused_naming_the_option(
    tmp_path, capsys, seconds: str
) -> None:  # type: ignore[no-untyped-def]
    """A lease shorter than two of a live, idle client's heartbeats (its driver's, 2 s apart)
    and the server's 1 s check of each session expired live sessions on a loaded machine; main
    took ``--session-lease-seconds 1``. Refused now, naming the option and the minimum (5 s),
    before anything is created."""
    from aeron_spark.connector.server.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--dir", str(tmp_path), "--session-lease-seconds", seconds])
    with pytest.raises(ConfigurationError) as refused:
        config_from_args(args)
    assert refused.value.name == "--session-lease-seconds"
    assert "at least 5 s" in str(refused.value)
    ok = build_parser().parse_args(["--dir", str(tmp_path), "--session-lease-seconds", "5"])
    assert config_from_args(ok).session_lease_ns == 5 * 10**9
    directory = tmp_path / "data"
    # through the command line: a usage error (exit 2) naming it, nothing created
    assert cli_main(["server", "--dir", str(directory), "--session-lease-seconds", seconds]) == 2
    assert "invalid --session-lease-seconds=" in capsys.readouterr().err
    assert not directory.exists()


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"ingest_allow": ("10.0.0.0/33",)}, "ingest_allow"),
        ({"ingest_allow": ("10.0.0.1",), "ingest_channel": "aeron:ipc"}, "ingest_allow"),
        ({"max_incomplete_bytes": 1 << 20, "max_incomplete_bytes_per_session": 2 << 20}, "per"),
        ({"incomplete_message_timeout_s": 0}, "incomplete_message_timeout_s"),
    ],
)
def test_config_refuses_bad_memory_and_ingest_settings(tmp_path, fields, name) -> None:
    with pytest.raises(ConfigurationError, match=name):
        ServerConfig(directory=str(tmp_path), **fields)


def test_the_ingest_filter_applies_deny_allow_and_ingest_allow(tmp_path) -> None:
    admits = ServerConfig(
        directory=str(tmp_path),
        ingest_channel="aeron:udp?endpoint=0.0.0.0:40200",
        allow=("10.0.0.0/8",),
        deny=("10.9.0.0/16",),
        ingest_allow=("::ffff:10.1.0.0/112", "10.9.0.0/16"),
    ).ingest_source_filter()
    assert admits is not None
    assert admits("10.1.2.3") and admits("::ffff:10.1.2.3")
    assert not admits("10.2.0.1")  # outside ingest_allow
    assert not admits("10.9.0.1")  # denied wins
    assert not admits("192.168.1.1") and not admits("not-an-address")
    assert ServerConfig(directory=str(tmp_path)).ingest_source_filter() is None


@pytest.mark.parametrize("value", ["nan", "inf", "1e300"])
def test_seconds_that_are_not_finite_are_a_usage_error(tmp_path, capsys, value) -> None:  # type: ignore[no-untyped-def]
    """``nan`` or ``inf`` seconds made the server fail at start with a traceback (int() of
    them in nanoseconds)."""
    directory = tmp_path / "data"
    assert cli_main(["server", "--dir", str(directory), "--session-lease-seconds", value]) == 2
    err = capsys.readouterr().err
    assert "--session-lease-seconds" in err and "finite" in err and "Traceback" not in err
    assert not directory.exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize(
    "option",
    ["--consumer-lease-seconds", "--hellos-per-prefix-per-s", "--retention-seconds"]
    + ["--incomplete-message-timeout-seconds"],
)
def test_every_number_option_refuses_nan_and_inf(tmp_path, capsys, option, value) -> None:  # type: ignore[no-untyped-def]
    """(Parsed only: ``nan`` HELLOs a second or lease seconds passed the "positive" checks,
    and the server ran with them.)"""
    from aeron_spark.connector.server.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--dir", str(tmp_path), option, value])
    assert info.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    ["hellos_per_prefix_per_s", "consumer_lease_s", "staging_lease_s", "retention_s"]
    + ["incomplete_message_timeout_s"],
)
def test_config_refuses_nan_and_infinite_durations_and_rates(tmp_path, name: str) -> None:
    for value in (float("nan"), float("inf")):
        with pytest.raises(ConfigurationError, match=name):
            ServerConfig(directory=str(tmp_path), **{name: value})
