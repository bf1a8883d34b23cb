"""Writing transform-dialect sequences (MLIR ``transform`` dialect docs; ops of the ``structured``,
``loop`` and ``apply_patterns`` families as of LLVM 22).

A :class:`SequenceWriter` collects the lines of one ``transform.named_sequence`` body and hands out
fresh handle names, so strategies read as the schedule they apply. Every op here was checked against
mlir-opt 22.1.8; the traps are noted where they bit (exact messages in the strategies' docstrings).
"""
from __future__ import annotations

from typing import Mapping, Sequence

ANY = "!transform.any_op"
FOR = '!transform.op<"scf.for">'
# Bytes a stack temporary (:meth:`SequenceWriter.stack_buffer`) is aligned to: a cache line, so no
# vector load or store of it straddles two lines. ``memref.alloca`` otherwise gets its element's
# alignment (4 bytes for f32) and lands wherever the stack pointer is, which on the main thread
# moves in 16-byte steps from one process to the next (Linux randomizes the stack top). Measured on
# Zen 5, softmax 4096x1024 at 1 thread with its 4 KB row of exponentials on the stack, sweeping
# the output's offset within a page in one process: a temporary 16, 32 or 48 bytes past a line
# boundary cost 1.5-1.75 ms instead of 1.25-1.3 for outputs at 12-28 % of the offsets (eager:
# 1.75-2.1); 64-byte aligned, none (the same in every process).
STACK_ALIGNMENT = 64


class SequenceWriter:
    """Lines of a named sequence whose argument is ``%root`` (the payload module)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._n = 0
        self.fn = "%root"  # the graph's function once :meth:`kernel_func` matched it

    def fresh(self, base: str = "h") -> str:
        self._n += 1
        return f"%{base}{self._n}"

    def __call__(self, line: str) -> None:
        self.lines.append("    " + line)

    def text(self) -> str:
        return "\n".join(self.lines)

    # -- finding ops --------------------------------------------------------------------------------
    def match_kernel(self, kernel_id: int, scope: str = "%root", op: str = "linalg.generic") -> str:
        h = self.fresh("k")
        ops = f'ops{{["{op}"]}} ' if op else ""
        self(f"{h} = transform.structured.match {ops}attributes {{neuron.kernel = {kernel_id} : i64}} in {scope} "
             f": ({ANY}) -> {ANY}")
        return h

    def kernel_func(self, h: str) -> str:
        """The function holding kernel handle ``h``: the kernel's own while kernels are outlined
        (:mod:`neuron_compile.codegen.outline`), else the graph's."""
        f = self.fresh("fn")
        self.fn = f
        self(f'{f} = transform.get_parent_op {h} {{deduplicate, op_name = "func.func"}} : ({ANY}) -> {ANY}')
        return f

    def init_producers(self, h: str, n_inputs: int, fill_inits: Sequence[bool]) -> list[str]:
        """Handles of the ``linalg.fill`` ops producing ``h``'s output inits. Take them BEFORE
        tiling: on the tiled op ``get_producer_of_operand`` returns the forall's slice instead."""
        out = []
        for j, is_fill in enumerate(fill_inits):
            if is_fill:
                p = self.fresh("fill")
                self(f"{p} = transform.get_producer_of_operand {h}[{n_inputs + j}] : ({ANY}) -> {ANY}")
                out.append(p)
        return out

    # -- tiling -------------------------------------------------------------------------------------
    def tile_for(self, h: str, sizes: Sequence[int], name: str = "t") -> tuple[str, list[str]]:
        """``tile_using_for``; returns (tiled op, one loop per nonzero size)."""
        n = sum(1 for s in sizes if s)
        if n == 0:
            return h, []
        t, loops = self.fresh(name), [self.fresh("l") for _ in range(n)]
        self(f"{t}, {', '.join(loops)} = transform.structured.tile_using_for {h} tile_sizes {list(sizes)} "
             f": ({ANY}) -> ({', '.join([ANY] * (n + 1))})")
        return t, loops

    def tile_forall(self, h: str, sizes: Sequence[int]) -> tuple[str, str]:
        """``tile_using_forall``: the loop threads run (``scf.forall`` → OpenMP)."""
        t, f = self.fresh("t"), self.fresh("forall")
        self(f"{t}, {f} = transform.structured.tile_using_forall {h} tile_sizes {list(sizes)} "
             f": ({ANY}) -> ({ANY}, {ANY})")
        return t, f

    def fuse(self, producer: str, loop: str) -> tuple[str, str]:
        """Fuse ``producer`` into ``loop`` (each iteration computes the slice it uses); returns
        (the fused op, the new loop handle)."""
        fused, new = self.fresh("fused"), self.fresh("loop")
        self(f"{fused}, {new} = transform.structured.fuse_into_containing_op {producer} into {loop} "
             f": ({ANY}, {ANY}) -> ({ANY}, {ANY})")
        return fused, new

    def fuse_into(self, producers: Sequence[str], loop: str) -> str:
        """Fuse each producer into ``loop``; returns the loop."""
        for p in producers:
            _, loop = self.fuse(p, loop)
        return loop

    def peel(self, loop: str) -> tuple[str, str]:
        """``loop.peel`` (needs an ``scf.for``-typed handle, and fails when the step divides the trip
        count: only call it for a partial last tile)."""
        c, main, rem = self.fresh("for"), self.fresh("main"), self.fresh("rem")
        self(f"{c} = transform.cast {loop} : {ANY} to {FOR}")
        self(f"{main}, {rem} = transform.loop.peel {c} : ({FOR}) -> ({ANY}, {ANY})")
        return main, rem

    def stack_buffer(self, h: str) -> None:
        """Bufferize ``h``'s destination operands into ``memref.alloca`` buffers right away
        (``bufferize_to_allocation``): a temporary inside a loop costs no ``malloc``/``free`` per
        iteration. Only for loop bodies that ``convert-scf-to-openmp`` wraps in a
        ``memref.alloca_scope`` (an ``scf.forall`` body: the stack is restored every iteration).
        Each buffer is aligned to :data:`STACK_ALIGNMENT` bytes (see there)."""
        b, n, a = self.fresh("buf"), self.fresh("new"), self.fresh("alloca")
        self(f'{b}, {n} = transform.structured.bufferize_to_allocation {h} '
             f'{{alloc_op = "memref.alloca", bufferize_destination_only}} : {ANY}')
        self(f"{a} = transform.get_defining_op {b} : (!transform.any_value) -> {ANY}")
        self.annotate(a, "alignment", STACK_ALIGNMENT)

    def annotate(self, h: str, name: str, value: int | str) -> None:
        """Set attribute ``name`` on every op of ``h``: an ``i64`` for an int, else ``value`` is
        the attribute's MLIR text (``#llvm.loop_annotation<...>``)."""
        p = self.fresh("p")
        if isinstance(value, int):
            self(f"{p} = transform.param.constant {value} : i64 -> !transform.param<i64>")
            self(f'transform.annotate {h} "{name}" = {p} : {ANY}, !transform.param<i64>')
        else:
            self(f"{p} = transform.param.constant {value} -> !transform.any_param")
            self(f'transform.annotate {h} "{name}" = {p} : {ANY}, !transform.any_param')

    def annotate_all(self, h: str, attrs: Mapping[str, int | str] | None) -> None:
        """:meth:`annotate` ``h`` with each of ``attrs`` (none: nothing)."""
        for name, value in (attrs or {}).items():
            self.annotate(h, name, value)

    # -- rewriting ----------------------------------------------------------------------------------
    def canonicalize(self, scope: str) -> None:
        self(f"transform.apply_patterns to {scope} {{ transform.apply_patterns.canonicalization }} : {ANY}")

    def vectorize(self, h: str, sizes: Sequence[int] | None = None) -> None:
        """Vectorize ``h`` (a tile: vectorizing an untiled large op explodes memory, toolchain trap 6);
        ``sizes`` for dynamic shapes (masked vectors)."""
        vs = f" vector_sizes {list(sizes)}" if sizes else ""
        self(f"transform.structured.vectorize {h}{vs} : {ANY}")


