"""Usage errors of ``aeron-spark server`` are caught before anything starts (exit code 2)."""

from __future__ import annotations

import pytest
from aeron_spark.connector.server import ServerConfig

from aeron_spark.cli import main as cli_main
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
