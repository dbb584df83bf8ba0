"""A group of one run's files -> a tally batch, a row per prompt (and run or step): what TallyDifficulty combines.

The units are the ones the labeling defines (docs/semantics.md, "Vocabulary"): every batch of rollouts
goes through label_batch, the same function `relabel run` labels with, and a unit is a row it marks
`mainstream` (under the rollout semantics one row a rollout, its reward the rollout's; under the row
semantics every row). Rows it dead-letters are not counted (they are counted in `rows_dead`). Training
rows a `relabel run` wrote carry the flag already: their units are read, not recomputed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.difficulty import tally_batch
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import EXISTING, TRAINING_ROWS, DifficultySettings
from rollout_relabel.transforms.lib.difficulty.prompt_keys import (
    PROMPT_COLUMNS,
    PROMPT_TEXT_COLUMNS,
    TOKENS_COLUMN,
    FileKeys,
    file_keys,
)
from rollout_relabel.transforms.lib.difficulty.tally import Tally, exact_group_parts
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.columns import fill, mapped_columns
from rollout_relabel.transforms.lib.io.input_file import InputFile
from rollout_relabel.transforms.lib.io.readers import read_input
from rollout_relabel.transforms.lib.labeling.file_group import Buckets, Unreadable, read_slim
from rollout_relabel.transforms.lib.labeling.label_batch import label_batch
from rollout_relabel.transforms.lib.labeling.slim import slim_input_columns
from rollout_relabel.transforms.lib.settings import Labeling

MAINSTREAM = "mainstream"
COUNTS = ("files", "files_unreadable", "rows_in", "rows_dead", "units", "units_without_key")


@dataclass(frozen=True)
class Work:
    """Groups of one run's files, each group sharing no batch with the run's other files (a batch never
    spans two groups, so each group is labelled alone); an element of the stage packs one or more."""
    run: str
    kind: str  # settings.ROLLOUTS, TRAINING_ROWS or EXISTING (the rows of the table being added to)
    labeling: Labeling
    entries: tuple[InputFile, ...]
    group_sizes: tuple[int, ...] = ()  # how many of `entries` each group holds, in order; () is one group

    def groups(self) -> list[tuple[InputFile, ...]]:
        sizes = self.group_sizes or (len(self.entries),)
        if sum(sizes) != len(self.entries):
            raise ValueError(f"group sizes {sizes} do not add up to the {len(self.entries)} files of run {self.run}")
        bounds = np.cumsum((0, *sizes)).tolist()
        return [self.entries[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


@dataclass
class _FileUnits:
    """What a read file gives its units: each row's key code, reward and step."""
    keys: FileKeys
    reward: np.ndarray
    step: np.ndarray      # int64; meaningful where has_step
    has_step: np.ndarray


def tally_states(work: Work, settings: DifficultySettings, device: str = "cpu") -> Iterator[pa.Table | dict]:
    """The work's tally batch (tally_batch.BATCH: a row per key its units have), then one dict of counts
    (COUNTS); `device` runs the core (the resolved one: cpu or cuda)."""
    return tally_pack((work,), settings, device)


def tally_pack(works: Sequence[Work], settings: DifficultySettings, device: str = "cpu"
               ) -> Iterator[pa.Table | dict]:
    """tally_states of each work in turn, with one read-ahead thread for all their files: while one file
    is slimmed and labelled, the next is read, the next work's first one too. pyarrow decodes without the
    GIL, so a local run (one thread of Beam's) decodes on another core meanwhile."""
    readers = {id(work): _Reader(work, settings) for work in works if work.kind != EXISTING}
    planned = [(work, entry) for work in works if work.kind != EXISTING for entry in work.entries]
    with ThreadPoolExecutor(1, thread_name_prefix="read-ahead") as pool:
        reads = _one_ahead(planned, lambda item: readers[id(item[0])].read(item[1]), pool)
        for work in works:
            if work.kind == EXISTING:
                for entry in work.entries:
                    yield tally_batch.existing(read_input(entry, max_bytes=settings.max_file_bytes)[0], settings.by)
            else:
                yield from _tally_read(work, readers[id(work)].labeling, reads, settings, device)


