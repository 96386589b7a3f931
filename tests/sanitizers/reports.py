#!/usr/bin/env python3
"""The sanitizer reports of a test run (cmake/sanitize.cmake).

    reports.py clear DIR   empty DIR (made if missing): before the tests
    reports.py check DIR   print every report file in DIR and exit 1 if there is one

Every process of a sanitizer build writes its reports to DIR/TEST.PID (log_path), so a report
from an agent or worker that the gang restarted is not lost in a passing test. A file fails
the check when it holds a report (an ERROR, a ThreadSanitizer WARNING, a UBSan runtime
error or a SUMMARY line); other lines are the runtimes' notes, printed and not counted: a
process SIGKILLed by its test during LeakSanitizer's exit scan leaves "Unable to get
registers from thread N", for one.
"""
import os
import re
import shutil
import sys

REPORT = re.compile(r"==\d+==ERROR: |WARNING: ThreadSanitizer|: runtime error: "
                    r"|SUMMARY: \w+Sanitizer")


def clear(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return 0


def check(d):
    if not os.path.isdir(d):
        print(f"sanitizer-reports: {d} missing (sanitizer-reports-clear did not run)")
        return 1
    names = []
    for n in sorted(os.listdir(d)):
        with open(os.path.join(d, n), errors="replace") as f:
            text = f.read()
        if not text:
            continue
        report = REPORT.search(text) is not None
        print(f"==== {n}" + ("" if report else " (a note, not a report)"))
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        if report:
            names.append(n)
    tests = sorted({n.rsplit(".", 1)[0] for n in names})
    print(f"sanitizer-reports: {len(names)} report file(s)"
          + (f" from {', '.join(tests)}" if tests else ""))
    return 1 if names else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("clear", "check"):
        sys.exit(__doc__)
    sys.exit(clear(sys.argv[2]) if sys.argv[1] == "clear" else check(sys.argv[2]))
