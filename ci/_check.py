"""Small checks used by ci/test: the compatibility matrix and pytest's JUnit counts.

    python ci/_check.py matrix PKG...        every package has a row in ci/matrix.toml
    python ci/_check.py junit FILE           prints "passed failed skipped errors"
"""
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check_matrix(packages: list[str]) -> int:
    rows = tomllib.loads((ROOT / "ci" / "matrix.toml").read_text()).get("row", [])
    keys = ("package", "python", "torch", "cuda", "arch", "os", "verified", "commit", "result")
    bad = [i for i, r in enumerate(rows) if any(k not in r for k in keys)]
    if bad:
        print(f"matrix: rows {bad} lack one of the keys {keys}")
        return 1
    missing = sorted(set(packages) - {r["package"] for r in rows})
    if missing:
        print(f"matrix: no row in ci/matrix.toml for {', '.join(missing)}")
        return 1
    print(f"matrix: {len(rows)} rows, every package ({len(packages)}) has one")
    return 0


def junit_counts(path: str) -> int:
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    for s in suites:
        for k in totals:
            totals[k] += int(s.get(k, 0))
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    print(passed, totals["failures"], totals["skipped"], totals["errors"])
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit(check_matrix(args) if cmd == "matrix" else junit_counts(args[0]))
