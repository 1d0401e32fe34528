"""What kind of op a finding is about, and the fix that kind needs.

A Pallas/Mosaic kernel, a library GEMM or convolution, fused attention, a LAPACK call, an XLA
loop fusion and a host loop each need a different change, so each kind has its own fix text
and no text is shared by two kinds. The kind is read from what the profile says of the op: the
custom call's target and name, xprof's op category, and the op's JAX path.

A leaf module: the rules import it, it imports none of them.
"""

from __future__ import annotations

import re

PALLAS = "pallas_kernel"
LIBRARY_GEMM = "library_gemm"
LIBRARY_CONV = "library_convolution"
FUSED_ATTENTION = "fused_attention"
LAPACK = "lapack"
LOOP_FUSION = "loop_fusion"
GEMM_FUSION = "gemm_fusion"
DATA_MOVEMENT = "data_movement"
CUSTOM_CALL = "custom_call"

LABELS = {
    PALLAS: "Pallas/Mosaic kernel",
    LIBRARY_GEMM: "library GEMM",
    LIBRARY_CONV: "library convolution",
    FUSED_ATTENTION: "fused attention kernel",
    LAPACK: "LAPACK/solver call",
    LOOP_FUSION: "XLA loop fusion",
    GEMM_FUSION: "XLA matmul/convolution fusion",
    DATA_MOVEMENT: "data movement",
    CUSTOM_CALL: "custom call",
}

# Checked in order: attention first (cuDNN's fused attention is also a `__cudnn$` call, and a
# splash kernel is also a Mosaic call), then the libraries, then Pallas.
_PATTERNS = (
    (FUSED_ATTENTION, re.compile(
        r"fmha|fused_attn|flash_attn|flash_attention|splash|dot_product_attention|"
        r"ragged_paged_attention|paged_attention|mha_fwd|mha_bwd|attention", re.I)),
    (LIBRARY_CONV, re.compile(r"cudnn\$conv|miopen|convolution.*custom|__cudnn\$conv", re.I)),
    (LIBRARY_GEMM, re.compile(r"cublas|hipblas|rocblas|\bgemm\b|_gemm|gemm_|matmul\$|"
                              r"te_gemm|cutlass|triton_gemm", re.I)),
    (LAPACK, re.compile(r"lapack|cusolver|hipsolver|rocsolver|magma|syevd|gesdd|getrf|potrf|"
                        r"geqrf|eigh|svd|cholesky", re.I)),
    (PALLAS, re.compile(r"tpu_custom_call|mosaic|pallas|triton|__gpu\$xla\.gpu\.triton", re.I)),
)
_GEMM_CATEGORIES = re.compile(r"convolution|dot|matmul|gemm|output fusion|custom fusion|"
                              r"cublas|dense", re.I)
_MOVING = re.compile(r"^(copy|copy-start|copy-done|transpose|broadcast|bitcast|reshape|slice|"
                     r"dynamic-slice|dynamic-update-slice|pad|concatenate|data formatting|"
                     r"host-to-device|device-to-host|memcpy)", re.I)


def kind_of(*said: str | None, category: str = "") -> str:
    """The op's kind from what the profile says of it (custom-call target, op name, JAX
    path, in any order) and xprof's op category."""
    text = " ".join(s for s in said if s)
    for kind, pattern in _PATTERNS:
        if pattern.search(text):
            return kind
    cat = category.lower()
    if "custom" in cat:
        return CUSTOM_CALL
    if _GEMM_CATEGORIES.search(cat):
        return GEMM_FUSION
    if _MOVING.search(cat):
        return DATA_MOVEMENT
    return LOOP_FUSION


