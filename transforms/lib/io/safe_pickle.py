"""`.pt` dumps loaded at the speed of the C unpickler, refusing what `torch.load(weights_only=True)` refuses.

`torch.load(weights_only=True)` is the reference: nothing in a dump may run code, and the result is
the objects torch gives. Its unpickler is written in Python (about ten times slower than the C one on
a rollout dump, where almost every opcode is a number in a token, mask or log-prob list). Here the C
unpickler (`pickle.Unpickler`) reads torch's zip layout (torch/serialization.py `_save` and `_load`,
torch 2.13): `<name>/data.pkl` is a protocol-2 pickle whose tensors name their storages by
persistent id `("storage", <TorchStorage class>, key, location, numel)`, each storage being the
record `<name>/data/<key>`; `<name>/byteorder` says how numbers are laid out.

How it stays as safe as the reference ("Restricting Globals" in Python's pickle docs):

- `find_class` resolves only an exact (module, name) from a short list, a subset of what
  torch/_weights_only_unpickler.py `_get_allowed_globals` admits: the tensor rebuild function
  `torch._utils._rebuild_tensor_v2`, the typed storage classes (as torch's `StorageType`, like the
  reference) and `collections.OrderedDict`. No import by name, no attribute chain, nothing from
  builtins. Every callable a pickle can reach is one of these: the objects they return (tensors,
  storages, empty hook dicts) are not callable. What it hands out takes no state (`Admitted`, a
  storage type of a loading class): `BUILD` on a function would write into its `__dict__`, shared
  by every later load in the process.
- Each load's objects belong to that load (`_Load`): nothing a dump does outlives its load, and no
  cycle keeps a load's tensors alive after its result is gone.
- A tensor's view must lie inside its storage (`_within`), as torch's `set_()` requires of its
  storages, which cannot grow; ours could, and would show the memory behind them.
- `persistent_load` admits only a storage id, reads the record's bytes (CRC checked, as torch's zip
  reader does) into a new storage; never unpickles them.
- While loading, tensors and storages are of private subclasses that refuse item assignment,
  `BUILD` (`__setstate__`) and the container methods the pickle machine calls on a non-list
  (`append`, `extend`, `add`): the reference refuses those opcodes on them. Once the pickle has
  ended they become plain `torch.Tensor` / `TypedStorage` again.
- The fast path never refuses anything itself. Whatever it does not handle exactly as the reference
  (another pickle protocol, the legacy non-zip format, a big-endian dump, a compressed record, a
  global outside its short list, a rebuild with gradients or hooks, an `OrderedDict` given state,
  any error) makes it hand the file to `torch.load(weights_only=True)`, whose answer is the answer.
  So a refusal is always the reference's, and costs the reference's time only on bad files.

What the C unpickler still does that the reference refuses, all inert (no call outside the list
above, no object beyond plain containers): opcodes of later pickle protocols inside a stream that
declares protocol 2, item assignment on a list and `BUILD` with an empty state on a plain container.
A stream written by `torch.save` never holds them.

What no framework writes is refused before any parser sees it (`check_shape`): a file that is
neither a zip nor torch's legacy format (a pickle of torch's magic number) never reaches
`torch.load`, which would first try it as a tar archive (Python's tar header parser is quadratic on
some headers, CVE-2024-6232), and neither does a file whose first block reads as a tar header.

The zip directory is read here, not with `zipfile`: `zipfile` and torch's reader (miniz, behind
caffe2/serialize/inline_container.cc `PyTorchStreamReader`) resolve some archives differently
(`zipfile` shifts every offset when the central directory is not where the end record says, reads
entries beyond the end record's count, looks names up case-sensitively where miniz does not). The
fast path takes only an archive where the two cannot differ (`_directory`), with every name under
the archive's folder and none with a `.`, `..` or empty part, and hands any other to the reference.
(inline_container.cc read at commit 02b040c; the behaviours checked against torch 2.13's reader in
tests/transforms/lib/io/test_safe_pickle.py.)

Failures travel as types: UnsafePickle (the reference refused the pickle: `pickle.UnpicklingError`)
and UnreadableDump (anything else: not a zip, truncated, a bad record).
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import re
import struct
import sys
import tarfile
import zlib
from collections import OrderedDict
from contextlib import ExitStack

PROTOCOL_2 = b"\x80\x02"  # torch.save's default pickle protocol, the only one taken on the fast path
_LOCAL_SIGNATURE = b"PK\x03\x04"
# The zip records the fast path reads (APPNOTE.TXT 4.3): the local header (signature, then the name and
# extra field lengths), the central directory's header, the end record and zip64's end record and locator.
_LOCAL_HEADER = struct.Struct("<4s22xHH")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_END = struct.Struct("<4s4H2LH")
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_NO_32_BIT_VALUE = 0xFFFFFFFF  # a size or offset kept in a zip64 extra field
# torch's legacy (non-zip) format opens with its magic number pickled (torch/serialization.py
# `MAGIC_NUMBER`, `_legacy_save`), in any pickle protocol from 2 (a frame header from protocol 4)
_LEGACY_MAGIC = re.compile(rb"\x80[\x02-\x05](?:\x95[\x00-\xff]{8})?\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19\.")
_TAR_BLOCK = 512


class UnsafePickle(Exception):
    """torch.load(weights_only=True) refused the pickle: loading it would need arbitrary unpickling."""


class UnreadableDump(Exception):
    """The file is not a readable torch dump (not a zip/pickle, truncated, a bad record)."""


class Declined(Exception):
    """The fast path cannot vouch for this file (it never refuses one itself); the reference decides."""




def load(path: str | None = None, data: bytes | None = None):
    """The object `torch.load(<file>, map_location="cpu", weights_only=True)` gives.

    `path`: a local file, read through a memory map (never copied whole); `data`: the file's bytes
    (a remote store's object). Raises UnsafePickle or UnreadableDump.
    """
    try:
        return fast_load(path, data)
    except Declined:
        pass
    check_shape(path, data)
    return reference_load(path if data is None else io.BytesIO(data))


def check_shape(path: str | None = None, data: bytes | None = None) -> None:
    """UnreadableDump unless the file opens as torch writes one: a zip, or its legacy format (and no tar).

    Run before torch.load, which tries every non-zip file as a tar archive first."""
    if data is None:
        if path is None:
            raise ValueError("check_shape needs the dump's path or its bytes")
        with open(path, "rb") as handle:
            head = handle.read(_TAR_BLOCK)
    else:
        head = bytes(data[:_TAR_BLOCK])
    if head[:4] == _LOCAL_SIGNATURE:  # torch.load's own test for its zip format
        return
    if not _LEGACY_MAGIC.match(head):
        raise UnreadableDump("neither a zip archive nor torch's legacy format")
    if len(head) == _TAR_BLOCK:
        try:
            tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            return
        raise UnreadableDump("its first block is a tar header: torch.load would parse it as a tar archive")


def reference_load(source):
    """torch.load(weights_only=True), its failures as types: the reference's refusals are
    `pickle.UnpicklingError` (torch re-raises every error of its restricted unpickler as one)."""
    import torch

    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafePickle(str(error).strip().splitlines()[0] if str(error).strip() else "refused") from error
    except Exception as error:  # noqa: BLE001 - every other failure means the file cannot be read
        raise UnreadableDump(f"{type(error).__name__}: {error}") from error


# --------------------------------------------------------------------------- the fast path


def fast_load(path: str | None = None, data: bytes | None = None):
    """The fast path alone: what the reference gives, or Declined (never a refusal of its own)."""
    try:
        return _fast_load(path, data)
    except Declined:
        raise
    except Exception as error:  # noqa: BLE001 - any surprise on the fast path: the reference decides, exactly
        raise Declined(f"{type(error).__name__}: {error}") from error


def _fast_load(path, data):
    with ExitStack() as stack:
        if data is None:
            handle = stack.enter_context(open(path, "rb"))
            if os.fstat(handle.fileno()).st_size == 0:
                raise Declined
            buffer = stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
        else:
            buffer = data
        if buffer[:4] != _LOCAL_SIGNATURE:  # torch's own test for its zip format; else the legacy format
            raise Declined
        archive = _Archive(memoryview(buffer))
        stack.callback(archive.close)  # runs before the memory map closes
        loader = _Unpickler(archive)
        try:
            result = loader.load()
            loader.finish()
        finally:
            loader.forget()
        return result


def _directory(view: memoryview) -> dict[bytes, tuple[int, int, int]]:
    """{name: (local header offset, size, CRC)} of a stored zip that `zipfile` and miniz read alike, else Declined.

    What miniz (torch's reader) does and `zipfile` does not, each made impossible here: it reads the
    central directory at the offset the end record gives (`zipfile` at the bytes before the end record,
    shifting every entry's offset by the difference), only as many entries as the end record counts, and
    finds a name case-insensitively (ASCII). So: no comment (the end record is the file's last 22 bytes,
    where both look first), the central directory ends where the end record (or zip64's) begins, exactly
    the counted entries fill it, no two names equal but for case. torch.save writes all of that.
    """
    end = len(view) - _END.size
    if end < 0:
        raise Declined
    signature, disk, directory_disk, here, count, size, offset, comment = _END.unpack_from(view, end)
    if signature != b"PK\x05\x06" or comment or disk or directory_disk or here != count:
        raise Declined
    directory_end = end
    locator = end - _ZIP64_LOCATOR.size
    if locator >= 0 and view[locator:locator + 4] == b"PK\x06\x07":  # torch.save always writes zip64's records
        _, record_disk, record, disks = _ZIP64_LOCATOR.unpack_from(view, locator)
        if record_disk or disks != 1 or record != locator - _ZIP64_END.size:
            raise Declined
        (signature, record_size, _, _, disk, directory_disk, here, count64, size64,
         offset64) = _ZIP64_END.unpack_from(view, record)
        if (signature != b"PK\x06\x06" or record_size != _ZIP64_END.size - 12 or disk or directory_disk
                or here != count64 or count not in (count64, 0xFFFF) or size not in (size64, _NO_32_BIT_VALUE)
                or offset not in (offset64, _NO_32_BIT_VALUE)):
            raise Declined
        count, size, offset, directory_end = count64, size64, offset64, record
    if offset + size != directory_end:
        raise Declined
    entries, folded = {}, set()
    position = offset
    for _ in range(count):
        if position + _CENTRAL.size > directory_end:
            raise Declined
        (signature, _, _, flags, method, _, _, crc, compressed, length, name_length, extra_length, comment_length,
         start_disk, _, _, header) = _CENTRAL.unpack_from(view, position)
        if (signature != b"PK\x01\x02" or method != 0 or flags & 0x1 or compressed != length or start_disk
                or _NO_32_BIT_VALUE in (length, header)):  # stored, not encrypted, no zip64 extra field
            raise Declined
        name = view[position + _CENTRAL.size:position + _CENTRAL.size + name_length].tobytes()
        position += _CENTRAL.size + name_length + extra_length + comment_length
        if name.lower() in folded:  # bytes.lower() folds ASCII only, as miniz's MZ_TOLOWER
            raise Declined
        folded.add(name.lower())
        entries[name] = (header, length, crc)
    if position != directory_end:
        raise Declined
    return entries


class _Archive:
    """The records of a torch zip, as views of the file's bytes."""

    def __init__(self, view: memoryview):
        self.view = view
        self.views = [view]  # every view of the file, released before the memory map closes
        self.folded: set[bytes] | None = None  # the entries' names case-folded, built on first lookup
        try:
            self.entries = _directory(view)
            names = list(self.entries)
            if not names or b"/" not in names[0]:
                raise Declined
            # torch's reader takes the folder of the first record as the archive's name, and finds every
            # record under it; the fast path takes no name outside it, none with a `.`, `..` or empty part
            self.prefix = names[0].split(b"/", 1)[0] + b"/"
            if any(not name.startswith(self.prefix) or b"\\" in name
                   or {b"", b".", b".."} & set(name.split(b"/")) for name in names):
                raise Declined
            if self.has(".data/version") or self.has("constants.pkl"):  # another version record; TorchScript
                raise Declined
            if self.record("byteorder").tobytes() != sys.byteorder.encode() or sys.byteorder != "little":
                raise Declined
            if self.record("version").tobytes() not in (b"3\n", b"3"):  # what torch 2.x writes
                raise Declined
            pickled = self.record("data.pkl")
            if pickled[:2] != PROTOCOL_2:
                raise Declined
            self.pickled = pickled
        except BaseException:
            self.close()  # the views go before the memory map closes, also when the fast path gives up here
            raise

    def has(self, name: str) -> bool:
        """Whether torch's reader finds the record (its lookup ignores ASCII case)."""
        if self.folded is None:
            self.folded = {entry.lower() for entry in self.entries}
        return (self.prefix + name.encode()).lower() in self.folded

    def record(self, name: str) -> memoryview:
        entry = self.entries.get(self.prefix + name.encode())
        if entry is None:  # torch might still find it under another case: the reference decides
            raise Declined
        start, length, crc = entry
        signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(self.view, start)
        if (signature != _LOCAL_SIGNATURE
                or self.view[start + _LOCAL_HEADER.size:start + _LOCAL_HEADER.size + name_length].tobytes()
                != self.prefix + name.encode()):
            raise Declined
        start += _LOCAL_HEADER.size + name_length + extra_length
        record = self.view[start:start + length]
        self.views.append(record)
        if len(record) != length or zlib.crc32(record) != crc:
            raise Declined
        return record

    def close(self):
        for view in reversed(self.views):
            view.release()


def _frozen(base):
    """A subclass of `base` whose instances refuse what the reference refuses on them mid-load."""
    def refuse(self, *args, **kwargs):
        raise Declined

    return type(f"_Loading{base.__name__}", (base,), {
        "__slots__": (), "__setitem__": refuse, "__setstate__": refuse, "append": refuse, "extend": refuse,
        "add": refuse, "__module__": __name__})


_TORCH = None  # torch and the loading classes, made on the first .pt dump (torch is a heavy import)


def _torch():
    global _TORCH
    if _TORCH is None:
        import torch
        from torch._utils import _rebuild_tensor_v2
        from torch.serialization import StorageType

        _TORCH = (torch, _rebuild_tensor_v2, StorageType, _frozen(torch.Tensor), _frozen(torch.storage.TypedStorage),
                  _frozen(StorageType))
    return _TORCH


class Admitted:
    """What find_class hands out for an admitted name: a call into our own code that takes no state.

    A function or bound method would take `BUILD` into its `__dict__` (the function's, shared by every
    later load in the process); this refuses it (raising `refusal`), and has no attribute a pickle can reach.
    It holds the load, never the unpickler, so that nothing it is memoized with forms a cycle. The SkyRL
    reader's restricted unpickler hands out the same (formats/skyrl_format.py).
    """
    __slots__ = ("_call", "_refusal")

    def __init__(self, call, refusal: type[Exception] = Declined):
        self._call = call
        self._refusal = refusal

    def __call__(self, *args):
        return self._call(*args)

    def __setstate__(self, state):
        raise self._refusal("BUILD on an admitted global")


class _Load:
    """What one load makes: storages, tensors, hook dicts. Nothing of it outlives the load but its result."""

    def __init__(self, archive: _Archive):
        self.archive = archive
        self.storages: dict = {}
        self.made: list = []       # storages, tensors and storage types, of the loading classes until finish()
        self.hook_dicts: list = []
        self.admitted: dict = {}   # (module, name) -> its Admitted, one per load
        self.torch = None

    def admit(self, module, name):
        """The object the reference gives for a global, or Declined. Exact names only: the default
        find_class imports any module and follows dotted attribute chains."""
        if module == "collections" and name == "OrderedDict":
            return self.once((module, name), self.hook_dict)
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            self.import_torch()
            return self.once((module, name), self.rebuild_tensor)
        if module == "torch" and name.endswith("Storage") and name not in ("TypedStorage", "UntypedStorage"):
            self.import_torch()
            try:
                storage_type = self.storage_type(name)  # what the reference gives for torch.<Dtype>Storage
            except KeyError:
                raise Declined from None
            storage_type.__class__ = self.loading_storage_type  # refuses BUILD, which could change its dtype
            self.made.append(storage_type)
            return storage_type
        raise Declined

    def once(self, key, call):
        admitted = self.admitted.get(key)
        if admitted is None:
            admitted = self.admitted[key] = Admitted(call)
        return admitted

    def import_torch(self):
        """torch (a heavy import) only for a dump that names it: a slime dump holds no tensor."""
        (self.torch, self.rebuild, self.storage_type, self.loading_tensor, self.loading_storage,
         self.loading_storage_type) = _torch()

    def hook_dict(self, *args):
        made = OrderedDict(*args)
        self.hook_dicts.append(made)
        return made

    def storage(self, pid):
        if type(pid) is not tuple or len(pid) != 5 or pid[0] not in ("storage", b"storage"):
            raise Declined
        if self.torch is None:  # its storage type would have imported it
            raise Declined
        _, storage_type, key, _location, numel = pid  # map_location="cpu": the location is not used
        if type(storage_type) is not self.loading_storage_type or type(key) is not str or type(numel) is not int:
            raise Declined
        if key in self.storages:
            return self.storages[key]
        dtype = storage_type.dtype
        record = self.archive.record(f"data/{key}")
        if numel < 0 or len(record) != numel * dtype.itemsize:
            raise Declined
        raw = (self.torch.UntypedStorage.from_buffer(record, dtype=self.torch.uint8) if len(record)
               else self.torch.UntypedStorage(0))
        storage = self.torch.storage.TypedStorage(wrap_storage=raw, dtype=dtype, _internal=True)
        storage.__class__ = self.loading_storage
        if len(record):  # torch's loader shares a storage between its tensors only when it has bytes
            self.storages[key] = storage
        self.made.append(storage)
        return storage

    def rebuild_tensor(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, *metadata):
        if (type(storage) is not self.loading_storage or requires_grad is not False or metadata
                or type(backward_hooks) is not OrderedDict or backward_hooks or vars(backward_hooks)):
            raise Declined
        nbytes = storage.nbytes()
        if not _within(nbytes // storage.dtype.itemsize, storage_offset, size, stride):
            raise Declined  # torch's storages cannot grow: set_() refuses a view beyond one, ours would grow it
        storage.__class__ = self.torch.storage.TypedStorage
        try:
            tensor = self.rebuild(storage, storage_offset, size, stride, requires_grad, backward_hooks)
        finally:
            storage.__class__ = self.loading_storage
        tensor.__class__ = self.loading_tensor
        self.made.append(tensor)
        if storage.nbytes() != nbytes:
            raise Declined
        return tensor

    def finish(self):
        """What was made while loading becomes what the reference gives, now that no opcode can reach it."""
        if any(hooks or vars(hooks) for hooks in self.hook_dicts):
            raise Declined  # an OrderedDict given items or state: left to the reference
        for made in self.made:
            made.__class__ = (self.torch.Tensor if type(made) is self.loading_tensor
                              else self.storage_type if type(made) is self.loading_storage_type
                              else self.torch.storage.TypedStorage)


def _within(elements: int, offset, size, stride) -> bool:
    """Whether a view (offset, size, stride) lies inside a storage of `elements`, with torch's rules for
    set_(): whole numbers, no negative size, stride or offset; a view of no element needs no storage."""
    if type(offset) is not int or type(size) not in (tuple, list) or type(stride) not in (tuple, list):
        return False
    if len(size) != len(stride) or offset < 0 or any(type(n) is not int or n < 0 for n in (*size, *stride)):
        return False
    if 0 in size:
        return True
    return offset + sum((n - 1) * step for n, step in zip(size, stride)) < elements


class _Unpickler(pickle.Unpickler):
    """The C unpickler over data.pkl, its globals and persistent ids restricted (see the module's text)."""

    def __init__(self, archive: _Archive):
        super().__init__(_BufferFile(archive.pickled), encoding="utf-8")  # the reference's encoding
        self.loading = _Load(archive)

    def find_class(self, module, name):
        return self.loading.admit(module, name)

    def persistent_load(self, pid):
        return self.loading.storage(pid)

    def finish(self):
        self.loading.finish()

    def forget(self):
        """Drop what the load made (the memo and the load's lists); the result keeps what it holds."""
        self.memo.clear()
        self.loading = None


class _BufferFile:
    """data.pkl as the file the C unpickler reads: with peek(), it takes the stream in large windows."""

    def __init__(self, view: memoryview):
        self.view = view
        self.position = 0

    def read(self, size=-1):
        start = self.position
        end = len(self.view) if size is None or size < 0 else min(len(self.view), start + size)
        self.position = end
        return self.view[start:end].tobytes()

    def readinto(self, target):
        start = self.position
        end = min(len(self.view), start + len(target))
        target[:end - start] = self.view[start:end]
        self.position = end
        return end - start

    def peek(self, size=0):
        return self.view[self.position:self.position + max(size, 1)].tobytes()

    def readline(self):
        start = end = self.position
        while end < len(self.view):
            found = self.view[end:end + 4096].tobytes().find(b"\n")
            if found >= 0:
                end += found + 1
                break
            end = min(len(self.view), end + 4096)
        self.position = end
        return self.view[start:end].tobytes()
