"""Streaming (non-temporal) stores for kernels whose traffic does not fit in the last-level cache.

A normal store to a line that is not cached first reads the line from DRAM (read-for-ownership),
so a pointwise kernel that reads R bytes and writes W moves R + 2W through the memory bus. Once a
kernel's traffic exceeds the last-level cache, its output is evicted before any consumer can read
it from there (a sequential scan larger than an LRU cache keeps nothing), so the read is pure
waste: a non-temporal store writes the line without reading it (Intel SDM vol. 1, 10.4.6.2
"Caching of Temporal vs. Non-Temporal Data"; glibc's ``memcpy`` switches to them above a fraction
of the shared cache, ``x86_non_temporal_threshold``). Measured on Zen 3 (1 thread, C): a 3-pass
layer_norm over 4096×1024 float32 went 4.9 → 3.0–3.5 ms, as fast as a plain copy.

The decision is data (the ``stream`` parameter of a ``pointwise`` or ``fused-rows`` schedule);
applying it is a transform sequence run after bufferization (:data:`ENTRY`), where the kernel's
vector writes have become ``vector.store`` into a ``memref.subview`` of its output buffer: those
get ``nontemporal = true`` (lowered to ``!nontemporal`` stores by ``convert-vector-to-llvm``).
Stores into whole temporaries (a fused chain's per-row means) are not subviews and stay normal;
nor are stores into a slice of a stack temporary (``memref.alloca``: a fused chain's block, which
the next member reads from cache).
No alignment is claimed by the schedule: a kernel may write straight into a slice of a larger
buffer at any offset, and an aligned non-temporal store (``vmovntps``) to an unaligned address
faults. Without a claim LLVM splits each vector into 8-byte non-temporal pieces (``movntsd``,
SSE4A), which cannot fault; :func:`align_stores` then gives each streamed store a second,
aligned form, taken when its address is aligned at run time.
"""
from __future__ import annotations

import re
from typing import Iterable

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.prefetch import ELEMENT_BYTES
from neuron_compile.codegen.strategy import TargetInfo

ENTRY = "__neuron_post_bufferize"
INTERPRETER = f"transform-interpreter{{entry-point={ENTRY}}}"
LLC_SHARE = 0.75   # of the last-level cache a kernel may assume is its own (glibc's factor)
ANY = "!transform.any_op"


def streams(kernels: Iterable[KernelInfo], target: TargetInfo) -> bool:
    """Whether the last of ``kernels`` (one kernel, or a fused chain in order) should write its
    outputs with non-temporal stores: it is ``pointwise``, the target has 8-byte non-temporal
    stores of vector lanes (``movntsd``: SSE4A, AMD), and the chain's traffic, reads from outside
    the chain plus the last kernel's writes, exceeds :data:`LLC_SHARE` of the last-level cache.

    Chains that compute a transcendental function per element stream too. An earlier rule kept
    them out on AVX-512 (a vector store there splits into eight 8-byte pieces when unaligned),
    from full benchmark runs made at different times; measured side by side in one process on
    Zen 5 (each variant compiled at the thread count it is timed at, interleaved with eager;
    4096x1024, the input in L3 or read from memory, 1 and 2 threads), time streamed over not
    streamed: softmax 0.87-0.97 (seven pairs), tanh 0.85 and 0.96, gelu 0.91-1.03 (five), silu
    0.78-1.12 (seven: four faster, three slower). The output buffers torch allocates are 64-byte
    aligned, so the aligned form of :func:`align_stores` (one ``vmovntps`` per vector) is taken.

    Without SSE4A an unaligned non-temporal vector store becomes ``movnti`` from general registers
    (four per 256-bit vector, each after an extract): not measured, so not chosen.
    """
    ks = list(kernels)
    if not ks or ks[-1].kind != "pointwise" or not target.llc_bytes or not target.sse4a:
        return False
    made = {r for k in ks for r in k.results}
    reads = {o.value: o.nbytes for k in ks for o in k.inputs if o.value not in made}
    writes = sum(o.nbytes for o in ks[-1].outputs)
    return sum(reads.values()) + writes > LLC_SHARE * target.llc_bytes


def sequence(root_ids: Iterable[int]) -> str:
    """The post-bufferization transform sequences marking the output stores of each kernel whose
    ``scf.forall`` carries ``neuron.root = id`` non-temporal (``""`` for no kernel)."""
    ids = sorted(set(root_ids))
    if not ids:
        return ""
    body = []
    for i in ids:
        body.append(f'    %l{i} = transform.structured.match ops{{["scf.forall"]}} attributes {{neuron.root = {i} : i64}} '
                    f"in %root : ({ANY}) -> {ANY}\n"
                    f"    transform.apply_patterns to %l{i} {{\n"
                    f"      transform.apply_patterns.vector.lower_transfer max_transfer_rank = 1\n"
                    f"    }} : {ANY}\n"
                    f"    %s{i} = transform.foreach_match in %l{i} @neuron_stack_store -> @neuron_keep_store, "
                    f"@neuron_output_store -> @neuron_stream_store : ({ANY}) -> {ANY}")
    return (f"  transform.named_sequence @neuron_output_store(%s: {ANY} {{transform.readonly}}) -> {ANY} {{\n"
            f'    transform.match.operation_name %s ["vector.store"] : {ANY}\n'
            f"    %base = transform.get_operand %s[1] : ({ANY}) -> !transform.any_value\n"
            f"    %def = transform.get_defining_op %base : (!transform.any_value) -> {ANY}\n"
            f'    transform.match.operation_name %def ["memref.subview"] : {ANY}\n'
            f"    transform.yield %s : {ANY}\n  }}\n"
            f"  transform.named_sequence @neuron_stack_store(%s: {ANY} {{transform.readonly}}) -> {ANY} {{\n"
            f"    %o = transform.include @neuron_output_store failures(propagate) (%s) : ({ANY}) -> {ANY}\n"
            f"    %base = transform.get_operand %o[1] : ({ANY}) -> !transform.any_value\n"
            f"    %def = transform.get_defining_op %base : (!transform.any_value) -> {ANY}\n"
            f"    %src = transform.get_operand %def[0] : ({ANY}) -> !transform.any_value\n"
            f"    %buf = transform.get_defining_op %src : (!transform.any_value) -> {ANY}\n"
            f'    transform.match.operation_name %buf ["memref.alloca"] : {ANY}\n'
            f"    transform.yield %s : {ANY}\n  }}\n"
            f"  transform.named_sequence @neuron_keep_store(%s: {ANY} {{transform.readonly}}) {{\n"
            f"    transform.yield\n  }}\n"
            f"  transform.named_sequence @neuron_stream_store(%s: {ANY} {{transform.readonly}}) {{\n"
            f"    %t = transform.param.constant true -> !transform.any_param\n"
            f'    transform.annotate %s "nontemporal" = %t : {ANY}, !transform.any_param\n'
            f"    transform.yield\n  }}\n"
            f"  transform.named_sequence @{ENTRY}(%root: {ANY} {{transform.readonly}}) {{\n"
            + "\n".join(body) + "\n    transform.yield\n  }")


