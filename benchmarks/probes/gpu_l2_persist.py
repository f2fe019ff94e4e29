"""Does pinning an engine's weights in L2 (CUDA's persisting access-policy window, TensorRT's
`persistentCacheLimit`) speed up batch-1 rows, whose convs and GEMMs wait on weight loads?

    python -m benchmarks.probes.gpu_l2_persist --out DIR [--rows resnet50:1,mobilenet_v2:1,bert:1]

Per row: the engine's CUDA tensors found after the build; the context's stream given a window over their address
span (as allocated) and over one buffer they are moved into (`Tensor.set_`, outputs checked equal); each timed
eagerly and as a CUDA graph against the same context without a window; plus each timed layer's five best
candidates. Writes DIR/l2-persist.json.
"""

from __future__ import annotations

import ctypes
import gc

import torch

import kiln
from benchmarks.probes.harness import event_ms, model_rows, rows_parser, suite_row
from kiln.runtime.context import ExecutionContext

MAX_PERSISTING, MAX_WINDOW = 108, 109  # CUdevice_attribute
LIMIT_PERSISTING = 0x06  # CUlimit
ATTR_WINDOW = 1  # CUstreamAttrID / CUlaunchAttributeID: access policy window
NORMAL, STREAMING, PERSISTING = 0, 1, 2  # CUaccessProperty


class Window(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class AttrValue(ctypes.Union):
    _fields_ = [("window", Window), ("pad", ctypes.c_char * 64)]


_cu = ctypes.CDLL("libcuda.so.1")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def device_attr(attr: int) -> int:
    value, dev = ctypes.c_int(), ctypes.c_int()
    _check(_cu.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
    _check(_cu.cuDeviceGetAttribute(ctypes.byref(value), attr, dev), "cuDeviceGetAttribute")
    return value.value


def set_persisting_limit(nbytes: int) -> None:
    _check(_cu.cuCtxSetLimit(LIMIT_PERSISTING, ctypes.c_size_t(nbytes)), "cuCtxSetLimit")


def set_window(stream: torch.cuda.Stream, base: int, nbytes: int, hit_ratio: float) -> None:
    v = AttrValue()
    v.window = Window(base, nbytes, hit_ratio, PERSISTING if nbytes else NORMAL, STREAMING if nbytes else NORMAL)
    _check(_cu.cuStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), ATTR_WINDOW, ctypes.byref(v)),
           "cuStreamSetAttribute")


def cuda_storages(exclude: set[int]) -> dict[int, list[torch.Tensor]]:
    """Live CUDA tensors grouped by their storage's address (those of `exclude` left out)."""
    out: dict[int, list[torch.Tensor]] = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda and not isinstance(o, torch.nn.Parameter):
            ptr = o.untyped_storage().data_ptr()
            if ptr and ptr not in exclude:
                out.setdefault(ptr, []).append(o)
    return out


def relocate(storages: dict[int, list[torch.Tensor]]) -> torch.Tensor:
    """Every storage copied into one buffer (256-byte aligned) and its tensors re-pointed there in place."""
    sizes = {p: ts[0].untyped_storage().nbytes() for p, ts in storages.items()}
    offsets, top = {}, 0
    for p in sorted(sizes):
        offsets[p] = top
        top += -(-sizes[p] // 256) * 256
    buf = torch.empty(top, dtype=torch.uint8, device="cuda")
    for p, ts in storages.items():
        old = ts[0].untyped_storage()
        new = buf.untyped_storage()[offsets[p]:offsets[p] + sizes[p]]
        new.copy_(old)
        for t in ts:
            t.set_(new, t.storage_offset(), t.size(), t.stride())
    return buf


def timed(ctx: ExecutionContext, feeds: dict) -> float:
    return event_ms(lambda: ctx.run(feeds), iters=200, warmup=20)


def row(name: str, batch: int, cache) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "profile-timing.db"))
    engine = kiln.build(path, config)
    kinds = {l.name: l.kind for l in engine.network.layers}
    choices = {n: {"kind": kinds[n], **c.to_json()} for n, c in engine.tactics.items() if c.timed}
    for c in choices.values():
        c["timed"] = sorted(c["timed"], key=lambda t: t[1])[:5]
        c.pop("rejected", None)
    gc.collect()
    torch.cuda.synchronize()
    storages = cuda_storages({v.untyped_storage().data_ptr() for v in feeds.values()})
    nbytes = sum(ts[0].untyped_storage().nbytes() for ts in storages.values())
    lo = min(storages)
    hi = max(p + ts[0].untyped_storage().nbytes() for p, ts in storages.items())
    persist, max_window = device_attr(MAX_PERSISTING), device_attr(MAX_WINDOW)
    set_persisting_limit(persist)
    out = {"model": name, "batch": batch, "tensors_mb": nbytes / 2**20, "storages": len(storages),
           "span_mb": (hi - lo) / 2**20, "max_persisting_mb": persist / 2**20, "max_window_mb": max_window / 2**20,
           "l2_mb": torch.cuda.get_device_properties(0).L2_cache_size / 2**20}

    def contexts(base: int | None, span: int) -> dict:
        res = {}
        for graph in (False, True):
            ctx = ExecutionContext(engine, cuda_graph=graph)
            if base is not None:
                n = min(span, max_window)
                set_window(ctx.stream, base, n, min(1.0, persist / n))
            res["graph" if graph else "eager"] = timed(ctx, feeds)
        return res

    ref = ExecutionContext(engine).run(feeds)
    out["none"] = contexts(None, 0)
    out["span"] = contexts(lo, hi - lo)
    with torch.inference_mode():  # the build made inference tensors, which only inference mode may re-point
        buf = relocate(storages)
    torch.cuda.synchronize()
    moved = ExecutionContext(engine).run(feeds)
    out["moved_equal"] = all(torch.equal(ref[k], moved[k]) for k in ref)
    out["moved"] = contexts(buf.data_ptr(), buf.numel())
    out["none_again"] = contexts(None, 0)
    set_persisting_limit(0)
    _check(_cu.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
    print(out, flush=True)
    out["choices"] = choices
    return out


def main() -> None:
    args = rows_parser(__doc__, "resnet50:1,mobilenet_v2:1,bert:1", 300).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_rows(args, row, args.out / "l2-persist.json")


if __name__ == "__main__":
    main()
