"""The watcher's bookkeeping, poll by poll, without Beam."""
from rollout_relabel.transforms.lib.watch.landing import Landing, Seen


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


def test_step_per_file_releases_each_step_when_its_file_lands():
    steps = {"s0": (0, 0), "s1": (1, 1), "s1b": (1, 1), "s2a": (2, 2), "s2b": (2, 2)}
    landing = Landing(step_per_file=True)
    assert observe(landing, [seen("s0", marked=True)], steps) == [(["s0"], False)]  # not waiting for step 1
    assert landing.waiting() == []
    assert observe(landing, [seen("s1")], steps) == []                          # landing: not stable yet
    assert observe(landing, [seen("s1")], steps) == [(["s1"], False)]
    assert observe(landing, [seen("s1b", marked=True)], steps) == [(["s1b"], True)]  # its step was closed
    both = [seen("s2a", marked=True), seen("s2b", marked=True)]              # landed in one poll: together
    assert observe(landing, both, steps) == [(["s2a", "s2b"], False)]


def test_folder_batches_wait_for_success_or_a_later_folder():
    landing = Landing(batch_from="folder")
    v9 = [seen("run/9/a", marked=True), seen("run/9/b", marked=True)]
    assert observe(landing, v9) == []
    assert landing.waiting() == ["run/9/a", "run/9/b"]
    assert observe(landing, v9 + [seen("other/99/x", marked=True)]) == []     # another parent closes nothing
    v10 = [seen("run/10/a", marked=True)]                                    # 10 after 9 (natural order)
    assert observe(landing, v9 + v10) == [(["run/9/a", "run/9/b"], False)]
    assert observe(landing, [seen("run/9/c", marked=True)]) == [(["run/9/c"], True)]  # late
    closed = [seen("run/10/a", marked=True, folder_closed=True), seen("run/10/b", marked=True, folder_closed=True)]
    assert observe(landing, closed) == [(["run/10/a", "run/10/b"], False)]


def test_a_restarted_folder_watcher_learns_closed_folders_from_done_files():
    landing = Landing(batch_from="folder")
    listing = [seen("run/1/a", marked=True), seen("run/1/b", marked=True)]
    assert observe(landing, listing, done={"run/1/a"}) == [(["run/1/b"], True)]


def test_a_file_of_a_shared_batch_rewritten_after_it_was_relabelled_is_late_a_lone_one_is_redone():
    steps = {"s0": (0, 0), "s1": (1, 1)}
    before = {"s0", "dump"}  # relabelled earlier (by this watcher or another) in another version
    landing = Landing()
    listing = [seen("s0", size=11, marked=True), seen("s1", marked=True), seen("dump", size=11, marked=True)]
    releases = landing.observe(listing, lambda s: (False, None), lambda s: steps.get(s.path),
                               lambda s: s.path in before)
    assert [([f["path"] for f in r.files], r.late) for r in releases] == [(["s0"], True), (["dump"], False)]
    folders = Landing(batch_from="folder")
    releases = folders.observe([seen("a/x", marked=True)], lambda s: (False, None), lambda s: None, lambda s: True)
    assert [([f["path"] for f in r.files], r.late) for r in releases] == [(["a/x"], True)]
