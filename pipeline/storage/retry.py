"""One retry helper for storage requests, and per-prefix AIMD concurrency limits.

Transient errors (S3 503 SlowDown, 500, throttling, 409 ConditionalRequestConflict,
connection resets, timeouts, and pyarrow's ``AWS Error SLOW_DOWN`` / ``INTERNAL_FAILURE``
texts that its own retry strategy does not always cover) are retried with exponential
backoff and full jitter (Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog,
2015). Permanent errors (403, 404, NoSuchBucket, bad credentials) are raised at once as
``StorageError`` naming the URI.

A request is retried until it has failed ``max_attempts`` times *and* its failures have
lasted ``outage_s`` seconds (``storage.outage_s``, default 300): a store that throttles or is
unreachable for minutes (a 30 s SlowDown storm, an endpoint restarting) is ridden out, each
wait at most ``max_delay_s``. Then ``StorageError`` (``gave_up=True``) names the URI, the
attempts and the seconds; ``mmpipe run`` exits with its runtime-failure code for it.

When the store says SlowDown, the request concurrency allowed for that prefix is halved;
each success adds ``1/limit`` (additive increase, multiplicative decrease, as TCP
congestion control). Throttled requests are counted per process (``throttled_requests``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from pipeline.errors import MmpipeError

log = logging.getLogger(__name__)
T = TypeVar("T")

_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                   "TooManyRequests", "503"}
_TRANSIENT_CODES = _THROTTLE_CODES | {"InternalError", "ServiceUnavailable", "RequestTimeout",
                                      "RequestTimeTooSkewed", "ConditionalRequestConflict",
                                      "500", "502", "504", "409", "OperationAborted"}
_THROTTLE_TEXT = ("SLOW_DOWN", "SlowDown", "THROTTLING", "Please reduce your request rate",
                  "HTTP status 503", "HTTP response code 503")
_TRANSIENT_TEXT = _THROTTLE_TEXT + (
    "INTERNAL_FAILURE", "SERVICE_UNAVAILABLE", "NETWORK_CONNECTION", "REQUEST_TIMEOUT",
    "Connection reset", "connection reset", "Broken pipe", "timed out", "Timeout",
    "curlCode: 7", "curlCode: 28", "curlCode: 52", "curlCode: 55", "curlCode: 56",
    "Connection was closed", "Connection refused", "Empty reply", "HTTP status 500",
    "HTTP status 502", "HTTP status 504", "HTTP response code 500", "Unable to connect",
    "Unable to parse ExceptionName")


class StorageError(MmpipeError, OSError):
    """A storage request failed permanently (``gave_up`` False: 403, NoSuchBucket, bad
    credentials), or kept failing with transient errors past ``RetryPolicy.outage_s``
    (``gave_up`` True: the store was out, nothing is wrong with the job)."""

    gave_up: bool = False


def classify(exc: BaseException) -> str:
    """Return ``"throttle"``, ``"transient"`` or ``"permanent"`` for a storage exception."""
    code = _client_error_code(exc)
    if code is not None:
        if code in _THROTTLE_CODES:
            return "throttle"
        return "transient" if code in _TRANSIENT_CODES else "permanent"
    name = type(exc).__name__
    if name in ("EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                "ConnectTimeoutError", "ConnectionError", "ProtocolError",
                "IncompleteReadError", "ResponseStreamingError"):
        return "transient"
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return "permanent"
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return "transient"
    text = str(exc)
    if any(t in text for t in _THROTTLE_TEXT):
        return "throttle"
    if isinstance(exc, OSError) and any(t in text for t in _TRANSIENT_TEXT):
        return "transient"
    return "permanent"


def _client_error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = str(response.get("Error", {}).get("Code", "")) or None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in (None, "", "Unknown") and status:
        code = str(status)
    return code


class AimdLimiter:
    """A concurrency limit that halves on throttling and grows by 1/limit per success."""

    def __init__(self, max_concurrency: int):
        self.max = max_concurrency
        self.limit = float(max_concurrency)
        self.active = 0
        self.cond = threading.Condition()

    def __enter__(self) -> "AimdLimiter":
        with self.cond:
            while self.active >= int(self.limit):
                self.cond.wait()
            self.active += 1
        return self

    def __exit__(self, *exc) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify()

    def on_success(self) -> None:
        with self.cond:
            self.limit = min(self.max, self.limit + 1.0 / self.limit)
            self.cond.notify()

    def on_throttle(self) -> None:
        with self.cond:
            self.limit = max(1.0, self.limit / 2)


class RetryPolicy:
    """Retry settings and the per-process throttling state (one per process)."""

    def __init__(self, max_attempts: int = 8, base_delay_s: float = 0.05,
                 max_delay_s: float = 5.0, max_concurrency_per_prefix: int = 64,
                 outage_s: float = 300.0):
        self.max_attempts = max_attempts
        self.outage_s = outage_s     # seconds of failures a request rides out (module doc)
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.max_concurrency = max_concurrency_per_prefix
        self.limiters: dict[str, AimdLimiter] = {}
        self.lock = threading.Lock()
        self.throttled_requests = 0  # this process's totals (tests, logs)
        self.retried_requests = 0
        self.observers: list = []  # e.g. an attempt's AttemptStats, while it runs

    @contextlib.contextmanager
    def observe(self, observer) -> Iterator[None]:
        """Report every retry to ``observer.storage_retry(throttled: bool)`` while the
        block runs (a worker runs one partition attempt at a time, so its attempt's
        statistics see exactly its own retries)."""
        with self.lock:
            self.observers.append(observer)
        try:
            yield
        finally:
            with self.lock:
                self.observers.remove(observer)

    def limiter(self, prefix: str) -> AimdLimiter:
        with self.lock:
            if prefix not in self.limiters:
                self.limiters[prefix] = AimdLimiter(self.max_concurrency)
            return self.limiters[prefix]

    def call(self, fn: Callable[[], T], uri: str, what: str, prefix: str | None = None) -> T:
        """Run ``fn()`` with retries: transient errors until ``max_attempts`` attempts have
        failed and the first failure is ``outage_s`` seconds old. Raises ``StorageError``
        naming ``uri`` (``gave_up`` True then), at once for a permanent error
        (``FileNotFoundError`` as itself)."""
        limiter = self.limiter(prefix) if prefix else None
        first_failure: float | None = None
        attempt = 0
        while True:
            attempt += 1
            try:
                if limiter is None:
                    result = fn()
                else:
                    with limiter:
                        result = fn()
                    limiter.on_success()
                return result
            except Exception as e:  # noqa: BLE001 - classified below; permanent ones re-raised
                kind = classify(e)
                if kind == "permanent":
                    if isinstance(e, FileNotFoundError):
                        raise
                    raise StorageError(f"{what} {uri}: {type(e).__name__}: {e}") from e
                with self.lock:
                    self.retried_requests += 1
                    if kind == "throttle":
                        self.throttled_requests += 1
                    observers = list(self.observers)
                for observer in observers:
                    observer.storage_retry(kind == "throttle")
                if kind == "throttle" and limiter is not None:
                    limiter.on_throttle()
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                failing_s = now - first_failure
                if attempt >= self.max_attempts and failing_s >= self.outage_s:
                    error = StorageError(
                        f"{what} {uri}: gave up after {attempt} attempts over {failing_s:.0f} s "
                        f"(storage.outage_s={self.outage_s:g}): {type(e).__name__}: {e}")
                    error.gave_up = True
                    raise error from e
                delay = random.uniform(0, min(self.max_delay_s,
                                              self.base_delay_s * 2 ** min(attempt, 20)))
                if attempt >= self.max_attempts:  # past the count: wait out the horizon only
                    delay = min(delay, max(0.0, self.outage_s - failing_s) + 0.01)
                log.debug("%s %s: %s (%s); retry %d in %.2fs", what, uri, kind, e, attempt, delay)
                time.sleep(delay)


POLICY = RetryPolicy()


def configure(max_attempts: int, max_concurrency_per_prefix: int,
              outage_s: float = 300.0) -> None:
    """Replace this process's retry policy (counters start again from 0); ``outage_s``:
    seconds of transient failures one request rides out (``RetryPolicy.call``)."""
    global POLICY
    POLICY = RetryPolicy(max_attempts=max_attempts,
                         max_concurrency_per_prefix=max_concurrency_per_prefix,
                         outage_s=outage_s)
