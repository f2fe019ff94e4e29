"""cuBLASLt through ctypes: a GEMM's descriptors, the algorithms cuBLASLt's heuristic offers for it, and a call
with a chosen one.

torch runs the heuristic's first algorithm; the autotuner times the others too (TensorRT does the same), which won
8-16 % on transformer FFN GEMMs at batch 64 on an H200. An algorithm is cuBLASLt's opaque 64-byte struct, kept as
hex so that a plan (JSON) carries it; `cublasLtMatmulAlgoCheck` refuses one that no longer fits (another cuBLASLt).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass

import torch

from kiln.errors import InternalError

R_32F, R_16F, R_16BF = 0, 2, 14
DTYPES = {torch.float16: R_16F, torch.bfloat16: R_16BF}
COMPUTE_32F = 68
TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8  # cublasLtMatmulDescAttributes_t
# cublasLtEpilogue_t by (activation, with bias); GELU is the tanh approximation
EPILOGUES = {("none", False): 1, ("relu", False): 2, ("gelu", False): 32,
             ("none", True): 4, ("relu", True): 6, ("gelu", True): 36}
PREF_MAX_WORKSPACE = 1
MAX_WORKSPACE = 8 << 20  # bytes an algorithm may ask for


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_handles: dict[int, ctypes.c_void_p] = {}


def library() -> ctypes.CDLL:
    """The libcublasLt torch loaded (found in the process's mappings after cuBLAS is initialized), else by name."""
    global _lib
    with _lock:
        if _lib is None:
            torch.cuda.current_blas_handle()  # loads libcublas, which loads libcublasLt
            with open("/proc/self/maps") as f:
                path = next((line.split()[-1] for line in f if "libcublasLt.so" in line), None)
            for name in ([path] if path else []) + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
                try:
                    _lib = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            if _lib is None:
                raise RuntimeError("libcublasLt not found beside torch")
        return _lib


def _ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed (cublasStatus_t {status})")


def _handle(device: int) -> ctypes.c_void_p:
    lib = library()
    with _lock:
        if device not in _handles:
            h = ctypes.c_void_p()
            with torch.cuda.device(device):
                _ok(lib.cublasLtCreate(ctypes.byref(h)), "create")
            _handles[device] = h
        return _handles[device]


@dataclass(frozen=True)
class Algo:
    """One cuBLASLt algorithm: its struct as 8 hex words, and the workspace bytes it needs."""

    words: tuple[str, ...]
    workspace: int

    def to_config(self) -> dict:
        return {"algo": list(self.words), "workspace": self.workspace}

    @classmethod
    def from_config(cls, config: dict) -> "Algo":
        words = config.get("algo")
        if not isinstance(words, list) or len(words) != 8 or not all(isinstance(w, str) for w in words):
            raise ValueError(f"not a cuBLASLt algorithm: {words!r}")
        workspace = config.get("workspace", 0)
        if not isinstance(workspace, int) or not 0 <= workspace <= MAX_WORKSPACE:
            raise ValueError(f"cuBLASLt workspace of {workspace!r} bytes (0..{MAX_WORKSPACE})")
        return cls(tuple(words), workspace)

    def struct(self) -> ctypes.Array:
        return (ctypes.c_uint64 * 8)(*(int(w, 16) for w in self.words))


class LtGemm:
    """D (M, N) = act(X (M, K) @ W (K, N) + bias) on row-major tensors, run as cuBLASLt's column-major
    Dᵀ = Wᵀ Xᵀ: W is [K, N] contiguous, X's and D's rows may be strided (one layout per row stride)."""

    def __init__(self, m: int, k: int, n: int, dtype: torch.dtype, activation: str, bias: torch.Tensor | None,
                 device: int):
        if dtype not in DTYPES or (activation, bias is not None) not in EPILOGUES:
            raise InternalError(f"cuBLASLt GEMM of {dtype} with {activation!r}")
        self.m, self.k, self.n, self.dtype, self.bias = m, k, n, dtype, bias
        self.lib, self.handle, self.device = library(), _handle(device), device
        self.desc = ctypes.c_void_p()
        _ok(self.lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "descriptor")
        self._set(TRANSA, ctypes.c_int32(0))
        self._set(TRANSB, ctypes.c_int32(0))
        self._set(EPILOGUE, ctypes.c_uint32(EPILOGUES[activation, bias is not None]))
        if bias is not None:
            self._set(BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        self.w_layout = self._layout(n, k, n)
        self._layouts: dict[tuple[int, int], tuple] = {}
        weakref.finalize(self, _destroy, self.lib, self.desc, [self.w_layout], self._layouts)

    def _set(self, attr: int, value) -> None:
        _ok(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value),
                                                    ctypes.c_size_t(ctypes.sizeof(value))), "descriptor attribute")

    def _layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        _ok(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), DTYPES[self.dtype], ctypes.c_uint64(rows),
                                                ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        return lay

    def layouts(self, ldx: int, ldd: int) -> tuple:
        """(X, D) layouts for these row strides, made once."""
        key = (ldx, ldd)
        if key not in self._layouts:
            self._layouts[key] = (self._layout(self.k, self.m, ldx), self._layout(self.n, self.m, ldd))
        return self._layouts[key]

    def heuristics(self, count: int = 16) -> list[Algo]:
        """The algorithms cuBLASLt's heuristic offers, best guess first (rows packed: X and D contiguous)."""
        pref = ctypes.c_void_p()
        _ok(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        try:
            size = ctypes.c_size_t(MAX_WORKSPACE)
            _ok(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(size),
                                                              ctypes.c_size_t(8)), "preference attribute")
            x, d = self.layouts(self.k, self.n)
            results, found = (_Heuristic * count)(), ctypes.c_int(0)
            _ok(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.w_layout, x, d, d, pref, count,
                                                        results, ctypes.byref(found)), "heuristic")
        finally:
            self.lib.cublasLtMatmulPreferenceDestroy(pref)
        return [Algo(tuple(f"{w:016x}" for w in r.algo), int(r.workspace))
                for r in results[:found.value] if r.state == 0]

    def check(self, algo: Algo) -> None:
        """Raises unless `algo` runs this GEMM (with packed rows) within its workspace."""
        x, d = self.layouts(self.k, self.n)
        result = _Heuristic()
        _ok(self.lib.cublasLtMatmulAlgoCheck(self.handle, self.desc, self.w_layout, x, d, d, algo.struct(),
                                             ctypes.byref(result)), "algorithm check")
        if result.workspace > algo.workspace:
            raise RuntimeError(f"the algorithm needs {result.workspace} bytes of workspace, not {algo.workspace}")

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, algo: ctypes.Array,
                 workspace: torch.Tensor | None) -> torch.Tensor:
        """out ← act(x @ w + bias) on the current stream; x (M, K) and out (M, N) with unit column stride."""
        if x.shape != (self.m, self.k) or out.shape != (self.m, self.n) or x.stride(1) != 1 or out.stride(1) != 1:
            raise InternalError(f"cuBLASLt GEMM built for {self.m}x{self.k}, given {tuple(x.shape)}")
        xl, dl = self.layouts(x.stride(0), out.stride(0))
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        ws = workspace.data_ptr() if workspace is not None else None
        _ok(self.lib.cublasLtMatmul(self.handle, self.desc, ctypes.byref(alpha), ctypes.c_void_p(w.data_ptr()),
                                    self.w_layout, ctypes.c_void_p(x.data_ptr()), xl, ctypes.byref(beta),
                                    ctypes.c_void_p(out.data_ptr()), dl, ctypes.c_void_p(out.data_ptr()), dl, algo,
                                    ctypes.c_void_p(ws), ctypes.c_size_t(workspace.numel() if ws else 0),
                                    ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)), "matmul")
        return out


def _destroy(lib: ctypes.CDLL, desc: ctypes.c_void_p, layouts: list, by_stride: dict) -> None:
    """Free a GEMM's cuBLASLt descriptors (its finalizer)."""
    for lay in layouts + [lay for pair in by_stride.values() for lay in pair]:
        lib.cublasLtMatrixLayoutDestroy(lay)
    lib.cublasLtMatmulDescDestroy(desc)


class Workspaces:
    """A kernel's cuBLASLt workspace, one per CUDA stream (two contexts' runs never share one) and kept while the
    kernel lives: a captured CUDA graph holds its address."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._by_stream: dict[tuple[int, int], torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor | None:
        if self.nbytes == 0:
            return None
        key = (device.index or 0, torch.cuda.current_stream(device).cuda_stream)
        if key not in self._by_stream:
            self._by_stream[key] = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        return self._by_stream[key]
