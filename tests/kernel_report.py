"""The ending ptx-loads.py and sass-loads.py share: the instance counts checked, every
problem printed as a FAIL line, or the PASS line; the exit status."""


def finish(seen, expected, where, bad, passed):
    """seen / expected: instances per kernel; where: "PTX" or "SASS"; bad: the problems
    found so far; passed: the PASS line's text. Returns the exit status (1: a problem)."""
    for k, want in expected.items():
        if seen[k] != want:
            bad.append("%s: %d instances in the %s, expected %d" % (k, seen[k], where, want))
    for line in bad:
        print("FAIL: " + line)
    if not bad:
        print("PASS: " + passed)
    return 1 if bad else 0
