"""The fused kernel compiled for an H100 (sm_90) without a GPU, through Triton's ahead-of-time path: what the
interpreter cannot check (globals a compiled kernel may not read, types, layouts, the lowering of every variant to
PTX and machine code, tensor-core instructions). In a subprocess: the tests' own process runs Triton's interpreter,
which is chosen when Triton is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="needs triton: pip install 'attnscope[gpu]'")

COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnscope.pipeline import fused

assert not fused.interpreted()
kernel = fused._attention_kernel
CONSTANTS = {"M", "M_PAD", "BY_SLOT", "SOFTCAP", "SINKS", "PRECISION", "UPCAST", "BLOCK_M", "BLOCK_N", "BLOCK_D"}
results = []
for dtype, d_head, m, softcap, sinks in json.loads(sys.argv[1]):
    pointers = dict.fromkeys(["Q", "K", "V", "Out"], dtype) | dict.fromkeys(["Wanted", "Limits"], "i32")
    signature = {
        name: "constexpr" if name in CONSTANTS
        else "*" + pointers.get(name, "fp32") if name[0].isupper() and name not in ("H", "G")
        else "fp32" if name in ("scaling", "softcap") else "i32"
        for name in kernel.arg_names
    }
    block_m, block_n, block_d, warps = fused.block_sizes(d_head, False, dtype != "fp32")
    constants = dict(
        M=m, M_PAD=triton.next_power_of_2(max(m, 1)), BY_SLOT=True, SOFTCAP=softcap, SINKS=sinks,
        PRECISION="tf32x3" if dtype == "fp32" else "tf32", UPCAST=False, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d,
    )
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 2},
    )
    results.append({"ptx_mma": "mma" in compiled.asm["ptx"], "cubin_bytes": len(compiled.asm["cubin"])})
print(json.dumps(results))
"""


@pytest.mark.slow
def test_every_variant_compiles_for_an_h100_with_tensor_cores():
    # Two compilations cover every branch (each takes seconds): the half-precision tiles with soft-capping and
    # sinks both on (Gemma 2's soft-capping, gpt-oss's sinks; GPT-2 and Llama-style decoders are the same path with
    # both off), and float32 (an encoder: TF32×3 on tensor cores) at another head size and row count.
    variants = [
        ("bf16", 64, 5, True, True),
        ("fp32", 128, 9, False, False),
    ]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", COMPILE, json.dumps(variants)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(compiled) == len(variants)
    for variant, outcome in zip(variants, compiled, strict=True):
        assert outcome["ptx_mma"] and outcome["cubin_bytes"] > 0, variant
