"""The watcher's bookkeeping, poll by poll, without Beam."""
from transforms.lib.watch_landing import Landing, Seen


def seen(path, size=10, mtime=1.0, marked=False, folder_closed=False):
    return Seen(path, f"part-{path}.parquet", size, mtime, marked, folder_closed)


def observe(landing, listing, steps=None, done=()):
    steps = steps or {}
    releases = landing.observe(listing, lambda s: (s.path in done, steps.get(s.path)), lambda s: steps.get(s.path))
    return [([f["path"] for f in r.files], r.late) for r in releases]


def test_a_file_lands_when_unchanged_across_two_polls():
    landing = Landing()
    assert observe(landing, [seen("a", size=5)]) == []
    assert observe(landing, [seen("a", size=9, mtime=2.0)]) == []   # still growing
    assert observe(landing, [seen("a", size=9, mtime=2.0)]) == [(["a"], False)]
    assert observe(landing, [seen("a", size=9, mtime=2.0)]) == []   # released once
    assert observe(landing, [seen("a", size=12, mtime=3.0)]) == []  # rewritten: observed again
    assert observe(landing, [seen("a", size=12, mtime=3.0)]) == [(["a"], False)]


def test_empty_files_wait_and_markers_release_at_once():
    landing = Landing()
    assert observe(landing, [seen("e", size=0), seen("m", marked=True)]) == [(["m"], False)]
    assert observe(landing, [seen("e", size=0)]) == []
    strict = Landing(require_marker=True)
    assert observe(strict, [seen("a")]) == [] and observe(strict, [seen("a")]) == []
    assert observe(strict, [seen("a", marked=True)]) == [(["a"], False)]


def test_done_files_are_skipped():
    landing = Landing()
    observe(landing, [seen("a"), seen("b")], done={"a"})
    assert observe(landing, [seen("a"), seen("b")], done={"a"}) == [(["b"], False)]


def test_steps_are_held_until_a_later_step_lands_then_late_files_are_flagged():
    steps = {"s0a": (0, 0), "s0b": (0, 0), "s1": (1, 1), "s0c": (0, 0), "s2": (2, 2)}
    landing = Landing()
    first = [seen("s0a", marked=True), seen("s0b", marked=True)]
    assert observe(landing, first, steps) == []
    assert landing.waiting() == ["s0a", "s0b"]
    assert observe(landing, first + [seen("s1", marked=True)], steps) == [(["s0a", "s0b"], False)]
    assert observe(landing, first + [seen("s1", marked=True), seen("s0c", marked=True)], steps) == [(["s0c"], True)]
    assert landing.waiting() == ["s1"]
    closing = [seen("s1", marked=True, folder_closed=True)]
    assert observe(landing, closing, steps) == [(["s1"], False)]


def test_a_restarted_watcher_learns_closed_steps_from_done_files():
    steps = {"s0a": (0, 0), "s0b": (0, 0)}
    landing = Landing()
    listing = [seen("s0a", marked=True), seen("s0b", marked=True)]
    assert observe(landing, listing, steps, done={"s0a"}) == [(["s0b"], True)]
