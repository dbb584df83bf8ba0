"""Each row's prompt key: a column's value as it is (--prompt-key COL), else a hash of the prompt.

The default key is the lowercase hex SHA-256 of exactly these bytes:

- a text `prompt` column (else `input`, where verl's generation dumps keep the prompt): the text's UTF-8
  bytes;
- any other `prompt` column (chat messages as a list of structs, a dict): the UTF-8 bytes of its JSON text
  with sorted keys, no spaces (separators "," and ":") and non-ASCII characters kept as they are
  (json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False));
- no `prompt` column: the prompt tokens, each id as 8 bytes little-endian signed (int64), in order; the
  prompt tokens are the first len(tokens) - response_length ids of `tokens` (slime's and miles' layout:
  prompt then response), the response length being `response_length`, else the length of `loss_mask`.

Only distinct values are hashed (a step holds few prompts and many rows). A row whose prompt is null has
no key and is not counted.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.columns import fill, is_text, lookup_path, one_array

PROMPT_COLUMN = "prompt"
# where the prompt's text is, in order: ours, slime's, miles', AReaL's and TRL's `prompt`; verl's
# `_write_generations` `input` (verl-project/verl@1dda039b9c63, verl/trainer/ppo/v1/trainer_base.py)
PROMPT_TEXT_COLUMNS = (PROMPT_COLUMN, "input")
TOKENS_COLUMN = "tokens"
# what reading the prompt needs, besides the columns slim extraction reads (TOKENS_COLUMN, heavy, only
# where a file has no PROMPT_COLUMN)
PROMPT_COLUMNS = (*PROMPT_TEXT_COLUMNS, "response_length", "loss_mask")


@dataclass(frozen=True)
class FileKeys:
    """A file's rows by prompt key: codes[i] is row i's key's position in `keys` (-1: no key)."""
    codes: np.ndarray
    keys: list
    prompts: list  # each key's prompt (text, JSON text, or the token ids as JSON text; the least of its rows'
    #                prompts under --prompt-key), None where unknown


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_keys(table: pa.Table, source: str, prompt_key: str | None = None) -> FileKeys:
    """The prompt key of every row of `table` (read from `source`); BadFile when it has none to give."""
    if prompt_key is None:
        codes, texts, digests = _prompt_codes(table, source, required=True)
        return FileKeys(codes, digests, texts)
    values, why = lookup_path(table, prompt_key, "prompt key")
    if values is None:
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: --prompt-key {prompt_key}: {why}")
    if not (pa.types.is_integer(values.type) or pa.types.is_string(values.type)
            or pa.types.is_large_string(values.type)):
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: --prompt-key {prompt_key} has type {values.type}; a prompt "
                                             "key is text or an integer")
    codes, keys = _dictionary(values)
    text_codes, texts, _ = _prompt_codes(table, source, required=False)
    prompts: list = [None] * len(keys)
    both = (codes >= 0) & (text_codes >= 0)
    for code, text in set(zip(codes[both].tolist(), text_codes[both].tolist())):  # distinct pairs: few
        if prompts[code] is None or texts[text] < prompts[code]:
            prompts[code] = texts[text]
    return FileKeys(codes, keys, prompts)


def _dictionary(values: pa.Array) -> tuple[np.ndarray, list]:
    """(code per row, -1 where null; the distinct values)."""
    encoded = pc.dictionary_encode(one_array(values) if isinstance(values, pa.ChunkedArray) else values)
    codes = fill(encoded.indices, -1).astype(np.int64)
    return codes, encoded.dictionary.to_pylist()


