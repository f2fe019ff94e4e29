"""What the Triton kernel modules share: interpreter detection, dot precision, device limits, activations."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kiln.kernels.out_buffer import take
from kiln.target.hardware_compat import smem_budget

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # triton reads it when kernels are decorated, as here
DEFAULT_SMEM = 48 * 1024  # bytes every CUDA device gives a block without opting in
TMA_ALIGN = 16  # bytes: TMA base addresses and row strides
# a conv kernel's map sizes and pads: they only bound and index, so they are not specialized on (value 1, divisible
# by 16), meant to let one compiled kernel serve every layer of a config; no change in compile time was measured
MAP_ARGS = ("N", "H", "W", "OH", "OW", "ph", "pw", "dh", "dw")

try:  # triton ≥ 3.3
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the TMA tactics refuse
    TensorDescriptor = None


def tma_dense(t: torch.Tensor | None) -> bool:
    """Whether TMA can address `t` (None can): row-major 2-D, rows and base on 16-byte boundaries."""
    return t is None or (t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % TMA_ALIGN == 0
                         and t.data_ptr() % TMA_ALIGN == 0)


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's multiprocessors, what a persistent kernel's grid is sized by (2 on the CPU's interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


MIN_SPLIT_REDUCTION = 1024  # a shorter reduction is not split: its steps are few, its configs only cost compiles


def split_k_configs(tiles: list[dict], m: int, n: int, k: int, sms: int, taps: int = 1) -> list[dict]:
    """Split-K variants of the first small-row tile (BLOCK_M ≤ 64) whose grid over an (m, n, taps·k) GEMM or
    implicit-GEMM conv fills under half of `sms` multiprocessors (ResNet-50's late convs and BERT's GEMMs at batch
    1, a classifier GEMV): the (tap, BLOCK_K) reduction steps cut into SPLIT_K runs of two or more, about one
    program a multiprocessor, half that or twice, at four and two times the tile's BLOCK_K and at it (fewer, larger
    loads a run first; the caller drops those its shared memory cannot hold). None for a reduction under
    MIN_SPLIT_REDUCTION (MobileNetV2's 1x1 convs, BERT-base's K = 768 GEMMs)."""
    def grid(c: dict) -> int:
        return triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"])

    tile = next((c for c in tiles if c["BLOCK_M"] <= 64 and 2 * grid(c) <= sms), None)
    if tile is None or taps * k < MIN_SPLIT_REDUCTION:
        return []
    out, fill = [], pow2(sms // grid(tile), 2, 32)
    block_ks = {tile["BLOCK_K"], min(2 * tile["BLOCK_K"], 128), min(4 * tile["BLOCK_K"], 128)}
    for block_k in sorted(block_ks, reverse=True):
        steps = taps * triton.cdiv(k, block_k)
        for split in (fill, fill // 2, 2 * fill):
            cfg = tile | {"BLOCK_K": block_k, "SPLIT_K": split}
            if 2 <= split and 2 * split <= steps and block_k <= pow2(k, 16, 128) and cfg not in out:
                out.append(cfg)
    return out


def step_slice(steps: int, split: int) -> tuple[int, int]:
    """(reduction steps per split, splits) for SPLIT_K over `steps` reduction steps: no empty split."""
    per = triton.cdiv(steps, split)
    return per, triton.cdiv(steps, per)


def split_k_plan(cfg: dict, steps: int, tiles: int, device: torch.device, scratch, unused: torch.Tensor) -> tuple:
    """(reduction steps a program, splits, partials, counts) for a launch of `tiles` tiles over `steps` steps under
    `cfg`'s SPLIT_K: unsplit (`unused` for the two buffers) without `scratch` or where the tiles alone fill the GPU
    (a larger batch than tuned for)."""
    per, splits = step_slice(steps, cfg.get("SPLIT_K", 1))
    if splits == 1 or scratch is None or tiles >= sm_count(device):
        return steps, 1, unused, unused
    return (per, splits, *scratch.get(device, splits, tiles, cfg["BLOCK_M"] * cfg["BLOCK_N"]))


class SplitScratch:
    """A split-K kernel's fp32 partial tiles and zeroed tile counts, one set per CUDA stream and grid (contexts on
    other streams never share them) and kept while the kernel lives: a captured CUDA graph holds their addresses."""

    def __init__(self):
        self._sets: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, splits: int, tiles: int, tile_elems: int) -> tuple[torch.Tensor, torch.Tensor]:
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (stream, splits, tiles, tile_elems)
        if key not in self._sets:
            self._sets[key] = (torch.empty(splits * tiles * tile_elems, dtype=torch.float32, device=device),
                               torch.zeros(tiles, dtype=torch.int32, device=device))
        return self._sets[key]


def pdl_args(device: torch.device) -> dict:
    """Launch arguments for a kernel with a PDL constexpr: programmatic dependent launch on Hopper and later, off
    under the interpreter or with KILN_PDL=0. The next kernel's programs then start as this one's last ones run,
    load their weights, and wait (griddepcontrol.wait) for its results, instead of starting after it drains."""
    on = device.type == "cuda" and os.environ.get("KILN_PDL", "1") != "0" and _pdl_device(device.index)
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@functools.lru_cache(maxsize=None)
def _pdl_device(index: int | None) -> bool:
    return not INTERPRET and torch.cuda.get_device_capability(index) >= (9, 0)


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A kernel's first step under programmatic dependent launch (pdl_args): let the next kernel's programs launch,
    then wait until the previous kernel has finished and its writes are visible; no memory is touched before."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


def dot_precision(dtype: torch.dtype, tf32: bool) -> str:
    """tl.dot input precision: fp32 layers stay in true fp32 ("ieee") unless TF32 is allowed."""
    return "ieee" if dtype == torch.float32 and not tf32 else "tf32"


def upcast_dot(dtype: torch.dtype) -> bool:
    """Whether dot operands go to fp32 first: triton 3.9's interpreter multiplies bf16 as raw uint16 bits."""
    return INTERPRET and dtype == torch.bfloat16


