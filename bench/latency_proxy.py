"""A delaying, counting HTTP proxy in front of a storage emulator (loopback only).

Object stores answer each request in tens of milliseconds; the emulators on loopback answer in
well under one. Put this between maskray and fake-gcs-server (``STORAGE_EMULATOR_HOST`` = the
proxy's URL) to add a fixed delay to every request and to count requests and the most that were
in flight at once, by kind (``list``, ``get``, ``write``, ``record``, ``other``). ``record`` is
the run's own bookkeeping (lease heartbeat, manifest parts, config, summary), kept apart so that
``get`` and ``write`` count the data path alone.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "host"}


RECORD_MARKERS = (b"_manifest", b"_summary.json")


def request_kind(method: str, path: str, body: bytes | None = None) -> str:
    query = urlsplit(path).query
    # a multipart upload names its object in the body's JSON metadata, not in the URL
    named = path.encode() + (body or b"")[:4096]
    if any(marker in named for marker in RECORD_MARKERS):
        return "record"
    if method == "GET" and "/o/" not in path and "/o?" in path + "?" and "alt=media" not in query:
        return "list"
    if method == "GET" and "alt=media" in query:
        return "get"
    if method in ("POST", "PUT") and "/upload/" in path:
        return "write"
    return "other"


class LatencyProxy:
    def __init__(self, upstream: str, delay_s: float = 0.05) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname, target.port)
        self.delay_s = delay_s
        self.counts: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with self.lock:
            self.counts.clear()
            self.peak.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _track(self, kind: str, delta: int) -> None:
        with self.lock:
            self.in_flight[kind] += delta
            if delta > 0:
                self.counts[kind] += 1
                self.peak[kind] = max(self.peak[kind], self.in_flight[kind])

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                kind = request_kind(self.command, self.path, body)
                proxy._track(kind, +1)
                try:
                    time.sleep(proxy.delay_s)
                    conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    conn.close()
                finally:
                    proxy._track(kind, -1)
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS | {"content-length"}:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        return Handler
