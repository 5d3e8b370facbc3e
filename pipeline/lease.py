"""One writer per output: a lease at ``<output>/_manifest/_lease.json``.

Taken before Ray starts with a conditional create (GCS ``ifGenerationMatch=0``, S3
``If-None-Match: *``, a hard link locally), renewed by a heartbeat every few seconds, and released
however the run ends. A second run on a live lease exits 2 naming the live run; a lease whose
heartbeat stopped for ``STALE_AFTER_S`` (a killed driver) is taken over, at once when the holder
ran on this machine and its process is gone, so kill -9 and the same command again still works;
``--force`` takes over a live one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from maskray.operators import storage
from maskray.operators.errors import one_line
from maskray.operators.keys import MANIFEST_DIR
from maskray.pipeline.config import ConfigError

log = logging.getLogger("maskray")

HEARTBEAT_S = 5.0
STALE_AFTER_S = 30.0  # six missed heartbeats
# How long a release waits for a beat in flight (one small write); a stuck one is left behind, and
# the lease it may rewrite goes stale.
RELEASE_WAIT_S = 10.0


def lease_uri(output: str) -> str:
    return storage.join_uri(output, MANIFEST_DIR, "_lease.json")


@dataclass
class Lease:
    output: str
    run_id: str
    options: dict[str, Any]
    heartbeat_s: float = HEARTBEAT_S
    body: dict[str, Any] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return lease_uri(self.output)

    def encoded(self) -> bytes:
        self.body["heartbeat_at"] = time.time()
        return json.dumps(self.body).encode()

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="maskray-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if self.holder() != self.run_id:  # taken over (--force): stop renewing it
                    log.warning("lease on %s was taken over by another run", self.output)
                    return
                storage.write_bytes_atomic(self.uri, self.encoded(), self.options)
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried; the run goes on
                log.debug("lease heartbeat failed: %s", one_line(exc))

    def holder(self) -> str | None:
        current = read_lease(self.output, self.options)
        return current.get("run_id") if current else None

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours (idempotent, never raises)."""
        self._stop.set()
        # A beat already past its check would write the lease again after the removal below, and
        # the next run on this output would find a live lease.
        if self._thread is not None:
            self._thread.join(timeout=RELEASE_WAIT_S)
        try:
            if self.holder() == self.run_id:
                storage.filesystem(self.uri, self.options).rm(storage.strip_protocol(self.uri))
        except Exception as exc:  # noqa: BLE001 - a leftover lease goes stale and is taken over
            log.warning(
                "could not release the lease on %s (%s); it expires in %d s", self.output, one_line(exc), STALE_AFTER_S
            )


def read_lease(output: str, options: dict[str, Any]) -> dict[str, Any] | None:
    uri = lease_uri(output)
    storage.forget_listings(uri, options)
    try:
        return json.loads(storage.read_bytes(uri, options))
    except FileNotFoundError:
        return None
    except ValueError:  # unreadable: treat as stale
        return {}


def holder_is_dead_here(current: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone (a kill -9 here need not wait out the
    heartbeat; a holder on another machine must)."""
    if current.get("host") != socket.gethostname() or not isinstance(current.get("pid"), int):
        return False
    try:
        os.kill(current["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def acquire(
    output: str,
    run_id: str,
    options: dict[str, Any],
    force: bool = False,
    heartbeat_s: float = HEARTBEAT_S,
    stale_after_s: float = STALE_AFTER_S,
) -> Lease:
    """Take the output's lease or raise ConfigError naming the live run that holds it."""
    lease = Lease(
        output,
        run_id,
        options,
        heartbeat_s,
        body={"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()},
    )
    for _ in range(3):  # a lost race against another taker is retried against the winner's lease
        try:
            storage.create_bytes_exclusive(lease.uri, lease.encoded(), options)
            lease.start_heartbeat()
            return lease
        except FileExistsError:
            pass
        current = read_lease(output, options)
        if current is None:
            continue  # released in between
        age = time.time() - float(current.get("heartbeat_at") or 0)
        if holder_is_dead_here(current):
            age = max(age, stale_after_s)  # its driver ran on this machine and is gone
        if age < stale_after_s and not force:
            raise ConfigError(
                f"output {output} is in use by run {current.get('run_id')} on {current.get('host')} "
                f"(pid {current.get('pid')}, heartbeat {age:.0f} s ago): wait for it to finish, or pass "
                "--force if it is not running"
            )
        why = (
            "--force"
            if age < stale_after_s
            else "its process is gone"
            if holder_is_dead_here(current)
            else f"its heartbeat stopped {age:.0f} s ago"
        )
        log.warning("taking over the lease of run %s on %s (%s)", current.get("run_id"), output, why)
        try:
            storage.filesystem(lease.uri, options).rm(storage.strip_protocol(lease.uri))
        except FileNotFoundError:
            pass
    raise ConfigError(f"output {output}: could not take its lease (another run keeps taking it)")
