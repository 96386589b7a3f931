#!/usr/bin/env python3
"""The sanitizer reports of a test run (cmake/sanitize.cmake).

    reports.py clear DIR   empty DIR (made if missing): before the tests
    reports.py check DIR   print every report file in DIR and exit 1 if there is one

Every process of a sanitizer build writes its reports to DIR/TEST.PID (log_path), so a report
from an agent or worker that the gang restarted is not lost in a passing test.
"""
import os
import shutil
import sys


def clear(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return 0


def check(d):
    if not os.path.isdir(d):
        print(f"sanitizer-reports: {d} missing (sanitizer-reports-clear did not run)")
        return 1
    names = sorted(n for n in os.listdir(d) if os.path.getsize(os.path.join(d, n)) > 0)
    for n in names:
        print(f"==== {n}")
        with open(os.path.join(d, n), errors="replace") as f:
            sys.stdout.write(f.read())
    tests = sorted({n.rsplit(".", 1)[0] for n in names})
    print(f"sanitizer-reports: {len(names)} report file(s)"
          + (f" from {', '.join(tests)}" if tests else ""))
    return 1 if names else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("clear", "check"):
        sys.exit(__doc__)
    sys.exit(clear(sys.argv[2]) if sys.argv[1] == "clear" else check(sys.argv[2]))
