"""The inference actor: one engine (``operators.engines``), used by a fixed-size Ray Data pool.

Input columns: ``status``, ``pre`` (320x320x3 uint8 bytes). Adds ``small`` (320x320 uint8 mask
bytes), ``infer_ms``, ``node``, ``actor`` and ``engine``. The Ray adapter around the engine: the
model arrives as an object-store reference, the node id labels the manifest rows, and the pending
images of a batch go to the engine in one call. An actor on a GPU first checks its masks against
the reference masks the driver made (the driver may have no GPU to check on).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np

from operators import agreement
from operators.engines import EngineError, EngineSpec, open_engine
from operators.preprocess import MODEL_SIZE, normalise
from operators.session import to_small_mask
from pipeline.rows import one_line


class InferenceActor:
    def __init__(self, model: Any, engine: dict[str, Any] | None = None, label: str = "",
                 reference: np.ndarray | None = None) -> None:
        import cv2
        import ray

        cv2.setNumThreads(1)  # decode/resize in this process must not fight the session for cores
        model_bytes = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.engine = open_engine(model_bytes, EngineSpec(**(engine or {})))
        self.label = label or f"{self.engine.spec.label} {self.engine.version}"
        if reference is not None:
            found = agreement.compare(reference, *agreement.masks_of(self.engine, agreement.check_tensors()))
            if not found.passes(self.engine.spec.precision):
                raise EngineError(f"engine {self.label} disagrees with ONNX Runtime fp32 on this device "
                                  f"({found.describe()})")
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
        small[:] = [b""] * n
        status, error, kind = batch["status"].copy(), batch["error"].copy(), batch["error_kind"].copy()
        pending = [i for i in range(n) if status[i] == "pending"]
        if pending:
            t0 = time.perf_counter()
            try:  # the whole batch in one engine call
                masks = self.infer(np.concatenate([tensor_of(batch["pre"][i]) for i in pending]))
            except Exception:  # noqa: BLE001 - find the bad image(s): one at a time, each failing alone
                masks = []
                for i in pending:
                    try:
                        masks.append(self.infer(tensor_of(batch["pre"][i]))[0])
                    except Exception as exc:  # noqa: BLE001 - one bad tensor must not kill the batch
                        status[i], kind[i], error[i] = "error", "infer", f"infer: {one_line(exc)}"
                        masks.append(None)
            for i, mask in zip(pending, masks, strict=True):
                small[i] = b"" if mask is None else mask.tobytes()
            infer_ms[pending] = (time.perf_counter() - t0) * 1000 / len(pending)
        out = {k: v for k, v in batch.items() if k != "pre"}  # drop the tensor: it is done
        out.update(small=small, infer_ms=infer_ms, status=status, error=error, error_kind=kind,
                   node=np.full(n, self.node, dtype=object), actor=np.full(n, self.actor, dtype=object),
                   engine=np.full(n, self.label, dtype=object))
        return out

    def infer(self, tensors: np.ndarray) -> list[np.ndarray | None]:
        return [to_small_mask(m) for m in self.engine.infer(tensors)]


def tensor_of(pre: bytes) -> np.ndarray:
    """A prepared 320x320x3 uint8 image -> the model's 1x3x320x320 float32 input."""
    return normalise(np.frombuffer(pre, dtype=np.uint8).reshape(MODEL_SIZE[1], MODEL_SIZE[0], 3))