# Once per function after every kernel's schedule: clean up what vectorization left, so accumulators
# stay in registers and row-invariant work leaves inner loops. Each pattern group is its own
# apply_patterns (mixing vector lowering with canonicalization hung or crashed: toolchain trap 7);
# lower_masked_transfers must come before any canonicalization ('vector.mask' op expects only one
# operation to mask).
VECTOR_CLEANUP = """    %cf = transform.structured.match ops{["func.func"]} attributes {neuron.code} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %cf {
      transform.apply_patterns.vector.lower_masked_transfers
    } : !transform.any_op
    transform.apply_patterns to %cf {
      transform.apply_patterns.canonicalization
      transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers
    } : !transform.any_op
    transform.foreach %cf : !transform.any_op {
    ^bb0(%f: !transform.any_op):
      transform.apply_cse to %f : !transform.any_op
    }
    transform.apply_patterns to %cf {
      transform.apply_patterns.vector.sink_ops
    } : !transform.any_op
    %cloops = transform.structured.match ops{["scf.for"]} in %root : (!transform.any_op) -> !transform.any_op
    transform.foreach %cloops : !transform.any_op {
    ^bb0(%l: !transform.any_op):
      transform.apply_licm to %l : !transform.any_op
      transform.loop.hoist_loop_invariant_subsets %l : !transform.any_op
    }
    transform.apply_patterns to %cf {
      transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = "innerreduction"
    } : !transform.any_op
    transform.apply_patterns to %cf {
      transform.apply_patterns.vector.cast_away_vector_leading_one_dim
    } : !transform.any_op
    transform.apply_patterns to %cf {
      transform.apply_patterns.canonicalization
    } : !transform.any_op
    transform.foreach %cf : !transform.any_op {
    ^bb0(%f: !transform.any_op):
      transform.apply_cse to %f : !transform.any_op
    }"""
