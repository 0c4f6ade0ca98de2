"""Runs example programs one after the other in ONE Python process, each as its README command
runs it (``python examples/x.py ARGS``: ``sys.argv`` set, the file run as ``__main__``).

    python -m spark_tests._examples '[["examples/a.py", "--flag", "v"], ["examples/b.py"]]'

Each Spark example still builds its own SparkSession with its own master and settings and stops
it at its end: a new SparkContext, a Spark application of its own, in the JVM the first one
started. What the examples share is the driver process, so the JVM and the Python imports start
once instead of once per example (the slowest part of a short example on a small machine).

Prints one JSON line per example, in order: ``{"argv": [...], "rc": N, "stdout": "...",
"stderr": "..."}`` with what the example printed (its own ``sys.stdout``/``sys.stderr``; the
JVM's own output goes to this process's stderr, between the lines ``== example N: <path>`` this
runner writes there before each example).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback


def run_one(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python examples/x.py` has it
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(argv[0], run_name="__main__")
            except SystemExit as exc:  # examples end with raise SystemExit(main())
                code = exc.code
                rc = code if isinstance(code, int) else (0 if code is None else 1)
                if not isinstance(code, int | None):
                    print(code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported as the example's failure
                traceback.print_exc()
                rc = 1
    finally:
        sys.argv, sys.path[0] = saved_argv, saved_path0
    return {"argv": list(argv), "rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> int:
    commands = json.loads(sys.argv[1])
    for n, argv in enumerate(commands):
        os.write(2, f"\n== example {n}: {' '.join(argv)}\n".encode())
        print(json.dumps(run_one(argv)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
