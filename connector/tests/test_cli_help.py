"""The command line and README.md stay in step (issue 33, item 7): every command's ``--help``
works and gives every flag and argument a line of help, and every flag README names exists on
the command it names it for (README said ``stat`` takes ``--server-key``, which it refused)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from aeron_spark.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Flags of other tools README shows (benchmarks, pytest, docker, ...): a flag within this many
# characters after one of these words, in the same paragraph, is that tool's.
OTHER_TOOLS = (
    "benchmarks",
    "pytest",
    "docker",
    "spark-submit",
    "start-connect-server",
    "ruff",
    "ulimit",
    "pip ",
)
_WINDOW = 300


def _parsers(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, caught as ``aeron-spark COMMAND --help`` parses its arguments."""
    seen: list[argparse.ArgumentParser] = []
    parse_args = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(self)
        return parse_args(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", spy)
    out: dict[str, argparse.ArgumentParser] = {}
    for command in COMMANDS:
        seen.clear()
        assert main([command, "--help"]) == 0, command
        assert len(seen) == 1 and seen[0].prog == f"aeron-spark {command}", (command, seen)
        out[command] = seen[0]
    return out


def _example_flags(name: str, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The flags of ``examples/NAME.py``, caught as its ``main()`` parses ``--help``."""
    import importlib.util

    seen: list[argparse.ArgumentParser] = []
    parse_args = argparse.ArgumentParser.parse_args

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(self)
        return parse_args(self, *args, **kwargs)

    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / name)
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", spy)
        patch.setattr("sys.argv", [name, "--help"])
        with pytest.raises(SystemExit):
            module.main()
    return _flags(seen[0])


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_command_has_help_for_every_flag_and_argument(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    missing = []
    for command, parser in _parsers(monkeypatch).items():
        assert re.search(rf"^  {command}\s+\S", listed, re.M), f"{command} not in the command list"
        assert parser.description, command
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"flags and arguments without help text: {missing}"


def _paragraph_start(at: int) -> int:
    return README.rfind("\n\n", 0, at) + 1


def test_every_flag_readme_names_exists_on_its_command(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    parsers = _parsers(monkeypatch)
    capsys.readouterr()
    every = set().union(*(_flags(p) for p in parsers.values()))
    wrong = []
    checked = 0
    examples: dict[str, set[str]] = {}
    for match in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", README):
        flag, at = match.group(), match.start()
        before = README[max(_paragraph_start(at), at - _WINDOW) : at]
        tool = max((before.rfind(word), word) for word in (*OTHER_TOOLS, "aeron-spark"))
        if tool[0] >= 0 and tool[1] != "aeron-spark":
            continue  # another tool's flag
        # "aeron-spark COMMAND ... --flag" on one line or in one code span: that command's
        line = README[README.rfind("\n", 0, at) + 1 : at]
        span = line[line.rfind("`") + 1 :] if line.count("`") % 2 else line
        named = re.findall(r"aeron-spark (\w+)", span)
        example = re.findall(r"examples/(\w+\.py)", span)
        if example:  # "python examples/NAME.py ... --flag": that example's
            checked += 1
            if example[-1] not in examples:
                examples[example[-1]] = _example_flags(example[-1], monkeypatch)
            if flag not in examples[example[-1]]:
                wrong.append(f"examples/{example[-1]} {flag}")
        elif named and named[-1] in parsers:
            checked += 1
            if flag not in _flags(parsers[named[-1]]):
                wrong.append(f"aeron-spark {named[-1]} {flag}")
        elif flag not in every:
            wrong.append(f"{flag} (no command has it)")
    # the flags README lists as the client commands' own
    (sentence,) = re.findall(
        r"also has ((?:`\w+`(?:, | and ))+`\w+`) \(these take\s([^)]*)\)", README
    )
    commands = re.findall(r"`(\w+)`", sentence[0])
    shared = re.findall(r"`(--[a-z-]+)`", sentence[1].split(";")[0])
    assert commands and shared, sentence
    for command in commands:
        for flag in shared:
            checked += 1
            if flag not in _flags(parsers[command]):
                wrong.append(f"aeron-spark {command} {flag}")
    # the server's paragraph
    (server,) = re.findall(
        r"Server \(`aeron-spark server --help`\):(.*?)One server per", README, re.S
    )
    for flag in re.findall(r"`(--[a-z-]+)", server):
        checked += 1
        if flag not in _flags(parsers["server"]):
            wrong.append(f"aeron-spark server {flag}")
    assert not wrong, f"README names flags the command line does not have: {wrong}"
    assert checked > 40  # the scan found the README's flags


def test_consumers_takes_no_stream_id_it_would_ignore(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["consumers", "list", "--stream-id", "10"]) == 2
    assert "unrecognized arguments: --stream-id" in capsys.readouterr().err


def test_readme_and_examples_run_the_examples_with_the_venv_python() -> None:
    """``python examples/...`` is the system Python, without aeron-spark: README says which."""
    texts = {"README.md": README}
    texts.update({f"examples/{p.name}": p.read_text() for p in (ROOT / "examples").glob("*.py")})
    bare = {
        name: line.strip()
        for name, text in texts.items()
        for line in text.splitlines()
        if re.search(r"(?<![/\w])python3? examples/", line)
    }
    assert not bare, f"examples run with a bare python: {bare}"


def test_stat_pins_the_server_key_as_readme_says(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``stat --server-key`` / ``--no-trust-on-first-use`` do what they do on publish and tail."""
    from aeron_spark.connector.server.testing import server_process

    with server_process(str(tmp_path / "srv")) as (_, endpoint):
        (log,) = tmp_path.glob("srv.*.log")
        key = re.findall(r"server key ([0-9a-f]{64})", log.read_text())[0]
        wrong = ("0" if key[0] != "0" else "1") + key[1:]
        common = ["stat", "--endpoint", endpoint, "--once", "--json", "--no-encryption"]
        store = ["--key-store", str(tmp_path / "keys"), "--no-trust-on-first-use"]
        assert main([*common, *store]) == 1  # unknown, not pinned, not trusted on first use
        assert main([*common, *store, "--server-key", wrong]) == 1
        capsys.readouterr()
        assert main([*common, *store, "--server-key", key]) == 0
        assert '"handshake"' in capsys.readouterr().out
