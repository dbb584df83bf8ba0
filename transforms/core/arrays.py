"""The few array operations the core uses, on numpy (CPU) or torch (GPU): one core, two backends.

The core is written once against `Arrays`; `arrays_for(x)` picks the
backend from the type of its input. On CPU the core runs on numpy: the same
ops as torch's, up to 3x faster for the segment reductions, and a CPU
worker then never imports torch (3 s and ~180 MB per process). On a GPU it
runs on torch tensors of that device. The array API standard (and so
array-api-compat) has no scatter/segment reductions, which are most of the
core, hence this small shim instead.

Devices: "cpu" is numpy; any other string is a torch device ("cuda",
"cuda:1"), and "torch-cpu" is torch on the CPU (tests and benchmarks use it
to run the GPU code path on a machine without a GPU).
"""
from __future__ import annotations

import contextlib

import numpy as np

TORCH_CPU = "torch-cpu"
INT64_MAX = int(np.iinfo(np.int64).max)


class NumpyArrays:
    """numpy arrays: 1-D, int64 / float64 / float32 / bool."""

    def non_finite_allowed(self):
        """inf/nan in rows that end up dead are expected (the core flags them): no warnings."""
        return np.errstate(all="ignore")

    def arange(self, n):
        return np.arange(n, dtype=np.int64)

    def zeros(self, n, dtype):
        return np.zeros(n, dtype=dtype)

    def full(self, n, value, dtype):
        return np.full(n, value, dtype=dtype)

    def asarray(self, values, dtype):
        return np.asarray(values, dtype=dtype)

    def astype(self, x, dtype):
        return x.astype(dtype, copy=False)

    def take(self, values, index):
        return values.take(index)

    def take_columns(self, values, index):
        """values[:, index] of a 2-D array."""
        return values.take(index, axis=1)

    def segment(self, ids, n, values, reduce):
        """Reduce values over segment ids in [0, n); a segment no id reaches holds the identity."""
        if reduce == "sum":
            if values.dtype == np.float64:  # bincount adds in row order, like torch's index_add_ on CPU
                return np.bincount(ids, weights=values, minlength=n)
            out = np.zeros(n, dtype=values.dtype)
            np.add.at(out, ids, values)
            return out
        if reduce == "amin":
            out = np.full(n, _largest(values.dtype), dtype=values.dtype)
            np.minimum.at(out, ids, values)
        else:
            out = np.full(n, _smallest(values.dtype), dtype=values.dtype)
            np.maximum.at(out, ids, values)
        return out

    def segment_sorted(self, ids, n, values, reduce):
        """segment() for non-decreasing ids ("amin"/"amax"): each segment is one run, reduced in place."""
        starts = np.searchsorted(ids, np.arange(n + 1, dtype=ids.dtype))
        nonempty = starts[:-1] < starts[1:]
        ufunc = np.minimum if reduce == "amin" else np.maximum
        out = np.full(n, _largest(values.dtype) if reduce == "amin" else _smallest(values.dtype), dtype=values.dtype)
        if ids.shape[0]:
            out[nonempty] = ufunc.reduceat(values, starts[:-1][nonempty])
        return out

    def count(self, ids, n, weights=None):
        if weights is None:
            return np.bincount(ids, minlength=n)
        return np.bincount(ids, weights=weights.astype(np.float64), minlength=n).astype(np.int64)

    def segments(self, counts):
        """The rows of a flat token array whose row i holds the next counts[i] tokens (rows in order)."""
        return NumpySegments(np.asarray(counts, dtype=np.int64))

    def count_nonzero(self, flags) -> int:
        return int(np.count_nonzero(flags))

    def dot(self, a, b) -> float:
        # einsum's own loop, not BLAS: a BLAS dot may hand a long vector to its worker threads, which on a
        # busy machine costs more than the dot itself
        return float(np.einsum("i,i->", a, b))

    def minimum_(self, x, value):
        """x capped at value, in place."""
        return np.minimum(x, value, out=x)

    def cumsum(self, x):
        return np.cumsum(x)

    def where(self, condition, a, b):
        return np.where(condition, a, b)

    def isfinite(self, x):
        return np.isfinite(x)

    def exp(self, x):
        return np.exp(x)

    def abs(self, x):
        return np.abs(x)

    def sqrt(self, x):
        return np.sqrt(x)

    def clip(self, x, low=None, high=None):
        return np.clip(x, low, high)

    def concat(self, arrays):
        return np.concatenate(arrays)

    def searchsorted_right(self, boundaries, values):
        return np.searchsorted(boundaries, values, side="right")

    def unique_inverse(self, x):
        values, inverse = np.unique(x, return_inverse=True)
        return values, inverse.reshape(-1)

    def order_by(self, primary, secondary):
        """Positions sorted by (primary, secondary), stable."""
        return np.lexsort((secondary, primary))


