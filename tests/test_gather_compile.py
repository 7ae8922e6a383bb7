"""The Triton gather compiled for real GPUs without one: Triton's own compiler and ptxas build
the kernel for sm_90 (H100/H200) and sm_80 (A100) at every word size the launcher picks, so a
change that only a GPU compile would reject fails here (the interpreter tests check its bytes)."""

from __future__ import annotations

import pytest

from cpkv.kernels import gather

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("arch", [90, 80])
def test_the_gather_kernel_compiles_to_a_cubin(arch, monkeypatch):
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said explicitly (it warns otherwise)
    monkeypatch.setattr(gather, "_triton_kernel", None)  # the compiled (not interpreted) JIT function
    kernel = gather._kernel()
    for word, pointer in ((tl.int64, "*i64"), (tl.int32, "*i32"), (tl.int16, "*i16"), (tl.uint8, "*u8")):
        source = ASTSource(fn=kernel, constexprs={"WORD": word, "BLOCK": 1024}, signature={
            "out_ptr": pointer, "table_ptr": "*i64", "source_ptr": "*i32", "row_ptr": "*i64", "row_words": "i32",
            "WORD": "constexpr", "BLOCK": "constexpr"})
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32))
        assert len(compiled.asm["cubin"]) > 0
        assert f".target sm_{arch}" in compiled.asm["ptx"] and "ld.global" in compiled.asm["ptx"]
    gather._triton_kernel = None
