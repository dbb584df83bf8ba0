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


def streamed_advantages(expected: dict, tol=1e-6):
    """Training tables of streamed groups: {(step, group_index): [(index, advantage), ...] in row order}."""
    def check(actual):
        got = {}
        for table in actual:
            steps, groups = set(table.column("step").to_pylist()), set(table.column("group_index").to_pylist())
            if len(steps) != 1 or len(groups) != 1:
                raise BeamAssertException(f"one table holds several groups: steps {steps}, groups {groups}")
            key = (steps.pop(), groups.pop())
            if key in got:
                raise BeamAssertException(f"group {key} emitted twice")
            got[key] = list(zip(table.column("index").to_pylist(), table.column("advantage").to_pylist()))
        if set(got) != set(expected):
            raise BeamAssertException(f"groups {sorted(got)} != {sorted(expected)}")
        for key, rows in expected.items():
            if [i for i, _ in got[key]] != [i for i, _ in rows] or any(
                    abs(a - b) > tol for (_, a), (_, b) in zip(got[key], rows)):
                raise BeamAssertException(f"group {key}: {got[key]} != {rows}")
    return check


def dead_messages(expected: list):
    """Dead letters as sorted (reason, row_json index, message fragment) triples; fragment must be in message."""
    def check(actual):
        import json
        got = sorted((reason, json.loads(row_json)["index"], message)
                     for table in actual
                     for reason, row_json, message in zip(table.column("reason").to_pylist(),
                                                         table.column("row_json").to_pylist(),
                                                         table.column("message").to_pylist()))
        want = sorted(expected)
        if len(got) != len(want) or any(g[:2] != w[:2] or w[2] not in g[2] for g, w in zip(got, want)):
            raise BeamAssertException(f"dead letters {got} != {want}")
    return check