class _Reader:
    """How a work's files are read on the read-ahead thread: the columns its labelling and keys need, and
    each file's prompt keys, computed there too (hashing the prompts balances the two threads' work)."""

    def __init__(self, work: Work, settings: DifficultySettings):
        self.labeling = (work.labeling if work.kind != TRAINING_ROWS
                         else dataclasses.replace(work.labeling, batch_from="file"))
        self.columns = _columns(self.labeling, settings, training_rows=work.kind == TRAINING_ROWS)
        self.encoded = _encoded_columns(self.labeling)
        self.settings = settings

    def read(self, entry: InputFile) -> tuple[pa.Table, dict, FileKeys | BadFile]:
        """(the rows, the batch metadata, the rows' prompt keys or why there are none). On the read-ahead
        thread, which decodes on itself: pyarrow's own pool would take turns for the core the labelling
        thread uses."""
        settings = self.settings
        table, metadata = read_input(entry, self.columns, settings.max_file_bytes, use_threads=False,
                                     dictionary=self.encoded)
        if settings.prompt_key is None and not any(c in table.column_names for c in PROMPT_TEXT_COLUMNS):
            # prompts given by their tokens only: the heavy column is read for these files alone
            tokens, _ = read_input(entry, (TOKENS_COLUMN,), settings.max_file_bytes, use_threads=False)
            if TOKENS_COLUMN in tokens.column_names:
                table = table.append_column(TOKENS_COLUMN, tokens.column(TOKENS_COLUMN))
        try:
            keys: FileKeys | BadFile = file_keys(mapped_columns(table, self.labeling.columns), entry.path,
                                                 settings.prompt_key)
        except BadFile as bad:
            keys = bad
        return table, metadata, keys


def _tally_read(work: Work, labeling: Labeling, reads: Iterator, settings: DifficultySettings, device: str
                ) -> Iterator[pa.Table | dict]:
    """One work's tally batch and counts, its files taken from `reads` (_one_ahead's) in order."""
    counts = dict.fromkeys(COUNTS, 0)
    files: dict[str, _FileUnits] = {}
    units: list[tuple[str, np.ndarray]] = []  # (source, its unit rows)
    keys_of: dict[str, FileKeys | BadFile] = {}  # a file read -> its rows' prompt keys (or why it has none)

    def read_next(entry: InputFile) -> tuple[pa.Table, dict]:
        (planned_work, planned), found = next(reads)
        if planned is not entry or planned_work is not work:
            raise RuntimeError(f"{entry.path} was read out of its work's order")
        table, metadata, keys_of[entry.path] = found.result()
        return table, metadata

    for group in work.groups():
        buckets = Buckets()
        for item in read_slim(group, read_next, labeling):
            counts["files"] += 1
            if isinstance(item, Unreadable):
                counts["files_unreadable"] += 1
                keys_of.pop(item.source, None)
                continue
            try:
                files[item.source] = _file_units(item.table, item.metadata, item.parts, keys_of.pop(item.source),
                                                 labeling)
                if work.kind == TRAINING_ROWS:
                    units.append((item.source, _marked_units(item.table, item.parts, item.source)))
            except BadFile:
                counts["files_unreadable"] += 1
                files.pop(item.source, None)
                continue
            counts["rows_in"] += item.table.num_rows
            if work.kind != TRAINING_ROWS:
                buckets.add(item)
        for batch_key, parts, sizes in buckets.in_order():
            batch = label_batch(batch_key, parts, sizes, labeling, device)
            counts["rows_dead"] += batch.dead.num_rows
            for source, result in batch.results.items():
                mainstream = np.asarray(result.column(MAINSTREAM).to_numpy(zero_copy_only=False), dtype=bool)
                units.append((source, np.asarray(result.column("row"))[mainstream]))
    tallied = _tallies(work.run, files, units, settings, counts)
    if tallied is not None:
        yield tallied
    yield counts


