#!/usr/bin/env python3
"""Compares the junit XML of llama.cpp's server test suite run against llama-server and
against ganglion (bench/llama-suite.sh): prints the counts (passed on llama-server, passed
on ganglion, expected failures on ganglion) and every test that passed on llama-server
but failed on ganglion without being listed in the expected failures, which fails the
run (exit 1)."""
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    """{node id: "passed" | "failed" | "skipped" | "xfailed" | "xpassed"}."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = "%s::%s" % (case.get("classname", "").replace(".", "/") + ".py",
                           case.get("name"))
        kinds = [c.tag for c in case]
        if "failure" in kinds or "error" in kinds:
            out[node] = "failed"
        elif "skipped" in kinds:
            msg = case.find("skipped").get("type", "") + case.find("skipped").get("message", "")
            out[node] = "xfailed" if "xfail" in msg else "skipped"
        else:
            out[node] = "passed"
    return out


def listed(path):
    names = set()
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#") and "\t" in line:
                names.add(line.split("\t", 1)[0].strip())
    return names


def main():
    ref, ours, xf = outcomes(sys.argv[1]), outcomes(sys.argv[2]), listed(sys.argv[3])
    passed_ref = {n for n, o in ref.items() if o == "passed"}
    passed_ours = {n for n, o in ours.items() if o in ("passed", "xpassed")}
    xfailed = {n for n, o in ours.items() if o == "xfailed"}
    missing = sorted(n for n in passed_ref - passed_ours
                     if n not in xf and n.split("[", 1)[0] not in xf)
    print("tests run: %d on llama-server, %d on ganglion" % (len(ref), len(ours)))
    print("passed on llama-server: %d" % len(passed_ref))
    print("passed on ganglion: %d (of those %d also on llama-server)"
          % (len(passed_ours), len(passed_ours & passed_ref)))
    print("expected failures on ganglion (bench/llama-suite-xfail.txt): %d" % len(xfailed))
    for n in missing:
        print("REGRESSION: passed on llama-server, failed on ganglion: %s" % n)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