def custom_call_fix(kind: str, op: str, where: str, per_call_ms: float | None,
                    calls: int | None) -> str:
    """The fix of a custom call that xprof could judge (shape-derived FLOPs), by its kind."""
    at = f"`{op}`" + (f" (at `{where}`)" if where else "")
    per_call = (f" Each of its {calls} calls takes {per_call_ms:.3g} ms" if per_call_ms is not None
                and calls else "")
    if kind == PALLAS:
        return (f"Tune the Pallas kernel {at}: grow its `BlockSpec` block shapes (multiples of "
                "(8, 128) on TPU, of 16 on GPU) until the double-buffered blocks nearly fill "
                "VMEM/shared memory, so each grid step does enough work to hide its DMA; put the "
                "reduction axis last in the grid and mark the other axes `parallel` in "
                "`dimension_semantics` so Mosaic pipelines the input copies with compute."
                + (per_call + ": when that is a few microseconds, fuse the calls into one kernel "
                   "over a larger grid instead." if per_call else ""))
    if kind == LIBRARY_GEMM:
        return (f"Feed the library GEMM {at} shapes and types its fast kernels take: M, N and K "
                "multiples of 16 (64 for fp8), bf16/fp16 (or fp8) operands with fp32 "
                "accumulation (`preferred_element_type=jnp.float32`), operands contiguous in the "
                "layout the GEMM reads (no transpose in front of it); batch small GEMMs into one "
                "batched `jnp.einsum`/`jax.vmap` call so each launch has enough work."
                + (per_call + "." if per_call else ""))
    if kind == LIBRARY_CONV:
        return (f"Give the library convolution {at} the layout and sizes its fast kernels want: "
                "NHWC activations, input and output channels multiples of 8 (16 for bf16), "
                "bf16 inputs; set `XLA_FLAGS=--xla_gpu_autotune_level=4` (the default) or "
                "higher so cuDNN/MIOpen picks the best algorithm, and fold per-channel "
                "elementwise work into the convolution's epilogue.")
    if kind == FUSED_ATTENTION:
        return (f"Configure the fused attention kernel {at} for its fast path: a head dimension "
                "that is a multiple of 64 (at most 128/256 by kernel), bf16/fp16 q/k/v, "
                "causal masking passed as the mask type (`is_causal=True`, "
                "`mask_type=causal`, splash's `CausalMask`) rather than a materialised mask "
                "tensor so masked blocks are skipped, sequence lengths padded to the kernel's "
                "block size; for splash/flash kernels, tune `block_q`/`block_kv` sizes.")
    if kind == LAPACK:
        return (f"Call the solver {at} less often or on batches: factor once and reuse the "
                "factor across steps when the matrix does not change, and pass a batch of "
                "matrices in one call rather than one matrix per call.")
    return (f"The custom call {at} runs below its roofline: check the shapes it receives "
            "(multiples of the hardware tile) and whether a larger batch per call is possible.")


def memory_bound_fix(kind: str, ops: list[str]) -> str:
    """The fix of a memory-bound program by the kind of its HBM-bound ops (the largest
    first), naming them."""
    named = ", ".join(f"`{o}`" for o in ops[:3]) or "the top ops"
    if kind in (GEMM_FUSION, LIBRARY_GEMM):
        return (f"The HBM-bound time is in matmul/convolution fusions ({named}): each reads "
                "its weights and activations once for too little compute. Raise the work per "
                "byte: a larger batch (or more tokens) per matmul, bf16 (or fp8/int8) weights "
                "and activations, and fuse the matmuls that share an input into one (for "
                "example the q/k/v projections into one `jnp.einsum` over a stacked weight).")
    if kind == DATA_MOVEMENT:
        return (f"The HBM-bound time is data movement ({named}): copies, transposes and "
                "broadcasts that compute nothing. Remove them at their source: keep arrays in "
                "the layout their consumers read, and let XLA fuse broadcasts into their "
                "consumers instead of materialising them; see the data-transfer and layout "
                "findings for each op's line.")
    if kind == PALLAS:
        return (f"The HBM-bound time is in Pallas kernels ({named}): keep their inputs in "
                "VMEM across grid steps (a larger block along the reused axis) so each byte "
                "read from HBM feeds more FLOPs, and store bf16 rather than f32.")
    return (f"The HBM-bound time is in elementwise loop fusions ({named}), which read and write "
            "every element once per pass: fuse neighbouring elementwise passes into one (one "
            "jitted expression rather than several, no `jax.block_until_ready`/host round trip "
            "between them), store activations in bf16, and remove materialised intermediates "
            "XLA cannot fuse across (custom calls, `jax.pure_callback`, sharding changes).")