def _one_ahead(entries: Sequence, fn: Callable, pool: ThreadPoolExecutor) -> Iterator[tuple[object, Future]]:
    """(entry, the future of fn(entry)) for each entry in order; the next entry's is computed on the pool's
    thread while the caller waits on, and works with, this one."""
    ahead: Future | None = None
    for i, entry in enumerate(entries):
        current = ahead if ahead is not None else pool.submit(fn, entry)
        ahead = pool.submit(fn, entries[i + 1]) if i + 1 < len(entries) else None
        yield entry, current


def tally_work(work: Work, settings: DifficultySettings, device: str = "cpu"
               ) -> Iterator[tuple[tuple, Tally] | dict]:
    """(key, Tally) for each key the work's units have, then one dict of counts (COUNTS); `device` runs
    the core (the resolved one: cpu or cuda)."""
    for item in tally_states(work, settings, device):
        if isinstance(item, dict):
            yield item
        else:
            for key, state in tally_batch.states(item, settings.by):
                yield key, Tally(*state)


def _columns(labeling: Labeling, settings: DifficultySettings, training_rows: bool) -> tuple[str, ...]:
    extra = PROMPT_COLUMNS + ((MAINSTREAM,) if training_rows else ())
    if settings.prompt_key is not None:
        extra += (settings.prompt_key, settings.prompt_key.split(".", 1)[0])
    return tuple(dict.fromkeys(slim_input_columns(labeling) + extra))


def _encoded_columns(labeling: Labeling) -> tuple[str, ...]:
    """The prompt's text columns read dictionary-encoded (a step repeats each prompt over its rollouts, and
    only the distinct ones are hashed): those the labelling does not read as values itself (a --column
    source, or `input`, by which --group-key verl-uid groups a legacy verl dump)."""
    read = set(slim_input_columns(labeling)) | ({"input"} if labeling.group_key == "verl-uid" else set())
    return tuple(c for c in PROMPT_TEXT_COLUMNS if c not in read)


def _file_units(table: pa.Table, metadata: dict, parts, keys: FileKeys | BadFile, labeling: Labeling) -> _FileUnits:
    """A file's units' keys (file_keys', or the BadFile it raised), rewards and steps."""
    if isinstance(keys, BadFile):
        raise keys
    mapped = mapped_columns(table, labeling.columns)
    n = table.num_rows
    reward = np.zeros(n)
    for _, slim in parts:
        reward[np.asarray(slim.column("row"))] = fill(slim.column("reward"), 0.0)
    if "step" in mapped.column_names and pa.types.is_integer(mapped.column("step").type):
        column = mapped.column("step")
        step, has_step = fill(column, 0).astype(np.int64), np.asarray(column.is_valid())
    elif metadata.get("step") is not None:  # a .pt dump: its rollout_id counts training steps
        step, has_step = np.full(n, int(metadata["step"]), dtype=np.int64), np.ones(n, dtype=bool)
    else:
        step, has_step = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    return _FileUnits(keys, reward, step, has_step)


def _marked_units(table: pa.Table, parts, source: str) -> np.ndarray:
    """Training rows: the rows flagged mainstream (and read without a problem)."""
    if MAINSTREAM not in table.column_names:
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: no `{MAINSTREAM}` column: not training rows of relabel run")
    flagged = fill(pc.cast(table.column(MAINSTREAM), pa.bool_()), False).astype(bool)
    for _, slim in parts:
        rows = np.asarray(slim.column("row"))
        flagged[rows] &= fill(slim.column("problem"), 0) == 0
    return np.flatnonzero(flagged)


