"""Asserting the project's own error through Spark's wrapping.

An error raised in a Python data source reaches the test in one of two ways: as itself (raised
in the driver's Python, e.g. by the sink's commit) or wrapped by Spark (``AnalysisException`` for
the planner's Python worker, ``PythonException`` / ``SparkException`` for a task), whose message
carries the Python traceback ending in ``module.ClassName: message``. :func:`raises_project`
accepts exactly the error class given (not a subclass, not a different error that happens to
mention the same word): the instance itself, or the traceback line naming that class followed
by a message matching ``match``. For coded errors (``ConnectorError``) the class is the code:
the code is checked too.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def error_text(exc: BaseException) -> str:
    """Everything Spark tells about ``exc``: its message, its Java-side description, causes."""
    parts = [str(exc)]
    for attr in ("desc", "stackTrace", "_desc"):
        value = getattr(exc, attr, None)
        if isinstance(value, str):
            parts.append(value)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        parts.append(error_text(cause))
    return "\n".join(parts)


def project_error_in(exc: BaseException, cls: type[BaseException], match: str) -> str | None:
    """None if ``exc`` is ``cls`` (itself, or named in Spark's traceback) with a message
    matching ``match``; otherwise why not."""
    if type(exc) is cls:
        code = getattr(cls, "code", None)
        if code is not None and getattr(exc, "code", None) != code:
            return f"{exc!r} has code {getattr(exc, 'code', None)}, expected {code!r}"
        if not re.search(match, str(exc), re.S):
            return f"{cls.__name__} message {str(exc)!r} does not match {match!r}"
        return None
    text = error_text(exc)
    name = _qualified(cls)
    # The traceback's last line: "aeron_spark.x.Class: message" (message up to the next
    # traceback or JVM frame); a subclass would be named as itself, so this is the exact class.
    found = [
        m.group(1)
        for m in re.finditer(
            rf"(?<![\w.]){re.escape(name)}: (.*?)(?=\n\s*at |\n\S+Error: |\n\S+Exception: |\Z)",
            text,
            re.S,
        )
    ]
    if not found:
        return f"{name} is not the error raised; Spark reported:\n{text[:3000]}"
    if not any(re.search(match, message, re.S) for message in found):
        return f"{name} was raised but no message matches {match!r}: {found}"
    return None


@contextlib.contextmanager
def raises_project(cls: type[BaseException], match: str) -> Iterator[None]:
    """Like ``pytest.raises(cls, match=match)`` through Spark's wrapping (module docstring)."""
    with pytest.raises(Exception) as info:
        yield
    problem = project_error_in(info.value, cls, match)
    if problem is not None:
        pytest.fail(problem)
