"""Module-level matchers for assert_that on rollout_relabel.beam's outputs (closures would pickle by value)."""
from apache_beam.testing.util import BeamAssertException


def column_values(column: str, expected: list, keyed: bool = False):
    """Each output table's `column` as a list, compared as a multiset of lists (runners emit in any order);
    keyed: elements are (source, table) and compared as (source, list)."""
    def check(actual):
        got = sorted((e[0], e[1].column(column).to_pylist()) if keyed else e.column(column).to_pylist()
                     for e in actual)
        if got != sorted(expected):
            raise BeamAssertException(f"{column}: {got} != {sorted(expected)}")
    return check
