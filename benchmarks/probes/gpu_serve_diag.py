"""Probe: where a served request's time goes on a GPU. Loads a deep MLP (dynamic batch) through the serve
repository in-process, times the engine alone, sequential requests and concurrent ones, and prints each execution
context's CUDA-graph captures and the reasons any signature ran eagerly.

    python -m benchmarks.probes.gpu_serve_diag [--device cuda] [--layers 60]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mlp(path: Path, layers: int, width: int) -> None:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = numpy_helper.from_array((rng.normal(size=(width, width)) / width ** 0.5).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", width])], initializer=inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))


def median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1e3, 4)


async def drive(model, x: np.ndarray, sequential: int, concurrency: int, each: int) -> dict:
    seq = []
    for _ in range(sequential):
        t = time.perf_counter()
        await model.infer({"x": x})
        seq.append(time.perf_counter() - t)
    errors: list[str] = []

    async def client():
        for _ in range(each):
            try:
                await model.infer({"x": x})
            except Exception as e:  # noqa: BLE001 — counted and shown
                errors.append(f"{type(e).__name__}: {e}"[:200])
    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t
    return {"sequential_p50_ms": median_ms(seq), "concurrent_infer_per_s": round(concurrency * each / wall, 1),
            "errors": len(errors), "error_examples": sorted(set(errors))[:3]}


def main() -> None:
    import kiln
    from kiln.serve.repository import ModelRepository

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp()) / "models"
    mlp(root / "mlp" / "1" / "model.onnx", args.layers, args.width)
    (root / "mlp" / "config.toml").write_text("max_batch_size = 64\ninstance_count = 2\n\n[dynamic_batching]\n"
                                              "max_queue_delay_microseconds = 0\n")
    x = np.random.default_rng(1).normal(size=(1, args.width)).astype(np.float32)
    repo = ModelRepository(root, device=args.device)
    t = time.perf_counter()
    repo.start()
    print("load s", round(time.perf_counter() - t, 2), "index", repo.index())
    model = repo.get("mlp")
    engine = model.engine if hasattr(model, "engine") else model.batcher.engine
    ctx = engine.create_context()
    alone = []
    for i in range(220):
        t = time.perf_counter()
        ctx.run({"x": x})
        if i >= 20:
            alone.append(time.perf_counter() - t)
    print("engine alone (numpy in/out) p50 ms", median_ms(alone), "graphs",
          getattr(ctx.graphs, "captures", None), getattr(ctx.graphs, "eager", None))
    result = asyncio.run(drive(model, x, 300, 32, 30))
    print("served in-process", result)
    q = model.batcher._contexts
    contexts = [q.get() for _ in range(q.qsize())]
    for c in contexts:
        g = c.graphs
        print("context graphs: captures", getattr(g, "captures", None), "eager", getattr(g, "eager", None))
    print("kiln", kiln.__version__)


if __name__ == "__main__":
    main()
