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
  storages, empty hook dicts) are not callable.
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

Failures travel as types: UnsafePickle (the reference refused the pickle: `pickle.UnpicklingError`)
and UnreadableDump (anything else: not a zip, truncated, a bad record).
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import sys
import zipfile
import zlib
from collections import OrderedDict
from contextlib import ExitStack

PROTOCOL_2 = b"\x80\x02"  # torch.save's default pickle protocol, the only one taken on the fast path
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name and extra field lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


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
    return reference_load(path if data is None else io.BytesIO(data))


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
            directory = handle
        else:
            buffer, directory = data, io.BytesIO(data)
        if buffer[:4] != _LOCAL_SIGNATURE:  # torch's own test for its zip format; else the legacy format
            raise Declined
        archive = _Archive(memoryview(buffer), stack.enter_context(zipfile.ZipFile(directory)))
        stack.callback(archive.close)  # runs before the memory map closes
        loader = _Unpickler(archive)
        result = loader.load()
        loader.finish()
        return result


class _Archive:
    """The records of a torch zip, as views of the file's bytes."""

    def __init__(self, view: memoryview, archive: zipfile.ZipFile):
        self.view = view
        self.views = [view]  # every view of the file, released before the memory map closes
        try:
            infos = archive.infolist()
            names = [info.filename for info in infos]
            if not infos or len(set(names)) != len(names):
                raise Declined
            # torch's reader takes the folder of the first record as the archive's name
            self.prefix = names[0].split("/", 1)[0] + "/"
            self.infos = {name: info for name, info in zip(names, infos)}
            if (self.prefix + "constants.pkl") in self.infos:  # TorchScript: the reference refuses it
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

    def record(self, name: str) -> memoryview:
        info = self.infos.get(self.prefix + name)
        if info is None or info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise Declined
        start = info.header_offset
        signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(self.view, start)
        if signature != _LOCAL_SIGNATURE:
            raise Declined
        start += _LOCAL_HEADER.size + name_length + extra_length
        record = self.view[start:start + info.file_size]
        self.views.append(record)
        if len(record) != info.file_size or zlib.crc32(record) != info.CRC:
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

        _TORCH = (torch, _rebuild_tensor_v2, StorageType, _frozen(torch.Tensor), _frozen(torch.storage.TypedStorage))
    return _TORCH


class _Unpickler(pickle.Unpickler):
    """The C unpickler over data.pkl, its globals and persistent ids restricted (see the module's text)."""

    def __init__(self, archive: _Archive):
        super().__init__(_BufferFile(archive.pickled), encoding="utf-8")  # the reference's encoding
        self.archive = archive
        self.storages: dict = {}
        self.made: list = []       # storages and tensors, of the loading classes until finish()
        self.hook_dicts: list = []

    def find_class(self, module, name):
        # exact names only: the default find_class imports any module and follows dotted attribute chains
        if module == "collections" and name == "OrderedDict":
            return self.hook_dict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            self.import_torch()
            return self.rebuild_tensor
        if module == "torch" and name.endswith("Storage") and name not in ("TypedStorage", "UntypedStorage"):
            self.import_torch()
            try:
                return self.storage_type(name)  # what the reference gives for torch.<Dtype>Storage
            except KeyError:
                raise Declined from None
        raise Declined

    def import_torch(self):
        """torch (a heavy import) only for a dump that names it: a slime dump holds no tensor."""
        self.torch, self.rebuild, self.storage_type, self.loading_tensor, self.loading_storage = _torch()

    def hook_dict(self, *args):
        made = OrderedDict(*args)
        self.hook_dicts.append(made)
        return made

    def persistent_load(self, pid):
        if type(pid) is not tuple or len(pid) != 5 or pid[0] not in ("storage", b"storage"):
            raise Declined
        if not hasattr(self, "torch"):  # its storage type would have imported it
            raise Declined
        _, storage_type, key, _location, numel = pid  # map_location="cpu": the location is not used
        if type(storage_type) is not self.storage_type or type(key) is not str or type(numel) is not int:
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
        storage.__class__ = self.torch.storage.TypedStorage
        try:
            tensor = self.rebuild(storage, storage_offset, size, stride, requires_grad, backward_hooks)
        finally:
            storage.__class__ = self.loading_storage
        tensor.__class__ = self.loading_tensor
        self.made.append(tensor)
        return tensor

    def finish(self):
        """What was made while loading becomes what the reference gives, now that no opcode can reach it."""
        if any(hooks or vars(hooks) for hooks in self.hook_dicts):
            raise Declined  # an OrderedDict given items or state: left to the reference
        for made in self.made:
            made.__class__ = (self.torch.Tensor if type(made) is self.loading_tensor
                              else self.torch.storage.TypedStorage)


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
