"""Write a small, ready-to-serve kiln model repository (see examples/README.md):

    python examples/make_repository.py models/
    kiln serve models/

- `affine`: y = 2 * x + 1, x and y [batch, 4] float32, with a config.toml (dynamic batching, a queue limit).
- `softmax`: probs = softmax(logits), [batch, 3] float32, without a config: kiln auto-completes it from the model.

The ONNX files are made here with onnx.helper (no binaries in the source tree); kiln builds each one on load and
caches the plan beside it (MODEL/1/model.plan).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

AFFINE_CONFIG = """\
# kiln model config (Triton's field names); every field is optional
max_batch_size = 16

[dynamic_batching]
preferred_batch_size = [8, 16]
max_queue_delay_microseconds = 1000   # wait up to 1 ms to merge requests into one batch
max_queue_size = 256                  # beyond this many queued requests: 503, retry later
"""


def _save(nodes, inputs, outputs, path: Path, initializers=()) -> None:
    graph = helper.make_graph(nodes, path.parent.parent.name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def affine(path: Path) -> None:
    """y = x * 2 + 1, x and y [batch, 4] float32."""
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 4])  # noqa: E731
    consts = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("Mul", ["x", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "one"], ["y"], name="add")]
    _save(nodes, [io("x")], [io("y")], path, consts)


def softmax(path: Path) -> None:
    """probs = softmax(logits) over the last axis, [batch, 3] float32."""
    io = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3])  # noqa: E731
    _save([helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax")], [io("logits")],
          [io("probs")], path)


def make_repository(root: Path) -> Path:
    """Write the two models under `root` (created if missing); returns `root`."""
    root = Path(root)
    affine(root / "affine" / "1" / "model.onnx")
    (root / "affine" / "config.toml").write_text(AFFINE_CONFIG)
    softmax(root / "softmax" / "1" / "model.onnx")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("models"), help="the repository folder to write")
    root = make_repository(parser.parse_args().root)
    print(f"wrote {root}: {', '.join(sorted(p.name for p in root.iterdir() if p.is_dir()))}")


if __name__ == "__main__":
    main()