def _encoded(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """A dictionary-encoded column's (code per row, -1 where null; its dictionary's values). Its chunks
    (row groups) share one dictionary once unified; a value twice in it, or in none of the rows, costs a
    hash only (keys are made distinct where the tally gathers them)."""
    chunks = column.unify_dictionaries().chunks
    if not chunks:
        return np.zeros(0, dtype=np.int64), []
    codes = fill(pa.chunked_array([chunk.indices for chunk in chunks]), -1).astype(np.int64)
    return codes, chunks[0].dictionary.to_pylist()


def _prompt_codes(table: pa.Table, source: str, required: bool) -> tuple[np.ndarray, list[str], list[str]]:
    """(code per row, -1 where it has no prompt; each code's prompt as the text that is hashed, or as token
    ids in JSON text for a prompt given by its tokens; each code's SHA-256)."""
    n = table.num_rows
    name = next((c for c in PROMPT_TEXT_COLUMNS if c in table.column_names), None)
    if name is not None:
        kind = table.column(name).type
        if pa.types.is_dictionary(kind) and is_text(kind.value_type):  # read dictionary-encoded
            codes, texts = _encoded(table.column(name))
        elif is_text((column := one_array(table.column(name))).type):
            codes, texts = _dictionary(column)
        else:
            codes, texts = _by_text([None if v is None else canonical_json(v) for v in column.to_pylist()])
        sha256 = hashlib.sha256  # one call a distinct prompt: the loop is most of the keying
        return codes, texts, [sha256(t.encode("utf-8")).hexdigest() for t in texts]
    if TOKENS_COLUMN in table.column_names:
        return _token_codes(table, source)
    if required:
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: no `{PROMPT_COLUMN}` or `{TOKENS_COLUMN}` column to key "
                                             "prompts by; name the column that identifies a prompt with "
                                             "--prompt-key COL")
    return np.full(n, -1, dtype=np.int64), [], []


def _by_text(texts: list) -> tuple[np.ndarray, list[str]]:
    seen: dict[str, int] = {}
    codes = np.array([-1 if t is None else seen.setdefault(t, len(seen)) for t in texts], dtype=np.int64)
    return codes, list(seen)


def _token_codes(table: pa.Table, source: str) -> tuple[np.ndarray, list[str], list[str]]:
    """Prompts given by their tokens: the ids before the response (module docstring), hashed as int64."""
    tokens = table.column(TOKENS_COLUMN).combine_chunks()
    if not (pa.types.is_list(tokens.type) or pa.types.is_large_list(tokens.type)) or not pa.types.is_integer(
            tokens.type.value_type):
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: `{TOKENS_COLUMN}` has type {tokens.type}, not a list of "
                                             "token ids; name the prompt's column with --prompt-key COL")
    lengths = fill(pc.list_value_length(tokens), 0).astype(np.int64)
    if "response_length" in table.column_names and pa.types.is_integer(table.column("response_length").type):
        response = fill(table.column("response_length"), -1).astype(np.int64)
    else:
        response = np.full(len(lengths), -1, dtype=np.int64)
    if "loss_mask" in table.column_names:
        mask_lengths = fill(pc.list_value_length(table.column("loss_mask").combine_chunks()), -1).astype(np.int64)
        response = np.where(response < 0, mask_lengths, response)
    unknown = np.flatnonzero((response < 0) | (response > lengths))
    if len(unknown):
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: row {int(unknown[0])}: the prompt is keyed by its tokens, "
                                             "but the response length (response_length, else the length of "
                                             "loss_mask) is missing or longer than `tokens`; give --prompt-key COL")
    offsets = np.asarray(tokens.offsets)[:-1].astype(np.int64) if tokens.offset == 0 else None
    values = tokens.flatten() if offsets is None else tokens.values
    ids = fill(pc.cast(values, pa.int64()), 0).astype("<i8")
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    seen: dict[bytes, int] = {}
    texts: list[str] = []
    digests: list[str] = []
    codes = np.full(len(lengths), -1, dtype=np.int64)
    valid = np.asarray(tokens.is_valid())
    for row in np.flatnonzero(valid).tolist():  # one bytes slice a row; each distinct prompt hashed once
        start = int(offsets[row])
        prompt = ids[start:start + int(lengths[row] - response[row])]
        data = prompt.tobytes()
        code = seen.get(data)
        if code is None:
            code = seen[data] = len(texts)
            texts.append(canonical_json(prompt.tolist()))
            digests.append(sha256_hex(data))
        codes[row] = code
    return codes, texts, digests