class TorchArrays:
    """torch tensors on one device; the same operations as NumpyArrays."""

    def __init__(self, device):
        import torch
        self._torch = torch
        self.device = device
        self._dtypes = {"int64": torch.int64, "float64": torch.float64, "float32": torch.float32, "bool": torch.bool}

    def _dtype(self, dtype):
        return self._dtypes[np.dtype(dtype).name]

    def non_finite_allowed(self):
        return contextlib.nullcontext()

    def arange(self, n):
        return self._torch.arange(n, device=self.device)

    def zeros(self, n, dtype):
        return self._torch.zeros(n, dtype=self._dtype(dtype), device=self.device)

    def full(self, n, value, dtype):
        return self._torch.full((n,), value, dtype=self._dtype(dtype), device=self.device)

    def asarray(self, values, dtype):
        return self._torch.as_tensor(values, dtype=self._dtype(dtype), device=self.device)

    def astype(self, x, dtype):
        return x.to(self._dtype(dtype))

    def take(self, values, index):
        return values.index_select(0, index)  # several times faster than values[index]

    def take_columns(self, values, index):
        return values.index_select(1, index)

    def segment(self, ids, n, values, reduce):
        if reduce == "sum":
            return self._torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, ids, values)
        dtype = np.dtype(str(values.dtype).removeprefix("torch."))
        identity = _largest(dtype) if reduce == "amin" else _smallest(dtype)
        out = self._torch.full((n,), identity, dtype=values.dtype, device=values.device)
        return out.scatter_reduce_(0, ids, values, reduce=reduce, include_self=True)

    def segment_sorted(self, ids, n, values, reduce):
        return self.segment(ids, n, values, reduce)

    def count(self, ids, n, weights=None):
        if weights is None:
            return self._torch.bincount(ids, minlength=n)
        return self._torch.bincount(ids, weights=weights.to(self._torch.float64), minlength=n).long()

    def segments(self, counts):
        return TorchSegments(self._torch, counts.long())

    def count_nonzero(self, flags) -> int:
        return int(self._torch.count_nonzero(flags))

    def dot(self, a, b) -> float:
        return float(self._torch.dot(a, b))

    def minimum_(self, x, value):
        return x.clamp_(max=value)

    def cumsum(self, x):
        return self._torch.cumsum(x, 0)

    def where(self, condition, a, b):
        return self._torch.where(condition, a, b)

    def isfinite(self, x):
        return self._torch.isfinite(x)

    def exp(self, x):
        return self._torch.exp(x)

    def abs(self, x):
        return self._torch.abs(x)

    def sqrt(self, x):
        return self._torch.sqrt(x)

    def clip(self, x, low=None, high=None):
        return x.clamp(min=low, max=high)

    def concat(self, arrays):
        return self._torch.cat(arrays)

    def searchsorted_right(self, boundaries, values):
        return self._torch.searchsorted(boundaries, values, right=True)

    def unique_inverse(self, x):
        return self._torch.unique(x, return_inverse=True)

    def order_by(self, primary, secondary):
        by_secondary = self._torch.argsort(secondary, stable=True)
        return by_secondary.index_select(0, self._torch.argsort(primary.index_select(0, by_secondary), stable=True))


