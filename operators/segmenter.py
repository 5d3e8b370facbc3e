"""U2Net-P for whole images: an inference engine plus rembg's pre- and post-processing. No Ray.

``small_masks`` is what the inference pool calls on a batch of prepared images (320x320x3 uint8,
resized in the decode tasks); ``mask`` runs one whole image through every step, for callers that
hold an image rather than a pipeline batch (the agreement checks, notebooks, tests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from maskray.operators.engines import Engine, EngineSpec, open_engine
from maskray.operators.errors import one_line
from maskray.operators.postprocess import post_process_mask, resize_mask
from maskray.operators.preprocess import normalise, resize_for_model
from maskray.operators.session import to_small_mask


class Segmenter:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def open(cls, model: bytes, spec: EngineSpec) -> Segmenter:
        return cls(open_engine(model, spec))

    def small_masks(self, prepared: Sequence[np.ndarray]) -> list[np.ndarray | str]:
        """Per prepared image, its 320x320 uint8 mask, or the one-line reason it failed.

        The whole batch goes to the engine in one call; if that fails, each image is retried
        alone, so one bad tensor fails only its own image.
        """
        if not prepared:
            return []
        try:
            return list(self._infer(np.concatenate([normalise(p) for p in prepared])))
        except Exception:  # noqa: BLE001 - find the bad image(s): one at a time, each failing alone
            return [self._one(p) for p in prepared]

    def mask(self, rgb: Image.Image, method: str, post_process: bool = False) -> np.ndarray:
        """One RGB image -> its full-size uint8 mask (``method``: ``postprocess.MASK_RESIZES``)."""
        small = self._infer(normalise(resize_for_model(rgb)))[0]
        full = resize_mask(small, rgb.size, method)
        return post_process_mask(full) if post_process else full

    def _one(self, prepared: np.ndarray) -> np.ndarray | str:
        try:
            return self._infer(normalise(prepared))[0]
        except Exception as exc:  # noqa: BLE001 - one bad tensor must not kill the batch
            return one_line(exc)

    def _infer(self, tensors: np.ndarray) -> list[np.ndarray]:
        return [to_small_mask(m) for m in self.engine.infer(tensors)]
