"""U2Net-P's ONNX graph run op by op with PyTorch on a GPU, in strict fp32.

For GPU nodes whose image has PyTorch but not onnxruntime-gpu (a 250 MB wheel built for one CUDA
major version). Covers exactly the ops this graph uses (Conv, Relu, MaxPool, Add, Concat, Resize,
Sigmoid and the integer shape arithmetic feeding Resize); any other op is refused when the graph
is loaded, never guessed at. Shape arithmetic runs in numpy on the host; tensors stay on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maskray.operators.engines import EngineError, EngineSpec

SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Concat", "Slice", "Cast", "Constant"}
TENSOR_OPS = {"Conv", "Relu", "MaxPool", "Add", "Concat", "Resize", "Sigmoid"}


class TorchEngine:
    def __init__(self, model: bytes, spec: EngineSpec) -> None:
        import onnx
        import torch
        from onnx import numpy_helper

        if spec.device != "cuda" or not torch.cuda.is_available():
            raise EngineError("engine torch runs on a CUDA device, and PyTorch sees none here")
        if spec.precision != "fp32":
            raise EngineError(f"engine torch runs fp32 only (asked for {spec.precision})")
        # TF32 gave min IoU 0.51 against fp32 masks on an H200: strict fp32 convolutions and matmuls.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        self.torch, self.device = torch, torch.device("cuda")
        graph = onnx.load_from_string(model).graph
        unknown = {n.op_type for n in graph.node} - SHAPE_OPS - TENSOR_OPS
        if unknown:
            raise EngineError(f"engine torch does not implement {', '.join(sorted(unknown))}")
        self.weights = {
            t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.device) for t in graph.initializer
        }
        self.nodes = [
            (
                n.op_type,
                list(n.input),
                list(n.output),
                {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute},
            )
            for n in graph.node
        ]
        self.input_name, self.output_name = graph.input[0].name, graph.output[0].name
        # Free each activation after its last reader: kept all, batch 256 needs >130 GiB.
        last_use = {name: i for i, (_, inputs, _, _) in enumerate(self.nodes) for name in inputs}
        self.dead_after = [
            [n for n in inputs if last_use.get(n) == i and n not in self.weights and n != self.output_name]
            for i, (_, inputs, _, _) in enumerate(self.nodes)
        ]
        self.spec, self.version = spec, torch.__version__

    def infer(self, batch: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device, non_blocking=True)
            out = self.forward(x)
            return np.asarray(out[:, 0].float().cpu().numpy())

    def forward(self, x: Any) -> Any:
        values: dict[str, Any] = {**self.weights, self.input_name: x}
        for (op, inputs, outputs, attrs), dead in zip(self.nodes, self.dead_after, strict=True):
            args = [values[i] if i else None for i in inputs]
            values[outputs[0]] = self.run_op(op, args, attrs)
            for name in dead:
                values.pop(name, None)
        return values[self.output_name]

    def run_op(self, op: str, args: list[Any], attrs: dict[str, Any]) -> Any:
        functional = self.torch.nn.functional
        if op == "Conv":
            pads = attrs.get("pads", [0, 0, 0, 0])
            if pads[:2] != pads[2:]:
                raise EngineError("engine torch: asymmetric Conv padding")
            return functional.conv2d(
                args[0],
                args[1],
                args[2] if len(args) > 2 else None,
                stride=attrs.get("strides", 1),
                padding=pads[:2],
                dilation=attrs.get("dilations", 1),
                groups=attrs.get("group", 1),
            )
        if op == "Relu":
            return self.torch.relu(args[0])
        if op == "Sigmoid":
            return self.torch.sigmoid(args[0])
        if op == "Add":
            return args[0] + args[1]
        if op == "MaxPool":
            return functional.max_pool2d(
                args[0],
                attrs["kernel_shape"],
                attrs.get("strides"),
                padding=attrs.get("pads", [0, 0, 0, 0])[:2],
                ceil_mode=bool(attrs.get("ceil_mode", 0)),
            )
        if op == "Resize":
            return self.resize(args, attrs)
        if op == "Concat":
            if all(isinstance(a, np.ndarray) for a in args):
                return np.concatenate(args, axis=attrs["axis"])
            return self.torch.cat(args, dim=attrs["axis"])
        return shape_op(op, args, attrs)

    def resize(self, args: list[Any], attrs: dict[str, Any]) -> Any:
        mode = attrs.get("mode", b"nearest").decode()
        transform = attrs.get("coordinate_transformation_mode", b"half_pixel").decode()
        if mode != "linear" or transform not in ("pytorch_half_pixel", "half_pixel"):
            raise EngineError(f"engine torch: Resize mode {mode}/{transform} not implemented")
        sizes = args[3] if len(args) > 3 and args[3] is not None and len(args[3]) else None
        if sizes is None:
            raise EngineError("engine torch: Resize by scales not implemented")
        # pytorch_half_pixel == half_pixel for outputs larger than one pixel, i.e. align_corners=False.
        return self.torch.nn.functional.interpolate(
            args[0], size=tuple(int(s) for s in sizes[2:]), mode="bilinear", align_corners=False
        )


def shape_op(op: str, args: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    """The integer shape arithmetic, on the host."""
    if op == "Constant":
        from onnx import numpy_helper

        return np.asarray(numpy_helper.to_array(attrs["value"]))
    if op == "Shape":
        return np.asarray(args[0].shape, dtype=np.int64)
    if op == "Gather":
        return np.asarray(np.take(args[0], args[1], axis=attrs.get("axis", 0)))
    if op == "Unsqueeze":
        return np.expand_dims(args[0], tuple(attrs["axes"]))
    if op == "Cast":
        from onnx import helper

        return np.asarray(args[0], dtype=helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if op == "Slice":
        data, starts, ends = args[0], args[1], args[2]
        axes = args[3] if len(args) > 3 and args[3] is not None else np.arange(len(starts))
        steps = args[4] if len(args) > 4 and args[4] is not None else np.ones(len(starts), dtype=np.int64)
        index = [slice(None)] * data.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            index[int(axis)] = slice(int(start), int(min(end, np.iinfo(np.int64).max)), int(step))
        return np.asarray(data[tuple(index)])
    raise EngineError(f"engine torch does not implement {op}")