class NumpySegments:
    """Per-row reductions of a flat token array laid out row after row (row i: the next counts[i] tokens):
    each row is one contiguous run, so a reduction is one `reduceat` over the rows' starts, with no row id
    per token (bincount and ufunc.at over row ids are many times slower). Rows without a token hold the
    identity (0 for sums, False for any, the dtype's smallest value for max)."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts
        self.n = int(counts.shape[0])
        self.total = int(counts.sum())
        nonempty = counts > 0
        self._every_row = bool(nonempty.all())
        self._nonempty = nonempty
        self._starts = (np.cumsum(counts) - counts)[nonempty]

    def _reduce(self, ufunc, values, identity, dtype=None):
        out_dtype = dtype or values.dtype
        if self.total == 0:
            return np.full(self.n, identity, dtype=out_dtype)
        reduced = ufunc.reduceat(values, self._starts, dtype=dtype)
        if self._every_row:
            return reduced
        out = np.full(self.n, identity, dtype=out_dtype)
        out[self._nonempty] = reduced
        return out

    def sum(self, values, dtype="float64"):
        return self._reduce(np.add, values, 0, np.dtype(dtype))

    def max(self, values):
        return self._reduce(np.maximum, values, _smallest(values.dtype))

    def any(self, flags):
        return self._reduce(np.logical_or, flags, False)

    def spread(self, per_row):
        """Each row's value at each of its tokens."""
        return np.repeat(per_row, self.counts)

    def blocks(self, size: int):
        """The rows in consecutive runs of about `size` tokens (whole rows; a longer row alone), as
        (the run's tokens: a slice, its rows: a slice, NumpySegments of its rows); runs without a token are
        left out. Working a run at a time keeps each temporary small: in cache, and in memory the
        allocator hands out again instead of fresh pages."""
        ends = np.cumsum(self.counts)
        cuts = np.unique(np.minimum(np.searchsorted(ends, np.arange(size, self.total, size)) + 1, self.n))
        bounds = [0, *cuts.tolist(), self.n]
        for first, last in zip(bounds[:-1], bounds[1:]):
            start = int(ends[first - 1]) if first else 0
            stop = int(ends[last - 1]) if last else 0
            if stop > start:
                yield slice(start, stop), slice(first, last), NumpySegments(self.counts[first:last])


class TorchSegments:
    """NumpySegments on torch: a row id per token, index_add_ / scatter_reduce_ over it."""

    def __init__(self, torch, counts):
        self._torch = torch
        self.counts = counts
        self.n = int(counts.shape[0])
        self.total = int(counts.sum())
        self.row = torch.repeat_interleave(torch.arange(self.n, device=counts.device), counts)

    def sum(self, values, dtype="float64"):
        kind = {"float64": self._torch.float64, "int64": self._torch.int64}[dtype]
        return self._torch.zeros(self.n, dtype=kind, device=values.device).index_add_(0, self.row, values.to(kind))

    def max(self, values):
        identity = _smallest(np.dtype(str(values.dtype).removeprefix("torch.")))
        out = self._torch.full((self.n,), identity, dtype=values.dtype, device=values.device)
        return out.scatter_reduce_(0, self.row, values, reduce="amax", include_self=True)

    def any(self, flags):
        return self.sum(flags, "int64") > 0

    def spread(self, per_row):
        return per_row.index_select(0, self.row)

    def blocks(self, size: int):
        """One run of every row: a device works best on the whole batch at once."""
        if self.total:
            yield slice(0, self.total), slice(0, self.n), self


def arrays_for(x):
    """The backend that owns array x."""
    if isinstance(x, np.ndarray):
        return NumpyArrays()
    return TorchArrays(x.device)


def to_device(x, device):
    """Array x on `device` ("cpu": numpy; else a torch device, "torch-cpu" meaning torch's CPU)."""
    if device == "cpu":
        return x if isinstance(x, np.ndarray) else x.cpu().numpy()
    import torch
    tensor = torch.from_numpy(_writeable(x)) if isinstance(x, np.ndarray) else x
    return tensor.to("cpu" if device == TORCH_CPU else device)


def _writeable(x):
    return x if x.flags.writeable else x.copy()


def _largest(dtype):
    if dtype == np.bool_:
        return True
    return np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _smallest(dtype):
    if dtype == np.bool_:
        return False
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min