_STORE = re.compile(r"^(\s*)vector\.store (%[\w$.-]+(?:#\d+)?), (%[\w$.-]+)\[([^\]]*)\] \{nontemporal = true\} "
                    r": (memref<(?:[?\d]+x)*(\w+)(?:, .*)?>), vector<(\d+)x(\w+)>\s*$")


def align_stores(text: str, vector_bytes: int) -> str:
    """Give every non-temporal ``vector.store`` an aligned form, chosen at run time.

    A streamed store claims no alignment (see the module doc), so LLVM splits each vector into
    8-byte non-temporal pieces. Whether the address is aligned is only known at run time: a
    kernel may write straight into a slice of a larger buffer (eliminate-empty-tensors), at any
    offset. Each such store becomes ``scf.if ((address & (A - 1)) == 0)`` over the same store
    claiming ``alignment = A`` (one ``vmovntps`` per vector) and the store as it was, with A the
    smaller of ``vector_bytes`` (the target's vector register) and the stored vector's size.
    The address is the memref's aligned pointer plus its offset and the indices times its
    strides (``memref.extract_strided_metadata``, folded by ``expand-strided-metadata``); when
    the indices step in multiples of A, LLVM's known-bits analysis makes the test loop-invariant
    and unswitches the loop. Measured on Zen 5 (layer_norm 4096x1024, ours over the best of
    eager and Inductor in four alternating ``python -m benchmarks`` runs each, 1 | 2 threads):
    1.05-1.14 | 0.78-1.00 with the aligned form against 0.87-0.99 | 0.74-0.91 in pieces only.

    Args:
        text: an MLIR module as ``mlir-opt`` prints it after bufferization and the schedules'
            lowering (``scf`` loops, 1-D ``vector.store``s, memrefs not yet lowered to LLVM).
        vector_bytes: the target's vector register size in bytes (64 for AVX-512, 32 for AVX2).

    Returns:
        The module with each non-temporal store of a vector of 16 bytes or more so versioned; the
        text unchanged where there is none.
    """
    if "nontemporal = true" not in text:
        return text
    out, n = [], 0
    for line in text.split("\n"):
        m = _STORE.match(line)
        if m is None:
            out.append(line)
            continue
        indent, value, mem, index_text, mt, elem, lanes, velem = m.groups()
        size = int(lanes) * ELEMENT_BYTES.get(velem, 0)
        align = min(vector_bytes, 1 << (size.bit_length() - 1)) if size else 0
        index = [i.strip() for i in index_text.split(",") if i.strip()]
        if align < 16 or elem not in ELEMENT_BYTES or not index:
            out.append(line)
            continue
        p = f"%neuron_nt{n}"
        n += 1
        sizes = [f"{p}_s{k}" for k in range(len(index))]
        strides = [f"{p}_t{k}" for k in range(len(index))]
        code = [f"{p}_ptr = memref.extract_aligned_pointer_as_index {mem} : {mt} -> index",
                f"{p}_base, {p}_off, {', '.join(sizes + strides)} = memref.extract_strided_metadata {mem} : {mt} "
                f"-> memref<{elem}>, index, {', '.join('index' for _ in sizes + strides)}"]
        at = f"{p}_off"
        for k, (i, st) in enumerate(zip(index, strides)):
            code += [f"{p}_m{k} = arith.muli {i}, {st} : index", f"{p}_a{k} = arith.addi {at}, {p}_m{k} : index"]
            at = f"{p}_a{k}"
        code += [f"{p}_eb = arith.constant {ELEMENT_BYTES[elem]} : index",
                 f"{p}_bytes = arith.muli {at}, {p}_eb : index",
                 f"{p}_addr = arith.addi {p}_ptr, {p}_bytes : index",
                 f"{p}_mask = arith.constant {align - 1} : index",
                 f"{p}_low = arith.andi {p}_addr, {p}_mask : index",
                 f"{p}_zero = arith.constant 0 : index",
                 f"{p}_ok = arith.cmpi eq, {p}_low, {p}_zero : index",
                 f"scf.if {p}_ok {{",
                 f"  vector.store {value}, {mem}[{index_text}] {{alignment = {align} : i64, nontemporal = true}} "
                 f": {mt}, vector<{lanes}x{velem}>",
                 "} else {",
                 "  " + line.strip(),
                 "}"]
        out.extend(indent + c for c in code)
    return "\n".join(out)
