"""The fp16 Triton kernels compile for Hopper (sm90) with the ptxas Triton ships, no GPU needed: the interpreter
that runs the CPU tests forgives what the compiler refuses, and the shared @triton.jit helpers (grouped tiles,
output pixels, row normalization, split-K's sum) must compile inside every kernel that calls them, with and without
programmatic dependent launch."""

import os
import subprocess
import sys

import pytest

_AOT = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kiln.kernels import conv, gemm, layernorm

def build(fn, sig, consts, pdl=False):
    consts = dict(consts) | {"PDL": pdl}
    sig = dict(sig) | {k: "constexpr" for k in consts}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert ("griddepcontrol.wait" in k.asm["ptx"]) == pdl  # programmatic dependent launch only where asked
    return k

h = "*fp16"
g = dict(zip("a w bias c".split(), [h] * 4)) | {k: "i32" for k in \
"M N K s_am s_ak s_wk s_wn s_bm s_bn s_cm s_cn".split()}
g |= {k: "fp32" for k in "alpha beta act_alpha act_beta".split()}
split = {"ws": "*fp32", "counts": "*i32"}  # split-K's partial tiles and tile counts
g |= split | {"k_per": "i32"}
for s in (False, True):  # unsplit, and split-K (atomic count, partials summed by the last run)
    k = build(gemm._gemm_kernel, g, {"HAS_BIAS": True, "ACT": "gelu_tanh", "PRECISION": "tf32", "UPCAST": False,
                                      "BLOCK_M": 128 if not s else 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
                                      "SPLIT": s}, pdl=s)
    assert "wgmma" in k.asm["ptx"] and ("atom" in k.asm["ptx"]) == s
c = dict(zip("x w bias res y".split(), [h] * 5))
c |= {k: "i32" for k in "N H W C OH OW CO KH KW sh sw ph pw dh dw".split()}
c |= {k: "fp32" for k in "act_alpha act_beta".split()}
c |= {k: "i32" for k in "s_xn s_xc s_xh s_xw s_rn s_rc s_rh s_rw s_yn s_yc s_yh s_yw".split()}
c |= split | {"t_per": "i32"}
for s in (False, True):
    build(conv._conv_kernel, c, {"HAS_BIAS": True, "HAS_RES": True, "ACT": "relu", "PRECISION": "tf32",
                                 "UPCAST": False, "BLOCK_M": 128 if not s else 64, "BLOCK_N": 64, "BLOCK_K": 32,
                                 "SPLIT": s}, pdl=not s)
ln = dict(zip("x w b y".split(), [h] * 4)) | {"N": "i32", "s_x": "i32", "s_y": "i32", "eps": "fp32"}
for one_pass in (True, False):
    build(layernorm._layernorm_kernel, ln, {"HAS_BIAS": True, "BLOCK": 1024, "ONE_PASS": one_pass})
aln = dict(zip("a r w b y s q qm".split(), [h] * 6 + ["*i8", h])) | {
    "M": "i32", "N": "i32", "s_a": "i32", "s_r": "i32", "eps": "fp32", "q_scale": "fp32"}
for quant, rows in ((False, 1), (True, 1), (False, 4)):  # add+LayerNorm, with the int8 copy, and 4 rows a program
    build(layernorm._add_layernorm_kernel, aln, {"HAS_BIAS": True, "STORE_SUM": True, "QUANT": quant, "Q_MUL": False,
                                                 "FP8": False, "EXACT_DIV": True, "BLOCK": 1024, "ROWS": rows})
emb = {k: "*i64" for k in "i0 i1 i2".split()} | {k: h for k in "t0 t1 t2 c w b y".split()}
emb |= {k: "i32" for k in "M N p0 p1 p2 pc v0 v1 v2".split()} | {"eps": "fp32"}
for terms, rows in ((2, 1), (3, 4)):  # BERT's token + segment lookups and positions; three lookups, 4 rows a program
    build(layernorm._embed_layernorm_kernel, emb, {"TERMS": terms, "HAS_CONST": terms == 2, "HAS_BIAS": True,
                                                   "BLOCK": 1024, "ROWS": rows}, pdl=True)
print("compiled")
'''


def test_fp16_kernels_compile_for_hopper():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, "-c", _AOT], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode and ("ptxas" in r.stderr and "not found" in r.stderr or "ImportError" in r.stderr):
        pytest.skip(f"no Triton CUDA toolchain here: {r.stderr.strip().splitlines()[-1][:200]}")
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]
