"""The verifier's calls: many in flight, each retried with backoff, every one ending as an Answer.

Async functions and --rm-url run on one event loop with up to
--reward-concurrency calls in flight; a sync function runs in worker
processes (--reward-workers, default one per core), since a CPU-bound
verifier holds the GIL. A call that keeps failing is an Answer with its
error, never an exception: the caller turns it into a dead letter.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import math
import multiprocessing
import random
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import SimpleNamespace

from rollout_relabel.transforms.lib.rescoring.verifier import Rescoring, is_async, load

BACKOFF_CAP = 30.0     # seconds: the longest wait between two attempts
RETRY_AFTER_CAP = 300.0  # seconds: a server asking for longer is not waited for beyond this
RETRYABLE_STATUS = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Answer:
    """One call's end: what it returned (ok) or why it failed, and the attempts made."""
    value: object = None
    error_type: str | None = None
    error: str | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error_type is None


class RetryLater(Exception):
    """A server said 'not now' (429, 5xx): retried, after Retry-After when it gave one."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class Refused(Exception):
    """A reply no retry will change (a 4xx other than 429, a reply that is not JSON)."""


class Sample:
    """A stored row seen as slime's Sample: every field an attribute, and get_reward_value(args)."""

    def __init__(self, row: dict):
        self.__dict__.update(row)

    def get_reward_value(self, args):
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]

    def __repr__(self):
        return f"Sample(index={self.__dict__.get('index')!r}, group_index={self.__dict__.get('group_index')!r})"


def slime_args(rescoring: Rescoring, options: dict) -> SimpleNamespace:
    """slime's `args` by slime's names: the run's options, rm_url, --reward-fn-arg values. custom_rm_path
    is always None: a sample's own reward path is never followed (slime's async_rm reads this)."""
    values = {"rm_url": rescoring.rm_url, "rm_type": None, "custom_rm_path": None, "reward_key": None,
              "n_samples_per_prompt": None, "rollout_batch_size": None}
    values.update(options)
    values.update(rescoring.args())
    return SimpleNamespace(**values)


def invoke(fn, style: str, payload, args):
    """Call fn by its convention; returns what it returns (a coroutine for an async fn)."""
    if style == "slime":
        return fn(args, Sample(payload))
    if style == "slime-batched":
        return fn(args, [Sample(row) for row in payload])
    if style == "verl":
        return fn(payload["data_source"], payload["solution_str"], payload["ground_truth"], payload["extra_info"])
    return fn(payload)


def _in_worker(spec: str, style: str, payload, args):
    """A sync verifier's call inside a worker process (the function is loaded there once)."""
    fn, _ = load(spec)
    return invoke(fn, style, payload, args)


class Caller:
    """Makes a run's calls. One per worker (DoFn setup); close() ends its worker processes."""

    def __init__(self, rescoring: Rescoring, options: dict):
        self._rescoring = rescoring
        self._args = slime_args(rescoring, options)
        self._fn = None if rescoring.rm_url else load(rescoring.fn)[0]
        self._pool = None

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def call_all(self, payloads: list, on_answer=None) -> list[Answer]:
        """One Answer per payload, in order; on_answer(i, answer) as each one ends (to store it early)."""
        if not payloads:
            return []
        return asyncio.run(self._call_all(payloads, on_answer))

    async def _call_all(self, payloads, on_answer):
        rescoring = self._rescoring
        session = None
        if rescoring.rm_url is not None:
            import aiohttp
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=rescoring.concurrency))
            attempt = lambda payload: self._post(session, payload)  # noqa: E731
        elif is_async(self._fn):
            attempt = lambda payload: invoke(self._fn, rescoring.style, payload, self._args)  # noqa: E731
        else:
            if self._pool is None:
                # a daemonic worker process (some runners' workers) may not start processes: threads there
                self._pool = concurrent.futures.ThreadPoolExecutor(rescoring.workers) \
                    if multiprocessing.current_process().daemon else concurrent.futures.ProcessPoolExecutor(
                        rescoring.workers, mp_context=multiprocessing.get_context("spawn"))
            loop = asyncio.get_running_loop()
            attempt = lambda payload: loop.run_in_executor(  # noqa: E731
                self._pool, _in_worker, rescoring.fn, rescoring.style, payload, self._args)

        answers: list = [None] * len(payloads)
        queue = iter(enumerate(payloads))  # shared by the callers: one task per call in flight, not per row

        async def caller():
            for i, payload in queue:
                answers[i] = await with_retries(attempt, payload, rescoring)
                if on_answer is not None:
                    on_answer(i, answers[i])

        try:
            await asyncio.gather(*(caller() for _ in range(min(rescoring.concurrency, len(payloads)))))
            return answers
        finally:
            if session is not None:
                await session.close()

    async def _post(self, session, payload):
        """slime's remote protocol: POST {prompt, response, label} as JSON; the JSON reply is the reward."""
        import aiohttp
        async with session.post(self._rescoring.rm_url, json=payload) as reply:
            if reply.status in RETRYABLE_STATUS:
                raise RetryLater(f"HTTP {reply.status} from {self._rescoring.rm_url}",
                                 retry_after(reply.headers.get("Retry-After")))
            if reply.status >= 400:
                raise Refused(f"HTTP {reply.status} from {self._rescoring.rm_url}: {(await reply.text())[:200]}")
            try:
                return await reply.json(content_type=None)
            except (ValueError, aiohttp.ContentTypeError) as error:
                raise Refused(f"the reply is not JSON: {error}") from None


async def with_retries(attempt, payload, rescoring: Rescoring) -> Answer:
    """attempt(payload) until it returns, at most 1 + retries times; each attempt under the timeout."""
    error = None
    for n in range(1, rescoring.retries + 2):
        try:
            async with asyncio.timeout(rescoring.timeout):  # no task per attempt, unlike wait_for
                value = await attempt(payload)
            return Answer(value, attempts=n)
        except Refused as refused:
            return Answer(error_type="Refused", error=str(refused), attempts=n)
        except asyncio.TimeoutError:
            error = TimeoutError(f"no answer within {rescoring.timeout:g} s (--reward-timeout)")
            wait = backoff(n, rescoring.backoff)
        except BrokenProcessPool:
            raise  # a worker process died: the run's machinery failed, not this row
        except Exception as failed:  # noqa: BLE001 - the user's verifier may raise anything: it is this row's error
            error = failed
            later = failed.retry_after if isinstance(failed, RetryLater) else None
            wait = later if later is not None else backoff(n, rescoring.backoff)
        if n <= rescoring.retries:
            await asyncio.sleep(wait)
    return Answer(error_type=type(error).__name__, error=str(error), attempts=rescoring.retries + 1)


def backoff(attempt: int, base: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, base * 2^(attempt-1)], capped."""
    return random.uniform(0, min(BACKOFF_CAP, base * 2 ** (attempt - 1)))


def retry_after(header: str | None) -> float | None:
    """Retry-After as seconds to wait: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not header:
        return None
    header = header.strip()
    try:
        seconds = float(header)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(header)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)
