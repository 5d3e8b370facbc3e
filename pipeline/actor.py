"""The Ray adapter around ``operators.segmenter.Segmenter``, used by a fixed-size Ray Data pool.

Input columns: ``status``, ``pre`` (320x320x3 uint8 bytes). Adds ``small`` (320x320 uint8 mask
bytes), ``infer_ms``, ``node``, ``actor``, ``actor_restarted`` and ``engine``. What is Ray's here:
the model arrives as an object-store reference, the node and actor ids label the manifest rows,
and Ray's restart of a dead actor is recorded as a typed column. An actor on a GPU first checks its
masks against the reference masks the driver made (the driver may have no GPU to check on).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np

from maskray.operators import agreement
from maskray.operators.engines import EngineError, EngineSpec
from maskray.operators.preprocess import MODEL_SIZE
from maskray.operators.segmenter import Segmenter
from maskray.pipeline.rows import PENDING
from maskray.pipeline.stopping import stopping


class InferenceActor:
    def __init__(
        self,
        model: Any,
        engine: dict[str, Any] | None = None,
        label: str = "",
        reference: np.ndarray | None = None,
        stop_key: str = "",
    ) -> None:
        import cv2
        import ray

        self.stop_key = stop_key
        cv2.setNumThreads(1)  # decode/resize in this process must not fight the session for cores
        model_bytes = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.segmenter = Segmenter.open(model_bytes, EngineSpec(**(engine or {})))
        engine_ = self.segmenter.engine
        self.label = label or f"{engine_.spec.label} {engine_.version}"
        if reference is not None:
            found = agreement.compare(reference, *agreement.masks_of(engine_, agreement.check_tensors()))
            if not found.passes(engine_.spec.precision):
                raise EngineError(
                    f"engine {self.label} disagrees with ONNX Runtime fp32 on this device ({found.describe()})"
                )
        ctx = ray.get_runtime_context()
        self.node = ctx.get_node_id()
        self.actor = f"{(ctx.get_actor_id() or 'driver')[:12]}@{os.getpid()}"
        with warnings.catch_warnings():  # Ray's own property reads its deprecated `actor_id`: not ours to fix
            warnings.simplefilter("ignore", DeprecationWarning)
            # A process Ray started again after this actor died (the summary counts them).
            self.restarted = bool(getattr(ctx, "was_current_actor_reconstructed", False))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if stopping(self.stop_key):  # the run is stopping: what is not masked yet waits for the next run
            batch = without_pending(batch)
        n = len(batch["status"])
        small = np.empty(n, dtype=object)
        infer_ms = np.zeros(n, dtype=np.float64)
        small[:] = [b""] * n
        status, error, kind = batch["status"].copy(), batch["error"].copy(), batch["error_kind"].copy()
        pending = [i for i in range(n) if status[i] == "pending"]
        if pending:
            t0 = time.perf_counter()
            masks = self.segmenter.small_masks([prepared_of(batch["pre"][i]) for i in pending])
            for i, mask in zip(pending, masks, strict=True):
                if isinstance(mask, str):
                    status[i], kind[i], error[i] = "error", "infer", f"infer: {mask}"
                else:
                    small[i] = mask.tobytes()
            infer_ms[pending] = (time.perf_counter() - t0) * 1000 / len(pending)
        out = {k: v for k, v in batch.items() if k != "pre"}  # drop the tensor: it is done
        out.update(
            small=small,
            infer_ms=infer_ms,
            status=status,
            error=error,
            error_kind=kind,
            node=np.full(n, self.node, dtype=object),
            actor=np.full(n, self.actor, dtype=object),
            actor_restarted=np.full(n, self.restarted, dtype=bool),
            engine=np.full(n, self.label, dtype=object),
        )
        return out


def without_pending(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows already decided (failed to read or decode): they keep their manifest rows."""
    keep = batch["status"] != PENDING
    return {k: v[keep] for k, v in batch.items()}


def prepared_of(pre: bytes) -> np.ndarray:
    """A prepared image's bytes (a column value) -> its 320x320x3 uint8 array."""
    return np.frombuffer(pre, dtype=np.uint8).reshape(MODEL_SIZE[1], MODEL_SIZE[0], 3)
