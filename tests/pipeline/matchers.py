"""Module-level matchers for assert_that (closures in test modules would be pickled by value)."""
from apache_beam.testing.util import BeamAssertException


def advantages_by_source(expected: dict, tol=1e-5):
    def check(actual):
        got = {}
        for source, table in actual:
            got.setdefault(source, []).extend(zip(table.column("row").to_pylist(),
                                                  table.column("advantage").to_pylist()))
        got = {s: [a for _, a in sorted(rows)] for s, rows in got.items()}
        if set(got) != set(expected):
            raise BeamAssertException(f"sources {sorted(got)} != {sorted(expected)}")
        for source, values in expected.items():
            if len(values) != len(got[source]) or any(abs(a - b) > tol for a, b in zip(values, got[source])):
                raise BeamAssertException(f"{source}: {got[source]} != {values}")
    return check


def manifest_counts(**expected):
    def check(actual):
        if len(actual) != 1:
            raise BeamAssertException(f"expected one manifest, got {len(actual)}")
        counts = actual[0]["counts"]
        wrong = {k: (counts.get(k), v) for k, v in expected.items() if counts.get(k) != v}
        if wrong:
            raise BeamAssertException(f"manifest counts (got, expected): {wrong}")
    return check


def dead_reasons(expected_rows_by_reason: dict):
    def check(actual):
        got = {}
        for item in actual:
            table = item[1] if isinstance(item, tuple) else item
            for reason in table.column("reason").to_pylist():
                got[reason] = got.get(reason, 0) + 1
        if got != expected_rows_by_reason:
            raise BeamAssertException(f"dead letters {got} != {expected_rows_by_reason}")
    return check
