"""Which watched files have landed completely, and which of them can be relabelled now.

Pure bookkeeping over successive listings of the input (no Beam): the poll
function of `relabel watch` (transforms/watch_files.py) feeds it one listing
per poll and emits the groups it releases.

A file has landed when
- a marker says so: `<file>.done` next to it, or `_SUCCESS` in its folder; or
- (unless markers are required) its size and mtime are the same in two
  consecutive polls and it is not empty.

A landed file is released as a group of files to relabel together:
- a `.pt` dump, or a Parquet file without `step`, is one batch: alone, at once;
- Parquet files with `step` may share a step with files still to come, so they
  are held until their step is closed: a landed file with a later step
  (producers write steps in order) or `_SUCCESS` in their folder. Held files
  whose steps overlap are released together, as `relabel run` groups them.
- A Parquet file whose steps overlap a step already released is late: it is
  released alone, marked late, and dead-lettered whole (`late-batch-file`):
  its rows were not part of the statistics its step was normalized with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from transforms.lib.plan import overlapping_components

DONE_SUFFIX = ".done"
SUCCESS_NAME = "_SUCCESS"


@dataclass(frozen=True)
class Seen:
    """One file in one listing."""
    path: str
    output: str
    size: int
    mtime: float
    marked: bool          # a .done or _SUCCESS marker covers it
    folder_closed: bool   # _SUCCESS in its folder

    def record(self) -> dict:
        return {"path": self.path, "output": self.output, "size": self.size, "mtime": self.mtime}

    @property
    def identity(self) -> tuple:
        return self.path, self.size, self.mtime


@dataclass
class Release:
    """Files to relabel together; late: dead-letter them whole instead."""
    files: list[dict]
    late: bool = False


@dataclass
class Landing:
    """The watcher's memory between polls. Losing it is safe: files are re-observed and files
    already relabelled (done) are skipped, at the cost of one extra poll before a file lands."""
    require_marker: bool = False
    previous: dict = field(default_factory=dict)      # path -> (size, mtime) at the last poll
    released: set = field(default_factory=set)        # identities released by this watcher
    held: dict = field(default_factory=dict)          # path -> (Seen, (low, high)) waiting for their step
    closed_steps: list = field(default_factory=list)  # (low, high) of step ranges already released
    newest_step: int | None = None                    # highest step of any landed file

    def observe(self, listing: list[Seen], is_done, step_range) -> list[Release]:
        """One poll. is_done(seen) -> (done, step range of the done file or None); step_range(seen)
        -> (low, high) or None (no usable `step`: one batch)."""
        current = {s.path: (s.size, s.mtime) for s in listing}
        releases: list[Release] = []
        for seen in listing:
            if seen.identity in self.released:
                continue
            stable = self.previous.get(seen.path) == (seen.size, seen.mtime) and seen.size > 0
            if not (seen.marked or (stable and not self.require_marker)):
                self.held.pop(seen.path, None)  # changed since it was held: observe it again
                continue
            done, done_range = is_done(seen)
            if done:
                self.released.add(seen.identity)
                if done_range is not None:
                    self._close(done_range)
                continue
            steps = step_range(seen)
            if steps is None:
                self.released.add(seen.identity)
                releases.append(Release([seen.record()]))
                continue
            if self._overlaps_closed(steps):
                self.released.add(seen.identity)
                releases.append(Release([seen.record()], late=True))
                continue
            self.held[seen.path] = (seen, steps)
            self.newest_step = steps[1] if self.newest_step is None else max(self.newest_step, steps[1])
        self.previous = current
        releases += self._release_closed_steps()
        return releases

    def waiting(self) -> list[str]:
        """Landed files held until their step closes."""
        return sorted(self.held)

    def _close(self, steps):
        self.closed_steps.append(tuple(steps))
        self.newest_step = steps[1] if self.newest_step is None else max(self.newest_step, steps[1])

    def _overlaps_closed(self, steps) -> bool:
        return any(low <= steps[1] and steps[0] <= high for low, high in self.closed_steps)

    def _release_closed_steps(self) -> list[Release]:
        releases = []
        for component in overlapping_components(list(self.held.values())):
            top = max(high for _, (_, high) in component)
            closed = self.newest_step is not None and self.newest_step > top
            if closed or all(seen.folder_closed for seen, _ in component):
                files = sorted((seen for seen, _ in component), key=lambda s: s.path)
                for seen in files:
                    self.released.add(seen.identity)
                    del self.held[seen.path]
                self.closed_steps.append((min(low for _, (low, _) in component), top))
                releases.append(Release([seen.record() for seen in files]))
        return releases
