"""The inference actor: one fp32 ONNX Runtime session, used by a fixed-size Ray Data pool.

Input columns: ``status``, ``pre`` (320x320x3 uint8 bytes). Adds ``small`` (320x320 uint8 mask
bytes), ``infer_ms``, ``node`` and ``actor``. The Ray adapter around ``operators.session``: the
model arrives as an object-store reference and the node id labels the manifest rows.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np

from operators.preprocess import MODEL_SIZE, normalise
from operators.session import SessionOptions, make_session, run_model, to_small_mask
from pipeline.rows import one_line


class InferenceActor:
    def __init__(self, model: Any, session_options: dict[str, Any] | None = None) -> None:
        import cv2
        import ray

        cv2.setNumThreads(1)  # decode/resize in this process must not fight the session for cores
        model_bytes = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.session = make_session(model_bytes, SessionOptions(**(session_options or {})))
        ctx = ray.get_runtime_context()
        self.node = ctx.get_node_id()
        # "+restarted" marks a process Ray started again after this actor died (the summary counts them).
        with warnings.catch_warnings():  # Ray's own property reads its deprecated `actor_id`: not ours to fix
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = "+restarted" if getattr(ctx, "was_current_actor_reconstructed", False) else ""
        self.actor = f"{(ctx.get_actor_id() or 'driver')[:12]}@{os.getpid()}{restarted}"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch["status"])
        small = np.empty(n, dtype=object)
        infer_ms = np.zeros(n, dtype=np.float64)
        status, error, kind = batch["status"].copy(), batch["error"].copy(), batch["error_kind"].copy()
        for i in range(n):
            small[i] = b""
            if status[i] != "pending":
                continue
            t0 = time.perf_counter()
            try:
                small[i] = self.infer_one(batch["pre"][i])
            except Exception as exc:  # noqa: BLE001 - one bad tensor must not kill the batch
                status[i], kind[i], error[i] = "error", "infer", f"infer: {one_line(exc)}"
            infer_ms[i] = (time.perf_counter() - t0) * 1000
        out = {k: v for k, v in batch.items() if k != "pre"}  # drop the tensor: it is done
        out.update(small=small, infer_ms=infer_ms, status=status, error=error, error_kind=kind,
                   node=np.full(n, self.node, dtype=object), actor=np.full(n, self.actor, dtype=object))
        return out

    def infer_one(self, pre: bytes) -> bytes:
        resized = np.frombuffer(pre, dtype=np.uint8).reshape(MODEL_SIZE[1], MODEL_SIZE[0], 3)
        return to_small_mask(run_model(self.session, normalise(resized))).tobytes()