def tma_nhwc(t: torch.Tensor) -> bool:
    """Whether TMA can read NCHW-shaped t as NHWC boxes: channels contiguous, the other strides 16-byte multiples
    (a strided subsample, or rows that overlap as space_to_depth.rows' view's, included)."""
    return t.stride(1) == 1 and all(st * t.element_size() % 16 == 0 for st in (t.stride(0), t.stride(2), t.stride(3))) \
        and t.data_ptr() % 16 == 0


def widest_block(tile: dict, rest: dict, blocks, need, smem: int) -> dict | None:
    """`tile` with the widest channel block of `blocks` (BLOCK_K) whose shared memory need(cfg) fits `smem`, then
    `rest`, and as many programs to a multiprocessor as fit (`stream`: up to four, 1 KiB each reserved); None where
    none fits. Persistent Gluon kernels' configs."""
    for bk in blocks:
        cfg = tile | {"BLOCK_K": bk} | rest
        n = need(cfg)
        if n <= smem:
            return cfg | {"stream": max(1, min(4, (smem + 1024) // (n + 1024)))}
    return None


def capability(device) -> tuple[int, int] | None:
    """The CUDA compute capability of a kiln Device, None off CUDA."""
    if getattr(device, "backend", None) != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device.torch_device)


def smem_limit(device) -> int:
    """Shared memory one block may use on `device` (the opt-in maximum where torch reports it; 48 KiB for
    `--hardware-compat portable` builds)."""
    if capability(device) is None:
        return DEFAULT_SMEM
    props = torch.cuda.get_device_properties(device.torch_device)
    return smem_budget(device, int(getattr(props, "shared_memory_per_block_optin", 0) or DEFAULT_SMEM))


def dtype_reason(dtype: torch.dtype, device) -> str | None:
    """Why a kernel cannot run `dtype` on `device` (bf16 needs sm_80), or None."""
    cc = capability(device)
    if dtype == torch.bfloat16 and cc is not None and cc < (8, 0):
        return f"bf16 needs compute capability 8.0, the device has {cc[0]}.{cc[1]}"
    return None


def pow2(n: int, lo: int, hi: int) -> int:
    """The next power of two of n, clamped to [lo, hi]."""
    return max(lo, min(hi, triton.next_power_of_2(max(int(n), 1))))


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, pid=None):
    """(pid_m, pid_n) of GEMM tile `pid` (this program's by default), tiles ordered in GROUP_M-row bands so that
    neighbours share rows of A and columns of W in L2."""
    if pid is None:
        pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_m, (pid % per_group) // group_m


@triton.jit
def output_pixels(N, OH, OW, BLOCK_M: tl.constexpr):
    """The rows of this program's implicit-GEMM conv tile as output pixels: (n, oh, ow, inside the output)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return rm // (OW * OH), (rm // OW) % OH, rm % OW, rm < N * OH * OW


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tanh(x):
    """tanh through exp (tl.math has no tanh in every triton release); odd, so computed on |x|."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


# erf(x) = x·P(x²) / Q(x²) on |x| < 3.92 (exactly ±1 beyond): a rational fit (benchmarks/probes/fit_erf.py) within
# 4e-7 of erf in ten fused multiply-adds and a division, cheaper than libdevice's erff, which made erf GELU epilogues
# ALU-bound (BERT's FFN int8 GEMM at batch 64: 44 µs without the GELU, 79 µs with erff, 65 µs with this; H200).
# Gluon shares these.
ERF_CLAMP = tl.constexpr(3.92)
ERF_P0, ERF_P1, ERF_P2 = tl.constexpr(1.1283791065216064), tl.constexpr(0.18671834468841553), \
    tl.constexpr(0.05228833854198456)
ERF_P3, ERF_P4, ERF_P5 = tl.constexpr(0.0036176620051264763), tl.constexpr(0.0002832975296769291), \
    tl.constexpr(2.0993861653550994e-06)
ERF_Q1, ERF_Q2, ERF_Q3 = tl.constexpr(0.498807817697525), tl.constexpr(0.1126103326678276), \
    tl.constexpr(0.014667971059679985)
ERF_Q4, ERF_Q5 = tl.constexpr(0.0011301303748041391), tl.constexpr(3.852394365821965e-05)


@triton.jit
def erf(x):
    """erf of fp32 `x` by the rational fit above (fused multiply-adds, a fast division)."""
    inside = tl.abs(x) < ERF_CLAMP
    x = tl.minimum(tl.maximum(x, -ERF_CLAMP), ERF_CLAMP)
    u = x * x
    p = tl.fma(tl.fma(tl.fma(tl.fma(tl.fma(u, ERF_P5, ERF_P4), u, ERF_P3), u, ERF_P2), u, ERF_P1), u, ERF_P0)
    q = tl.fma(tl.fma(tl.fma(tl.fma(tl.fma(u, ERF_Q5, ERF_Q4), u, ERF_Q3), u, ERF_Q2), u, ERF_Q1), u, 1.0)
    return tl.where(inside, tl.fdiv(x * p, q), tl.where(x < 0, -1.0, 1.0))


@triton.jit
def activate(x, ACT: tl.constexpr, alpha, beta):
    """Apply activation ACT (a name from ACTIVATIONS) to fp32 `x`; alpha/beta are its attributes."""
    if ACT == "relu":
        x = tl.maximum(x, 0.0)
    elif ACT == "leaky_relu":
        x = tl.where(x >= 0, x, x * alpha)
    elif ACT == "sigmoid":
        x = sigmoid(x)
    elif ACT == "tanh":
        x = tanh(x)
    elif ACT == "gelu_erf":
        x = 0.5 * x * (1.0 + erf(x * 0.7071067811865476))
    elif ACT == "gelu_tanh":
        x = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif ACT == "silu":
        x = x * sigmoid(alpha * x)
    elif ACT == "hard_sigmoid":
        x = tl.minimum(tl.maximum(alpha * x + beta, 0.0), 1.0)
    elif ACT == "hard_swish":
        x = x * tl.minimum(tl.maximum(x / 6.0 + 0.5, 0.0), 1.0)
    elif ACT == "softsign":
        x = x / (1.0 + tl.abs(x))
    elif ACT == "elu":
        x = tl.where(x > 0, x, alpha * (tl.exp(x) - 1.0))
    elif ACT == "clip":
        x = tl.minimum(tl.maximum(x, alpha), beta)
    return x


@triton.jit
def split_k_sum(acc, ws, counts, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Split-K over grid axis 2: this program's fp32 partial tile goes to the workspace `ws`; the tile's last split
    to arrive (an atomic count in `counts`, reset for the next call) sums every partial in split order, so the
    result is deterministic. Returns (that sum, whether this program is the last)."""
    tiles, tile = tl.num_programs(0) * tl.num_programs(1), tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(ws + (tl.program_id(2) * tiles + tile) * (BLOCK_M * BLOCK_N) + offs, acc)
    tl.debug_barrier()  # every thread's partial written before the count says so
    last = tl.atomic_add(counts + tile, 1, sem="acq_rel") == tl.num_programs(2) - 1
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if last:
        tl.debug_barrier()
        for s in range(0, tl.num_programs(2)):
            total += tl.load(ws + (s * tiles + tile) * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        tl.atomic_xchg(counts + tile, 0)
    return total, last


@triton.jit
def conv_epilogue(acc, bias, res, y, n, oh, ow, rc, c_ok, inside, act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw,
                  s_yn, s_yc, s_yh, s_yw, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr):
    """A conv's fp32 tile of output pixels (n, oh, ow) × channels `rc`, plus bias and residual, activated, stored
    into y where `inside`."""
    if HAS_BIAS:
        acc += tl.load(bias + rc, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        r = res + (n * s_rn + oh * s_rh + ow * s_rw)[:, None] + rc[None, :] * s_rc
        acc += tl.load(r, mask=inside, other=0.0).to(tl.float32)
    acc = activate(acc, ACT, act_alpha, act_beta)
    out = y + (n * s_yn + oh * s_yh + ow * s_yw)[:, None] + rc[None, :] * s_yc
    tl.store(out, acc.to(y.dtype.element_ty), mask=inside)


ACTIVATIONS = ("none", "relu", "leaky_relu", "sigmoid", "tanh", "gelu_erf", "gelu_tanh", "silu",
               "hard_sigmoid", "hard_swish", "softsign", "elu", "clip")

FEW_ROWS = 65536  # output pixels (or GEMM rows) under which a layer is latency-bound: batch 1 at 224² inputs. There
# the tile families that win at batch 64 lost (stop 51: depthwise row sweeps, the 1x1 TMA GEMM), so they are offered
# late or not at all, which also keeps batch-1 builds short

MAX_ROW_BLOCK = 8192  # widest row a row kernel keeps in registers (fp32: 32 values per thread at 8 warps)


def row_config(n: int) -> dict:
    """The default config of a one-program-per-row kernel: the whole row in one block when it fits."""
    block = pow2(n, 16, MAX_ROW_BLOCK)
    return {"BLOCK": block, "num_warps": pow2(block // 256, 1, 8)}


def row_configs(n: int, level: int) -> list[dict]:
    """The default row config, then (level ≥ 2) other warp counts and narrower chunk widths."""
    first = row_config(n)
    if level <= 1:
        return [first]
    out = [first]
    for block in sorted({first["BLOCK"], pow2(n, 16, 2048), pow2(n, 16, 512)}, reverse=True):
        for warps in (1, 2, 4, 8, 16):
            cfg = {"BLOCK": block, "num_warps": warps}
            if 1 <= block // (32 * warps) <= 64 and cfg not in out:
                out.append(cfg)
    return out


def tile_configs(space, keys, limits: dict, fallback: dict, per_level: dict, level: int) -> list[dict]:
    """The tiles of `space` (tuples of `keys`' values) within `limits` (a key's largest value), deduplicated,
    best-first, `per_level[level]` of them (all above the listed levels); `fallback` when none fits."""
    out = []
    for t in space:
        cfg = dict(zip(keys, t))
        if all(cfg[k] <= v for k, v in limits.items()) and cfg not in out:
            out.append(cfg)
    return (out or [fallback])[:per_level.get(level, len(out) or 1)]


def interleave(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], ..., then the longer list's rest: two best-first config lists as
    one, neither family crowded out of the configs a low level keeps."""
    return [x for pair in zip(first, second) for x in pair] + first[len(second):] + second[len(first):]


def conv_output(x: torch.Tensor, co: int, kernel, strides, pads, dilations, out: torch.Tensor | None) -> torch.Tensor:
    """A 2-D conv's output for input x [N, C, H, W]: NCHW-shaped, channels_last, x's dtype (in `out`'s bytes when
    given); pads [top, left, bottom, right]."""
    (n, _, h, wd), (kh, kw), (sh, sw), (dh, dw) = x.shape, kernel, strides, dilations
    oh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    return take(out, (n, co, oh, ow), x.dtype, x.device, torch.channels_last)
