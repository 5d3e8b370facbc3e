"""A run's stop flag, shared by the driver and every worker through Ray's GCS key-value store.

On SIGTERM/SIGINT the driver raises the flag; prepare tasks see it before their next fetch and
yield nothing more, so the batches already in flight finish, their rows reach the manifest sink
and the dataset ends: every mask written has its row. Ray has no public cross-process event, and
a named actor would cost a process at every start-up; the GCS store is what Ray's own libraries
use for this kind of flag (``ray.experimental.internal_kv``).
"""

from __future__ import annotations

import logging
import signal
import time

from maskray.operators.errors import one_line

NAMESPACE = "maskray"
CHECK_EVERY_S = 1.0  # one GCS read per second per worker process at most

EXIT_SIGNAL: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}

_seen: dict[str, tuple[float, bool]] = {}


class Stopped(Exception):
    """The run drained after SIGINT/SIGTERM: its parts hold a row for every mask written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_SIGNAL.get(signum, 1)


def key_for(output: str, attempt: str) -> str:
    """Per run attempt, so a flag left on a long-lived cluster never stops a later run."""
    return f"stop/{output}/{attempt}"


def raise_flag(key: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, b"1", namespace=NAMESPACE)


def clear_flag(key: str) -> None:
    from ray.experimental import internal_kv

    try:
        if internal_kv._internal_kv_initialized():
            internal_kv._internal_kv_del(key, namespace=NAMESPACE)
    except Exception as exc:  # noqa: BLE001 - a leftover flag names this attempt only
        logging.getLogger("maskray").debug("could not clear the stop flag: %s", one_line(exc))


def stopping(key: str) -> bool:
    """True once the driver raised ``key`` (cached for ``CHECK_EVERY_S``). Outside Ray (the
    stages called directly, as the tests do), or with no key, never."""
    if not key:
        return False
    now = time.monotonic()
    checked_at, raised = _seen.get(key, (0.0, False))
    if raised or now - checked_at < CHECK_EVERY_S:
        return raised
    from ray.experimental import internal_kv

    raised = internal_kv._internal_kv_initialized() and internal_kv._internal_kv_exists(key, namespace=NAMESPACE)
    _seen[key] = (now, bool(raised))
    return bool(raised)