def _tallies(run: str, files: dict[str, _FileUnits], units, settings: DifficultySettings,
             counts: dict) -> pa.Table | None:
    """The units of every file grouped by key (prompt, and run or step under --by): a tally batch with a
    row a key, or None without units."""
    offsets: dict[str, int] = {}  # a file's first key in all_keys
    all_keys: list = []
    all_prompts: list = []
    key_parts, rewards, steps, has_steps = [], [], [], []
    for source, rows in sorted(units, key=lambda u: u[0]):
        found = files.get(source)
        if found is None or not len(rows):
            continue
        codes = found.keys.codes[rows]
        counts["units"] += len(rows)
        counts["units_without_key"] += int((codes < 0).sum())
        keep = codes >= 0
        rows, codes = rows[keep], codes[keep]
        offset = offsets.get(source)
        if offset is None:  # a file's units may come from several batches: its keys are added once
            offset = offsets[source] = len(all_keys)
            all_keys += found.keys.keys
            all_prompts += found.keys.prompts
        key_parts.append(codes + offset)
        rewards.append(found.reward[rows])
        steps.append(found.step[rows])
        has_steps.append(found.has_step[rows])
    if not key_parts:
        return None
    # the files' keys as one set (a key in several files once), and each key's least prompt
    encoded = pc.dictionary_encode(tally_batch.key_array(all_keys))
    position = encoded.indices.to_numpy()
    names = encoded.dictionary  # position -> key
    prompts = pa.array(all_prompts, pa.string())
    if len(names) < len(position):
        least = pa.table({"at": position, "prompt": prompts}).group_by("at", use_threads=False).aggregate(
            [("prompt", "min")])
        prompts = least.column("prompt_min").take(pc.sort_indices(least.column("at")))
    key = position[np.concatenate(key_parts)]
    reward, step, has_step = np.concatenate(rewards), np.concatenate(steps), np.concatenate(has_steps)
    if settings.by == "step":
        # one group per (prompt, step); a unit without a step is a group of its own kind (step null)
        pairs = np.stack([key, np.where(has_step, step, 0), has_step.astype(np.int64)], axis=1)
        distinct, group = np.unique(pairs, axis=0, return_inverse=True)
        key_of_group = distinct[:, 0]
    else:  # np.unique(key, return_inverse=True) without its sort: the keys are positions in `names`
        present = np.zeros(len(names), dtype=bool)
        present[key] = True
        key_of_group = np.flatnonzero(present)
        group = (np.cumsum(present) - 1)[key]
    group = group.reshape(-1)
    groups = len(key_of_group)
    passes = np.bincount(group, weights=(reward >= settings.pass_threshold), minlength=groups).astype(np.int64)
    big = np.iinfo(np.int64).max
    first = np.full(groups, big, dtype=np.int64)
    last = np.full(groups, -big - 1, dtype=np.int64)
    np.minimum.at(first, group[has_step], step[has_step])
    np.maximum.at(last, group[has_step], step[has_step])
    unstepped = first == big
    take = pa.array(key_of_group)
    seen_in = pa.array([run] * groups, pa.string())
    columns = {
        tally_batch.KEY: names.take(take),
        tally_batch.ROLLOUTS: pa.array(np.bincount(group, minlength=groups).astype(np.int64)),
        tally_batch.PASSES: pa.array(passes),
        tally_batch.PARTS: exact_group_parts(group, reward, groups),
        tally_batch.SEEN_IN: seen_in,
        tally_batch.RUNS_ELSEWHERE: pa.array(np.zeros(groups, dtype=np.int64)),
        tally_batch.FIRST: pa.array(first, mask=unstepped),
        tally_batch.LAST: pa.array(last, mask=unstepped),
        tally_batch.PROMPT: prompts.take(take),
    }
    if settings.by == "run":
        columns[tally_batch.RUN] = seen_in
    elif settings.by == "step":
        columns[tally_batch.STEP] = pa.array(distinct[:, 1], mask=distinct[:, 2] == 0)
    return tally_batch.make(columns, settings.by)
