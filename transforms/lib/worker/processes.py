"""A pool of worker processes for work that holds the GIL (unpickling a `.pt` dump, turning its
Python lists into Arrow): the local runner's worker threads would otherwise run it one at a time.

One pool per process, made on first use (or by warm(), so that it starts while Beam builds the
pipeline) and reused by every worker thread. Its processes come from a fork server: never forked
from the threaded worker itself, and each starts with the reading modules already imported.
What runs there must take and return plain picklable values (a table, a dataclass), never raise a
type that cannot travel (BadFile is returned as data: pt_dumps.DumpOutcome).
"""
from __future__ import annotations

import atexit
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor

# imported once in the fork server, so that each worker process starts with them
PRELOAD = ["rollout_relabel.transforms.lib.io.pt_dumps"]

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_size = 0


def pool(size: int) -> ProcessPoolExecutor:
    """The process's pool of `size` workers (a pool of another size is replaced)."""
    global _pool, _size
    with _lock:
        if _pool is None or _size != size:
            if _pool is not None:
                _pool.shutdown(wait=True)
                atexit.unregister(shutdown)
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _pool, _size = ProcessPoolExecutor(max_workers=size, mp_context=context), size
            # concurrent.futures stops its pools at interpreter teardown, which a CLI ending with os._exit
            # skips; multiprocessing's own exit handler would then wait for workers that never end. This
            # handler is registered after that one, so it runs first.
            atexit.register(shutdown)
        return _pool


def run(size: int, function, *args):
    """function(*args) on one of the pool's processes; the calling thread waits without the GIL."""
    return pool(size).submit(function, *args).result()


def warm(size: int) -> None:
    """Start the pool's processes now, without waiting for them."""
    executor = pool(size)
    for _ in range(size):
        executor.submit(int)


def shutdown() -> None:
    """Stop the pool's processes (they exit once idle)."""
    global _pool, _size
    with _lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
            atexit.unregister(shutdown)
        _pool, _size = None, 0
