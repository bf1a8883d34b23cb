"""Scalar arithmetic inside region bodies (``linalg.generic``, ``scf.for``) with torch's semantics.

Float ops map to ``arith``/``math`` (MLIR dialect docs); integer ops to the signed ``arith`` ops,
bool (``i1``) and ``uint8`` to the unsigned ones. Casts follow ``torch.Tensor.to`` (float→int
truncates toward zero; X→bool is ``x != 0``).
"""
from __future__ import annotations

import torch

from neuron_compile.lowering.ir import UNSIGNED, Namer, Scalar, element_type, float_literal

_CMP_F = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}
_CMP_SI = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}
_CMP_UI = {"eq": "eq", "ne": "ne", "lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge"}


class ScalarBuilder:
    """Appends scalar ops to a list of lines; every method returns a new :class:`Scalar`."""

    def __init__(self, namer: Namer, lines: list[str], indent: str = "      ", loc: str = "",
                 reassociate: bool = False):
        self.namer, self.lines, self.indent = namer, lines, indent
        self.loc = f" {loc}" if loc else ""
        # reductions and contractions may reassociate float adds/muls (fastmath<reassoc,contract>) so
        # LLVM can vectorize them; ATen's own CPU reductions also sum in a blocked, non-sequential order
        self.fastmath = " fastmath<reassoc,contract>" if reassociate else ""

    def _emit(self, text: str, dtype: torch.dtype) -> Scalar:
        name = self.namer("s")
        self.lines.append(f"{self.indent}{name} = {text}{self.loc}")
        return Scalar(name, dtype)

    # -- constants and casts -------------------------------------------------------------------
    def const(self, value: float | int | bool, dtype: torch.dtype) -> Scalar:
        ty = element_type(dtype)
        if dtype == torch.bool:
            return self._emit(f"arith.constant {'true' if value else 'false'}", dtype)
        if dtype.is_floating_point:
            lit = float_literal(float(value), dtype)
        else:
            # torch converts a Python int to the tensor's integer dtype by wrapping (uint8 + 300 adds
            # 44; ``u < 300`` compares with 44), and MLIR refuses literals outside the type's width
            bits = 8 * dtype.itemsize
            v = int(value) & ((1 << bits) - 1)
            lit = str(v - (1 << bits) if v >= 1 << (bits - 1) else v)
        return self._emit(f"arith.constant {lit} : {ty}", dtype)

    def cast(self, x: Scalar, dtype: torch.dtype) -> Scalar:
        src, dst = x.dtype, dtype
        if src == dst:
            return x
        st, dt = element_type(src), element_type(dst)
        if dst == torch.bool:
            zero = self.const(0, src)
            return self.cmp("ne", x, zero)
        if src.is_floating_point and dst.is_floating_point:
            bits = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}
            if st == dt:
                return x
            if (src, dst) in ((torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)):
                return self.cast(self.cast(x, torch.float32), dst)
            if src == torch.float64 and dst in (torch.float16, torch.bfloat16):
                # through float32, as c10::Half/BFloat16 convert a double (and without the
                # compiler-rt __truncdf?f2 helpers LLVM would otherwise call)
                return self.cast(self.cast(x, torch.float32), dst)
            if (src, dst) == (torch.float32, torch.bfloat16):
                return self._to_bfloat16(x)
            op = "arith.extf" if bits[src] < bits[dst] else "arith.truncf"
            return self._emit(f"{op} {x.name} : {st} to {dt}", dst)
        half = (torch.float16, torch.bfloat16)
        if (dst in half and not src.is_floating_point) or (src in half and not dst.is_floating_point):
            # through float32, as c10::Half/BFloat16 convert integers; LLVM would otherwise call
            # compiler-rt helpers (__truncsfbf2, ...) that not every host's libgcc has
            return self.cast(self.cast(x, torch.float32), dst)
        if not src.is_floating_point and dst.is_floating_point:
            op = "arith.uitofp" if src in UNSIGNED else "arith.sitofp"
            return self._emit(f"{op} {x.name} : {st} to {dt}", dst)
        if src.is_floating_point and not dst.is_floating_point:
            op = "arith.fptoui" if dst in UNSIGNED else "arith.fptosi"
            return self._emit(f"{op} {x.name} : {st} to {dt}", dst)
        sb, db = int(st[1:]), int(dt[1:])
        if sb == db:
            return Scalar(x.name, dst)
        if sb < db:
            op = "arith.extui" if src in UNSIGNED else "arith.extsi"
            return self._emit(f"{op} {x.name} : {st} to {dt}", dst)
        return self._emit(f"arith.trunci {x.name} : {st} to {dt}", dst)

    def _to_bfloat16(self, x: Scalar) -> Scalar:
        """float32 → bfloat16 rounding to nearest even in integer ops, as ``c10::BFloat16``
        (``round_to_nearest_even``; NaN → 0x7FC0). Written out rather than ``arith.truncf`` because
        LLVM lowers that to ``__truncsfbf2``, which GCC 12's libgcc lacks, and the canonicalizer folds
        ``truncf(sitofp(i))`` into a ``sitofp`` to bf16 that no expansion pass handles."""
        i32 = torch.int32
        bits = self._emit(f"arith.bitcast {x.name} : f32 to i32", i32)
        lsb = self._emit(f"arith.andi {self._emit(f'arith.shrui {bits.name}, {self.const(16, i32).name} : i32', i32).name}"
                         f", {self.const(1, i32).name} : i32", i32)
        bias = self.add(self.const(0x7FFF, i32), lsb)
        rounded = self._emit(f"arith.shrui {self.add(bits, bias).name}, {self.const(16, i32).name} : i32", i32)
        chosen = self.select(self.isnan(x), self.const(0x7FC0, i32), rounded)
        half = self._emit(f"arith.trunci {chosen.name} : i32 to i16", torch.int16)
        return self._emit(f"arith.bitcast {half.name} : i16 to bf16", torch.bfloat16)

    # -- arithmetic ------------------------------------------------------------------------------
    def _bin(self, fop: str, iop: str | None, a: Scalar, b: Scalar, uop: str | None = None) -> Scalar:
        assert a.dtype == b.dtype, (a, b)
        if a.dtype.is_floating_point:
            op = fop
        elif a.dtype in UNSIGNED and uop is not None:
            op = uop
        else:
            op = iop
        if op is None:
            raise TypeError(f"{fop} has no integer form")
        fm = self.fastmath if op in ("arith.addf", "arith.mulf") else ""
        return self._emit(f"{op} {a.name}, {b.name}{fm} : {a.type}", a.dtype)

    def add(self, a: Scalar, b: Scalar) -> Scalar:
        if a.dtype == torch.bool:
            return self._emit(f"arith.ori {a.name}, {b.name} : i1", torch.bool)
        return self._bin("arith.addf", "arith.addi", a, b)

    def sub(self, a: Scalar, b: Scalar) -> Scalar:
        return self._bin("arith.subf", "arith.subi", a, b)

    def mul(self, a: Scalar, b: Scalar) -> Scalar:
        if a.dtype == torch.bool:
            return self._emit(f"arith.andi {a.name}, {b.name} : i1", torch.bool)
        return self._bin("arith.mulf", "arith.muli", a, b)

    def _safe_int_divisor(self, a: Scalar, b: Scalar) -> tuple[Scalar, Scalar]:
        """(divisor that cannot trap, "b is -1" flag). x86 integer division traps (SIGFPE, killing the
        process) on b == 0 and on INT_MIN / -1; eager raises or wraps there. Here b == 0 divides by 1
        (the result is then meaningless: eager would raise ZeroDivisionError) and b == -1 is negation."""
        zero, one = self.const(0, b.dtype), self.const(1, b.dtype)
        if b.dtype in UNSIGNED:
            return self.select(self.cmp("eq", b, zero), one, b), self.const(False, torch.bool)
        minus_one = self.const(-1, b.dtype)
        is_m1 = self.cmp("eq", b, minus_one)
        unsafe = self.logical_or(self.cmp("eq", b, zero), is_m1)
        return self.select(unsafe, one, b), is_m1

    def div(self, a: Scalar, b: Scalar) -> Scalar:
        """True division on floats; on integers truncating division (``rounding_mode='trunc'``)."""
        if a.dtype.is_floating_point:
            return self._bin("arith.divf", None, a, b)
        safe, is_m1 = self._safe_int_divisor(a, b)
        q = self._bin("", "arith.divsi", a, safe, uop="arith.divui")
        return q if a.dtype in UNSIGNED else self.select(is_m1, self.neg(a), q)

    def floordiv(self, a: Scalar, b: Scalar) -> Scalar:
        if a.dtype.is_floating_point:
            return self.unary("math.floor", self.div(a, b))
        safe, is_m1 = self._safe_int_divisor(a, b)
        q = self._bin("", "arith.floordivsi", a, safe, uop="arith.divui")
        return q if a.dtype in UNSIGNED else self.select(is_m1, self.neg(a), q)

    def rem(self, a: Scalar, b: Scalar) -> Scalar:
        """``torch.remainder``: result has the sign of the divisor (Python ``%``)."""
        if a.dtype.is_floating_point:
            r = self._bin("arith.remf", None, a, b)
        else:
            safe, is_m1 = self._safe_int_divisor(a, b)
            r = self._bin("", "arith.remsi", a, safe, uop="arith.remui")
            if a.dtype not in UNSIGNED:
                r = self.select(is_m1, self.const(0, a.dtype), r)
        if a.dtype in UNSIGNED:
            return r
        zero = self.const(0, a.dtype)
        fix = self.logical_and(self.cmp("ne", r, zero),
                               self.cmp("ne", self.cmp("lt", r, zero), self.cmp("lt", b, zero)))
        return self.select(fix, self.add(r, b), r)

    def neg(self, a: Scalar) -> Scalar:
        if a.dtype.is_floating_point:
            return self._emit(f"arith.negf {a.name} : {a.type}", a.dtype)
        return self.sub(self.const(0, a.dtype), a)

    def maximum(self, a: Scalar, b: Scalar) -> Scalar:
        """NaN-propagating maximum, as ``torch.maximum``/``amax``."""
        return self._bin("arith.maximumf", "arith.maxsi", a, b, uop="arith.maxui")

    def minimum(self, a: Scalar, b: Scalar) -> Scalar:
        return self._bin("arith.minimumf", "arith.minsi", a, b, uop="arith.minui")

    def max_keep_first(self, a: Scalar, b: Scalar) -> Scalar:
        """``torch.maximum``, ``clamp_min`` and ``relu`` as ATen's CPU kernels give them: ``b`` where
        ``a < b`` or ``b`` is NaN, else ``a`` (NaN in ``a`` propagates). A tie of -0.0 and +0.0 keeps
        ``a``, as ``std::max`` in ATen's clamp and scalar loops does: ``relu(-0.0)`` is -0.0, where
        ``arith.maximumf`` orders -0 < +0 and returned +0.0. (ATen's vectorized ``maximum`` loop
        returns ``b`` on such a tie, so eager itself differs by size there; clamp and relu do not.)"""
        if not a.dtype.is_floating_point:
            return self.maximum(a, b)
        return self.select(self.logical_or(self.cmp("lt", a, b), self.isnan(b)), b, a)

    def min_keep_first(self, a: Scalar, b: Scalar) -> Scalar:
        """``torch.minimum`` and ``clamp_max`` as :meth:`max_keep_first`: ``b`` where ``b < a`` or
        ``b`` is NaN, else ``a``."""
        if not a.dtype.is_floating_point:
            return self.minimum(a, b)
        return self.select(self.logical_or(self.cmp("lt", b, a), self.isnan(b)), b, a)

    def domain_nan(self, r: Scalar, outside: Scalar, negative: bool) -> Scalar:
        """``r`` with its sign bit set (``negative``) or cleared where ``outside`` holds (where ``r`` is
        the NaN an argument outside the op's domain gives), as eager's kernels return that NaN. Done
        with ``math.copysign``, which LLVM defines bit for bit even on a NaN; a ``select`` of a NaN
        constant (on floats or on their bits) was folded away, since LLVM takes every NaN an op
        produces as interchangeable."""
        signed = self._bin("math.copysign", None, r, self.const(-1.0 if negative else 1.0, r.dtype))
        return self.select(outside, signed, r)

    def fresh_nan(self, r: Scalar, x: Scalar) -> Scalar:
        """True where ``r`` is a NaN that its argument ``x`` did not carry in."""
        return self.logical_and(self.isnan(r), self.logical_not(self.isnan(x)))

    def clamp_const(self, a: Scalar, lo: float, hi: float) -> Scalar:
        """``a`` clamped to the constants [lo, hi] with NaN passed through, for the range
        reduction of inline math: ``select(a < lo, lo, a)`` is one ``vmaxps`` (x86 returns the
        second operand when either is NaN), where ``arith.maximumf`` (NaN-propagating, -0 < +0 as
        ``torch.maximum``) lowers to a compare, an unordered compare, an or and a blend."""
        a = self.select(self.cmp("lt", a, self.const(lo, a.dtype)), self.const(lo, a.dtype), a)
        return self.select(self.cmp("gt", a, self.const(hi, a.dtype)), self.const(hi, a.dtype), a)

    def abs(self, a: Scalar) -> Scalar:
        if a.dtype.is_floating_point:
            return self.unary("math.absf", a)
        if a.dtype in UNSIGNED:
            return a
        return self._emit(f"math.absi {a.name} : {a.type}", a.dtype)

    def cmp(self, pred: str, a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype == b.dtype, (a, b)
        if a.dtype.is_floating_point:
            return self._emit(f"arith.cmpf {_CMP_F[pred]}, {a.name}, {b.name} : {a.type}", torch.bool)
        table = _CMP_UI if a.dtype in UNSIGNED else _CMP_SI
        return self._emit(f"arith.cmpi {table[pred]}, {a.name}, {b.name} : {a.type}", torch.bool)

    def isnan(self, a: Scalar) -> Scalar:
        """``a != a`` (``arith.cmpf uno``); constant false for integer and bool values."""
        if not a.dtype.is_floating_point:
            return self.const(False, torch.bool)
        return self._emit(f"arith.cmpf uno, {a.name}, {a.name} : {a.type}", torch.bool)

    def select(self, cond: Scalar, a: Scalar, b: Scalar) -> Scalar:
        assert a.dtype == b.dtype and cond.dtype == torch.bool, (cond, a, b)
        return self._emit(f"arith.select {cond.name}, {a.name}, {b.name} : {a.type}", a.dtype)

    def logical_and(self, a: Scalar, b: Scalar) -> Scalar:
        return self._emit(f"arith.andi {a.name}, {b.name} : i1", torch.bool)

    def logical_or(self, a: Scalar, b: Scalar) -> Scalar:
        return self._emit(f"arith.ori {a.name}, {b.name} : i1", torch.bool)

    def logical_xor(self, a: Scalar, b: Scalar) -> Scalar:
        return self._emit(f"arith.xori {a.name}, {b.name} : i1", torch.bool)

    def logical_not(self, a: Scalar) -> Scalar:
        return self.logical_xor(a, self.const(True, torch.bool))

    def bitwise(self, op: str, a: Scalar, b: Scalar) -> Scalar:
        """``op`` in and/or/xor on integer or bool operands."""
        return self._emit(f"arith.{op}i {a.name}, {b.name} : {a.type}", a.dtype)

    def shift(self, left: bool, a: Scalar, b: Scalar) -> Scalar:
        """``a << b`` (``left``) or ``a >> b`` on integers, as ATen's CPU kernels (``lshift``/``rshift``
        in ``aten/src/ATen/native/cpu/BinaryOpsKernel.cpp``): a shift by a negative amount or by the bit
        width or more gives 0, except a right shift of a signed value, which gives ``a >> (bits - 1)``
        (its sign: 0 or -1). ``arith``'s shifts are poison there, so the amount is clamped first."""
        bits = torch.iinfo(a.dtype).bits
        signed = a.dtype not in UNSIGNED
        zero = self.const(0, a.dtype)
        limit = bits - 1 if signed and not left else bits
        outside = self.cmp("ge", b, self.const(limit, a.dtype))
        if signed:
            outside = self.logical_or(outside, self.cmp("lt", b, zero))
        if signed and not left:
            amount = self.select(outside, self.const(bits - 1, a.dtype), b)
            return self._emit(f"arith.shrsi {a.name}, {amount.name} : {a.type}", a.dtype)
        amount = self.select(outside, zero, b)
        op = "arith.shli" if left else "arith.shrui"
        return self.select(outside, zero, self._emit(f"{op} {a.name}, {amount.name} : {a.type}", a.dtype))

    # -- transcendental (floats only) -------------------------------------------------------------
    def unary(self, op: str, a: Scalar) -> Scalar:
        """A one-operand ``math``/``arith`` float op such as ``math.exp``."""
        return self._emit(f"{op} {a.name} : {a.type}", a.dtype)

    def exp(self, a: Scalar) -> Scalar:
        """``exp``; float32 inline (vectorizable) as Cephes ``expf``: Cody-Waite range reduction
        x = n·ln2 + r, a degree-6 polynomial for e^r, scaling by 2^n through the exponent bits in two
        steps (2^n1·2^n2, n1, n2 ≥ -75 and ≤ 64). Measured ≤ 1 ulp against ``torch.exp`` on [-90, 90].

        x is clamped to [-104, 89] with compare-and-select (NaN is put back at the end). The clamp bounds make the range cases fall
        out of the arithmetic, with no select for each: at 89, n = 128 and e^r·2^64·2^64 overflows to
        inf (so does every x above ln FLT_MAX = 88.7228391); at -104, e^r·2^-75·2^-75 is below 2^-150
        and rounds to 0 (so does every x below ln(2^-150) = -103.97); between ln FLT_MIN and that,
        the second multiply rounds once into the subnormal result.

        Lanes at or below -104 (masked-out attention scores, ``-inf``) compute ``e^0`` instead and
        are set to 0 at the end: clamped to -104 they ran the multiplies that underflow, and each
        such vector instruction took a microcode assist on Intel cores (a causal softmax over
        masked_fill(-inf): 1.23 ms against 0.43 unmasked, measured on Sapphire Rapids)."""
        if a.dtype != torch.float32:
            return self.unary("math.exp", a)
        with self._exact():
            f32, i32 = torch.float32, torch.int32
            hi, lo, zero = self.const(89.0, f32), self.const(-104.0, f32), self.const(0.0, f32)
            inside = self.cmp("gt", a, lo)          # false for NaN and for x <= -104 (e^x rounds to 0)
            xc = self.select(inside, a, zero)
            xc = self.select(self.cmp("lt", xc, hi), xc, hi)
            fx = self.unary("math.floor", self.fma(xc, self.const(1.44269504088896341, f32), self.const(0.5, f32)))
            r = self.fma(fx, self.const(-0.693359375, f32), xc)
            r = self.fma(fx, self.const(2.12194440e-4, f32), r)
            y = self.const(1.9875691500e-4, f32)
            for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
                y = self.fma(y, r, self.const(c, f32))
            y = self.add(self.fma(y, self.mul(r, r), r), self.const(1.0, f32))
            n = self._emit(f"arith.fptosi {fx.name} : f32 to i32", i32)
            n1 = self._emit(f"arith.shrsi {n.name}, {self.const(1, i32).name} : i32", i32)
            n2 = self.sub(n, n1)
            for k in (n1, n2):
                biased = self.add(k, self.const(127, i32))
                bits = self._emit(f"arith.shli {biased.name}, {self.const(23, i32).name} : i32", i32)
                y = self.mul(y, self._emit(f"arith.bitcast {bits.name} : i32 to f32", f32))
            y = self.select(inside, y, zero)
            return self.select(self.isnan(a), a, y)

    def fma(self, a: Scalar, b: Scalar, c: Scalar) -> Scalar:
        """``a·b + c`` rounded once (``math.fma``: one vfmadd on FMA hardware). Polynomials in the
        inline math use it: half the operations of mul-then-add and never less accurate."""
        return self._emit(f"math.fma {a.name}, {b.name}, {c.name} : {a.type}", a.dtype)

    def while_loop(self, inits: list[Scalar], cond, step) -> list[Scalar]:
        """An ``scf.while`` loop carrying ``inits`` (MLIR SCF dialect docs): while
        ``cond(self, *values)`` (an ``i1`` :class:`Scalar`) holds, ``values = step(self, *values)``.
        Returns the values after the last step. For recurrences whose trip count is data (the
        orthogonal polynomials' degree ``n``); a kernel whose body holds one keeps scalar loops (it
        cannot be vectorized). Needs at least two carried values (one result is not a ``%r:1`` group)."""
        assert len(inits) >= 2, inits
        types = ", ".join(s.type for s in inits)
        res = self.namer("w")
        before = [Scalar(self.namer("wa"), s.dtype) for s in inits]
        after = [Scalar(self.namer("wb"), s.dtype) for s in inits]
        args = ", ".join(f"{a.name} = {s.name}" for a, s in zip(before, inits))
        outer = self.indent
        self.lines.append(f"{outer}{res}:{len(inits)} = scf.while ({args}) : ({types}) -> ({types}) {{")
        self.indent = outer + "  "
        try:
            c = cond(self, *before)
            self.lines.append(f"{self.indent}scf.condition({c.name}) {', '.join(a.name for a in before)} : {types}{self.loc}")
            self.lines.append(f"{outer}}} do {{")
            self.lines.append(f"{outer}^bb0({', '.join(f'{a.name}: {a.type}' for a in after)}):")
            nxt = step(self, *after)
            self.lines.append(f"{self.indent}scf.yield {', '.join(s.name for s in nxt)} : {types}{self.loc}")
        finally:
            self.indent = outer
        self.lines.append(f"{outer}}}{self.loc}")
        return [Scalar(f"{res}#{i}", s.dtype) for i, s in enumerate(inits)]

    def _exact(self):
        """Within: no fastmath flags (range reductions must not be reassociated)."""
        builder = self

        class _Exact:
            def __enter__(self):
                self.saved, builder.fastmath = builder.fastmath, ""

            def __exit__(self, *exc):
                builder.fastmath = self.saved
        return _Exact()

    def log(self, a: Scalar) -> Scalar:
        """``log``; float32 inline (vectorizable) as Cephes ``logf``: x = m·2^e with m in
        [√½, √2) from the exponent bits (subnormals scaled by 2^23 first), a degree-8 polynomial for
        log(1 + f), and e·ln2 added in two parts. 0 → -inf, negative → NaN, inf and NaN pass
        through. Without it ``math.log`` becomes scalar ``logf`` calls in every vector loop."""
        if a.dtype != torch.float32:
            return self.unary("math.log", a)
        with self._exact():
            f32, i32 = torch.float32, torch.int32
            sub = self.cmp("lt", a, self.const(1.17549435e-38, f32))
            x = self.select(sub, self.mul(a, self.const(8388608.0, f32)), a)
            bits = self._emit(f"arith.bitcast {x.name} : f32 to i32", i32)
            exp_bits = self._emit(f"arith.shrui {bits.name}, {self.const(23, i32).name} : i32", i32)
            e = self.sub(self._emit(f"arith.andi {exp_bits.name}, {self.const(255, i32).name} : i32", i32),
                         self.select(sub, self.const(149, i32), self.const(126, i32)))
            mbits = self._emit(f"arith.ori {self._emit(f'arith.andi {bits.name}, {self.const(0x807FFFFF, i32).name} : i32', i32).name}"
                               f", {self.const(0x3F000000, i32).name} : i32", i32)
            m = self._emit(f"arith.bitcast {mbits.name} : i32 to f32", f32)  # in [0.5, 1)
            small = self.cmp("lt", m, self.const(0.707106781186547524, f32))
            e = self.select(small, self.sub(e, self.const(1, i32)), e)
            f = self.sub(self.select(small, self.add(m, m), m), self.const(1.0, f32))
            ef = self._emit(f"arith.sitofp {e.name} : i32 to f32", f32)
            z = self.mul(f, f)
            y = self.const(7.0376836292e-2, f32)
            for c in (-1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                      2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1):
                y = self.fma(y, f, self.const(c, f32))
            y = self.mul(self.mul(y, f), z)
            y = self.fma(ef, self.const(-2.12194440e-4, f32), y)
            y = self.fma(z, self.const(-0.5, f32), y)
            r = self.fma(ef, self.const(0.693359375, f32), self.add(f, y))
            r = self.select(self.cmp("eq", a, self.const(0.0, f32)), self.const(float("-inf"), f32), r)
            r = self.select(self.cmp("lt", a, self.const(0.0, f32)), self.const(float("nan"), f32), r)
            r = self.select(self.cmp("eq", a, self.const(float("inf"), f32)), a, r)
            return self.select(self.isnan(a), a, r)

    def log1p(self, a: Scalar) -> Scalar:
        """``log(1 + x)`` accurate for small x (Goldberg, *What every computer scientist should know
        about floating-point arithmetic*, 1991, thm. 4): u = 1 + x; x·(log(u)/(u - 1)), or x if u == 1.
        The quotient is formed first so ``x·log(u)`` cannot overflow near the dtype's largest value."""
        with self._exact():
            one = self.const(1.0, a.dtype)
            u = self.add(one, a)
            um1 = self.sub(u, one)
            exact = self.mul(a, self.div(self.log(u), um1))
            big = self.cmp("eq", u, self.const(float("inf"), a.dtype))
            r = self.select(self.cmp("eq", u, one), a, exact)
            return self.select(big, u, r)

    def expm1(self, a: Scalar) -> Scalar:
        """``exp(x) - 1`` accurate for small x (Kahan's trick): u = exp(x); (u - 1)·(x/log(u)), x if
        u == 1. The quotient ``x/log(u)`` (≈ 1) is formed first: ``(u - 1)·x`` overflows for x within
        ~log(x) of log(max), e.g. float32 expm1(84.5)."""
        with self._exact():
            one = self.const(1.0, a.dtype)
            u = self.exp(a)
            um1 = self.sub(u, one)
            r = self.mul(um1, self.div(a, self.log(u)))
            r = self.select(self.cmp("eq", u, one), a, r)
            r = self.select(self.cmp("eq", um1, self.const(-1.0, a.dtype)), um1, r)
            return self.select(self.cmp("eq", u, self.const(float("inf"), a.dtype)), u, r)

    def sqrt(self, a: Scalar) -> Scalar:
        return self.unary("math.sqrt", a)

    def rsqrt(self, a: Scalar) -> Scalar:
        return self.unary("math.rsqrt", a)

    def tanh(self, a: Scalar) -> Scalar:
        """``tanh``; float32 inline (vectorizable) as the rational approximation of Eigen and XLA
        (``generic_fast_tanh_float``): x·P(x²)/Q(x²) on [-7.9053, 7.9053], ±1 beyond 9.02, x itself
        below 4e-4 (where it is exact to float32); NaN propagates. Without it ``math.tanh`` becomes scalar ``tanhf``
        calls (GPT-2's GELU is the tanh form)."""
        if a.dtype != torch.float32:
            return self.unary("math.tanh", a)
        with self._exact():
            f32 = torch.float32
            x = self.clamp_const(a, -7.90531110763549805, 7.90531110763549805)
            x2 = self.mul(x, x)
            p = self.const(-2.76076847742355e-16, f32)
            for c in (2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05,
                      6.37261928875436e-04, 4.89352455891786e-03):
                p = self.fma(p, x2, self.const(c, f32))
            q = self.const(1.19825839466702e-06, f32)
            for c in (1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03):
                q = self.fma(q, x2, self.const(c, f32))
            r = self.div(self.mul(p, x), q)
            # ±1 exactly where float32 tanh rounds to ±1 (|x| > 9.011), so 1 + tanh(x) is 0 there
            # (GELU's tanh form at large negative x is -0, as eager)
            one = self._emit(f"math.copysign {self.const(1.0, f32).name}, {a.name} : f32", f32)
            r = self.select(self.cmp("gt", self.abs(a), self.const(9.02, f32)), one, r)
            tiny = self.cmp("lt", self.abs(a), self.const(0.0004, f32))
            return self.select(tiny, a, r)

    def erf(self, a: Scalar) -> Scalar:
        """``erf``; float32 inline (vectorizable) as the rational approximation Eigen and XLA use
        (``generic_fast_erf_float``): x·P(x²)/Q(x²) on [-4, 4], ±1 beyond. Measured ≤ 4.2e-7
        relative error against ``torch.erf``."""
        if a.dtype != torch.float32:
            return self.unary("math.erf", a)
        with self._exact():
            f32 = torch.float32
            x = self.clamp_const(a, -4.0, 4.0)
            x2 = self.mul(x, x)
            p = self.const(-2.72614225801306e-10, f32)
            for c in (2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                      -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02):
                p = self.fma(p, x2, self.const(c, f32))
            q = self.const(-1.45660718464996e-05, f32)
            for c in (-2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02):
                q = self.fma(q, x2, self.const(c, f32))
            return self.div(self.mul(p, x), q)

    def sigmoid(self, a: Scalar) -> Scalar:
        one = self.const(1.0, a.dtype)
        return self.div(one, self.add(one, self.exp(self.neg(a))))

    def pow(self, a: Scalar, b: Scalar) -> Scalar:
        """``torch.pow``: floats through ``math.powf``; integers through ``math.ipowi``."""
        if a.dtype.is_floating_point:
            return self._emit(f"math.powf {a.name}, {b.name} : {a.type}", a.dtype)
        return self._emit(f"math.ipowi {a.name}, {b.name} : {a.type}", a.dtype)

    def fma_like_pow_int(self, a: Scalar, n: int) -> Scalar:
        """``a ** n`` for a small non-negative integer ``n`` by repeated multiplication (exact for squares)."""
        result = self.const(1, a.dtype)
        for _ in range(n):
            result = self.mul(result, a)
        return result
