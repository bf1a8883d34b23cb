"""``matmul``: GotoBLAS-style GEMM (Goto & van de Geijn, *Anatomy of High-Performance Matrix
Multiplication*, TOMS 2008) as linalg on tensors plus a transform-dialect schedule.

Unlike the other strategies this one shapes the payload: the emitter asks :func:`plan` for the
schedule *while* lowering a matmul (as Inductor picks a GEMM template in ``tuned_mm``) and writes
the form the schedule needs (``lowering/gemm.py``):

- B (and A when it is not K-contiguous in memory) is packed with ``linalg.pack`` into micro-panels
  ``Bp[N/NR, K, NR]`` / ``Ap[M/MR, K, MR]``, except that a stored ``[K, M]`` A read by 6-row tiles
  is copied once into a K-contiguous ``[M, K]`` (:func:`a_layout`); an unpacked operand is only an
  ``expand_shape`` view;
- C is viewed as ``C4[M/MR, MR, N/NR, NR]`` and computed by one 5-D contraction generic per
  *region*: the full MR×NR tiles, then an M edge and N edges in power-of-two widths (8, 4, 2, 1):
  every micro-kernel has static vector shapes, with no padding and no masks (a 24-wide accumulator
  was legalised by LLVM into scalar shuffles: 2.8 GFLOP/s);
- the accumulator's initial value (zero, or the bias of ``addmm``) is its own op, fused into each
  tile.

The schedule per region: an ``scf.forall`` over MC×NC blocks of C (the threads' loop), the KC
k-block, one NR panel, one MR panel, and k = 1 by ``tile_reduction_using_for`` so each k-block sums
into a zero-initialised register tile added to C once (blocked summation: at 1024³ the error went
from 3.7× torch's to 1.07× at the same speed). Unit dims are folded so the micro-kernel is a 2-D
outer-product update whose ``fastmath<contract>`` mul/add become FMAs; accumulators are hoisted
into registers. With M ≤ 256 (or batched), B is packed inside the k-block loop right before use
(1.04–1.27× over a separate pre-pack); otherwise B (and a transposed A) are packed up front, each
pack its own ``scf.forall``.

Tile sizes come from :data:`ISA_TABLE` (register tile MR×NR = 12 or 8 accumulators of 16 ymm;
MC·KC in L2), the k-block from the host's L1 geometry (:func:`l1_kc`, the BLIS model: the table's
KC is an upper bound). Measured on Zen 1, 1 thread, against torch.mm (MKL):
0.96–1.04 at 512/1024/2048 in all three layouts, 1.02 on GPT-2's LM head (1000×50257×768),
1.07–1.09 on attention's batched matmuls, 1.06–1.23 on nn.Linear shapes with M = 128.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Mapping, Sequence

from neuron_compile.codegen.kernels import KernelInfo
from neuron_compile.codegen.strategy import Schedule, Slot, TargetInfo
from neuron_compile.codegen.strategies.vector import FRAGMENTS
from neuron_compile.codegen.transform import ANY, SequenceWriter

# Per ISA, for float32 (VL lanes; float64 halves VL and NR). NC/NR must stay >= 12: an 8-trip
# panel loop is fully unrolled by opt and llc's schedulers then take seconds on the block.
ISA_TABLE: dict[str, dict[str, Any]] = {
    # Zen 1 / Haswell: 16 ymm; 6x16 = 12 accumulators + 2 B vectors + 1 broadcast. Measured.
    # FMA_CHAINS: independent accumulators that hide the FMA latency (latency x FMA ports: 5 x 2 on
    # Haswell and Zen 2+, so a 4x16 tile's 8 run at 80%; Zen 1's one 256-bit FMA per cycle needs 5).
    # CONV_PACK_B: whether an implicit-GEMM convolution packs its B panels (the windows of the
    # padded input, rows of NR contiguous elements) or its micro-kernel loads them in place. On
    # AVX2 in place won at every size measured (3×3, 16→16 channels at 8×64×64 1.55×, 32→16 1.13×,
    # 64→64 at 16×16×16 1.17×, 128→128 1.0–1.08×, 2 threads 0.98–1.07×; AMD Zen 3), and on AVX-512
    # too (3×3 at 8×64×64 32→16 1.05×, 16→16 1.06×, at 8×32×32 32→32 1.04×, 64→32 1.03×, 64→64
    # at 16×16×16 1.0×, 2 threads 1.02–1.05×; AMD Zen 5).
    "avx2": dict(VL=8, MR=6, NR=16, MC=96, NC=256, KC=256, MR_alt=(6, 4), MC_small=256, FMA_CHAINS=10,
                 CONV_PACK_B=False),
    # Zen 4 / Skylake-X: 32 zmm; 8x32 = 16 accumulators (toolchain.md measured MKL parity on Zen 4).
    # FMA_CHAINS: latency 4 x 2 ports (Skylake-X, Sapphire Rapids).
    # NARROW_MR: a one-vector-wide tile (N < NR) needs a broadcast of A per FMA, so more rows
    # than the FMA chains alone ask for: 16 first (4096x144 @ 144x24: 337 -> 222 us, eager 347;
    # N = 20: 231 -> 217; N = 16 113 either way; AMD Zen 5, 1 thread). 16 accumulators and the
    # B vector fit AVX-512's 32 registers, not AVX2's 16.
    "avx512": dict(VL=16, MR=8, NR=32, MC=96, NC=384, KC=128, MR_alt=(8, 12, 4), MC_small=256, FMA_CHAINS=8,
                   CONV_PACK_B=False, NARROW_MR=(16, 8, 24, 12)),
}
# register tile rows when N is one vector wide (:func:`_narrow`): MR accumulators of one vector
# (an ISA row's ``NARROW_MR`` replaces it)
NARROW_MR = (8, 16, 24, 12)
MIN_WORK = 16 * 16 * 16  # smaller matmuls (the unrolled linear algebra's) stay plain loops


@dataclass(frozen=True)
class GemmProblem:
    """A matmul as the emitter sees it.

    Attributes:
        m, n, k, batch: sizes (``batch`` 0 for a 2-D matmul).
        dtype: ``float32`` or ``float64``.
        trans_a / trans_b: the stored operand is A as [K, M] / B as [N, K] (read transposed).
        a_k_contiguous / b_n_contiguous: which dim of A / B is unit-stride in memory (a graph
            input may be a transposed view: then the stored layout and the memory layout differ).
        shared_a: a batched product whose A is one [M, K] matrix for every batch (a convolution's
            weight times each image's im2col columns): A has no batch dim and is packed once.
    """

    m: int
    n: int
    k: int
    batch: int
    dtype: str
    trans_a: bool
    trans_b: bool
    a_k_contiguous: bool
    b_n_contiguous: bool
    shared_a: bool = False


def applies(p: GemmProblem, target: TargetInfo) -> bool:
    """Whether the tiled GEMM takes ``p``. Not when N is narrower than one vector (a classifier
    head, ``x @ W.t()`` with 10 outputs on AVX-512): every tile is then an edge tile around a
    packed B, 2.3 GFLOP/s against 9.5 for the plain contraction (dot products over contiguous K,
    measured 64x512 @ 512x10 on Zen 1), unless M is GEMV-small and B is row-major (its own path);
    N under one register tile takes tiles one vector wide (:func:`_narrow`)."""
    if p.dtype not in ("float32", "float64") or target.isa not in ISA_TABLE:
        return False
    nr = ISA_TABLE[target.isa]["NR"] // (2 if p.dtype == "float64" else 1)
    gemv = p.m <= 3 and p.b_n_contiguous and not p.batch
    return p.m * p.n * p.k >= MIN_WORK and min(p.m, p.n, p.k) >= 1 and (p.n >= nr or gemv or _narrow(p, target))


def _narrow(p: GemmProblem, target: TargetInfo) -> bool:
    """N narrower than the table's register tile but at least one vector (a weight gradient with
    16 output channels, MobileNet's 24-channel 1×1 convolutions): tiles one vector wide and
    :data:`NARROW_MR` rows, an N edge tile where N is not a whole number of vectors (N = 20, 24 on
    AVX-512: 0.31-0.50 ms for 4096x144 @ 144xN, a plain contraction 0.64-4.5; eager 0.40; AMD
    Zen 4, 1 thread), but not in a batch: a convolution's per-image GEMM with 24 positions per
    image (4×4 outputs on a padded width of 6) is better done in the rows form (256 channels at
    4×4, batch 16: 6.4 ms that way, 3.1 as rows; AMD Zen 4, 1 thread)."""
    t = ISA_TABLE[target.isa]
    vl, nr = (t["VL"] // 2, t["NR"] // 2) if p.dtype == "float64" else (t["VL"], t["NR"])
    return vl <= p.n < nr and p.m >= 8 and (p.n % vl == 0 or not p.batch)


def plan(p: GemmProblem, target: TargetInfo, overrides: Mapping[str, Any] | None = None) -> Schedule:
    """The GEMM schedule for ``p`` (pure; the policy measured on Zen 1, see the module docstring).

    Params: ``MR``, ``NR`` register tile; ``MC``, ``NC`` the forall block; ``KC`` the k-block;
    ``pack_a``, ``pack_b``; ``fuse_pack_b`` (pack B inside the k-block loop);
    ``pack_tile_a``/``pack_tile_b`` panels per tile of an up-front pack (so a strided read covers
    a 64-byte line); ``pack_forall`` panels per forall iteration of an up-front pack.
    """
    t = ISA_TABLE[target.isa]
    wide = p.dtype == "float64"
    vl = t["VL"] // (2 if wide else 1)
    if _narrow(p, target):
        t = {**t, "NR": t["VL"], "MR_alt": t.get("NARROW_MR", NARROW_MR), "NC": p.n * (2 if wide else 1)}
    t = {**t, "MR_alt": register_tile_candidates(p, t)}
    mr = register_rows(p.m, t, small=p.m <= t["MC_small"])
    q: dict[str, Any] = dict(VL=vl, MR=mr, NR=t["NR"] // (2 if wide else 1), MC=t["MC"], NC=t["NC"], KC=t["KC"])
    if p.m <= 3 and p.b_n_contiguous and not p.batch:
        # GEMV-like: nothing reuses a packed B (the pack would double the traffic); MR = M and a
        # wide NR for enough independent accumulators
        q.update(MR=p.m, NR=(8 if p.m == 1 else 4) * vl, pack_a=False, transpose_a=False, pack_b=False,
                 fuse_pack_b=False, MC=p.m)
        return _finish(q, p, overrides)
    small_m = p.m <= t["MC_small"]
    q.update(pack_b=True, fuse_pack_b=small_m)
    if not small_m:   # blocks of the full-tile rows (the M edge is its own region)
        q["MC"] = even_block(p.m - p.m % q["MR"], q["MC"], q["MR"])
    elif not p.batch:
        # one M block (B packed once per k-block), or two when N alone cannot be split evenly
        # (256^3 at 2 threads: 59% of torch.mm in one M block, 78% in two; halves only where MR
        # divides M: 126-row halves of 256 with a 4-row edge measured 71% at 1 thread), over the
        # register tiles that divide M (see register_rows). Ranked by the split at 2 threads, then
        # tile_time (a balanced split on 4x16 tiles beats an unbalanced one on 6x16), one M block,
        # the split at 4 threads; N blocks keep NC/NR >= 12 (see ISA_TABLE); the table's width on a tie.
        # Splits within 5% rank equal: a second M block packs B twice, and for GPT-2's LM head
        # (128x50257x768, B = the 154 MB embedding read transposed) 0.99 -> 1.0 at 2 threads cost
        # 137 ms against 108 in one M block at 1 thread (Sapphire Rapids)
        cands = [(mr, mc, nc) for mr in _dividing_tiles(p.m, t)
                 for mc in [p.m] + ([p.m // 2] if p.m % (2 * mr) == 0 and p.m >= 8 * mr else [])
                 for nc in (range(q["NC"], 12 * q["NR"] - 1, -q["NR"]) or [q["NC"]])]
        def score(c: tuple[int, int, int]) -> tuple:
            mb, nb = _block_sizes(p.m, c[1]), _block_sizes(p.n, c[2])
            return (round(static_balance(mb, nb, (2,)) * 20), -round(tile_time(p.m, c[0], t), 1), c[1] == p.m,
                    round(static_balance(mb, nb, (4,)), 2))
        q["MR"], q["MC"], q["NC"] = max(cands, key=score)
    # A is streamed unpacked when K is its unit-stride dim (MR row streams), else packed or
    # transposed into a K-contiguous copy: see a_layout
    layout = a_layout(p, q["MR"])
    q["pack_a"], q["transpose_a"] = layout == "pack", layout == "transpose"
    if p.batch:  # one M block per matrix: the batch is the forall
        # N in blocks only where a whole row of panels would not stay in L2 (attention's N = 128
        # is one block; a convolution's N = output pixels, thousands, is blocked like a GEMM's)
        nc = max(p.n, q["NR"]) if p.n <= 2 * q["NC"] else q["NC"]
        q.update(MC=p.m, NC=nc, fuse_pack_b=True)
    if not p.batch and p.m // q["MR"] == 1 and p.n // q["NR"] <= 1 and q["MR"] >= 8:
        # one register tile in all: every loop of the nest has one trip, canonicalization folds
        # the forall away with its neuron.gemm tag, and nothing vectorizes the micro-kernel
        # (8x32 @ K=2048: 4.4 GFLOP/s; with two 4-row tiles 33; a 16-channel weight gradient
        # with 8 input channels 4.8 ms -> 0.5 ms; AMD Zen 4, 1 thread)
        q["MR"] //= 2
        q["MC"] = max(q["MC"], p.m)
    q["KC"] = min(t["KC"], l1_kc(q["MR"], q["NR"], 8 if wide else 4, target))
    return _finish(q, p, overrides)


def _a_packed(p: GemmProblem, mr: int) -> bool:
    """Whether A is packed for register tiles of ``mr`` rows: when K is not its unit-stride dim
    (an unpacked read would touch a new line every k step: 0.66x), or when eight or more rows
    4 KB apart would alias one L1 set."""
    return not p.a_k_contiguous or (mr >= 8 and (p.k * (8 if p.dtype == "float64" else 4)) % 4096 == 0)


def _pow2(r: int) -> bool:
    return r & (r - 1) == 0


def a_layout(p: GemmProblem, mr: int) -> str:
    """How the micro-kernel reads A for register tiles of ``mr`` rows: ``"stream"`` (A as stored,
    K contiguous), ``"pack"`` (micro-panels ``Ap[M/MR, K, MR]``, see :func:`_a_packed`) or
    ``"transpose"`` (a stored ``[K, M]`` A copied once into a K-contiguous ``[M, K]``, then
    streamed like ``A@B``'s).

    A packed tile of a row count that is not a power of two is read as one ``vector<6xf32>``:
    LLVM splits it into a 4- and a 2-element load and shuffles the pair into broadcasts, one
    register more than the 6x16 tile has, so an accumulator spills inside the k loop (seen in the
    objdump; Zen 3, 1 thread, ``A.T@B`` 1024^3: 48 GFLOP/s on packed 6x16 tiles, 67 on 4x16).
    Streamed, the 6 rows are 6 broadcasts from memory and the 12-accumulator tile runs at the
    ``A@B`` rate, so ``A.T@B`` with 6-row tiles takes the transposed copy (same traffic as a pack).
    """
    if not _a_packed(p, mr):
        return "stream"
    copied = replace(p, trans_a=False, a_k_contiguous=True)   # the copy, as the micro-kernel reads it
    if p.trans_a and not p.a_k_contiguous and not _pow2(mr) and not _a_packed(copied, mr):
        return "transpose"
    return "pack"


def register_tile_candidates(p: GemmProblem, t: Mapping[str, Any]) -> tuple[int, ...]:
    """The table's ``MR_alt`` without the row counts that are not a power of two where A would be
    packed for them (see :func:`a_layout`: such a packed tile spills an accumulator)."""
    keep = tuple(r for r in t["MR_alt"] if _pow2(r) or a_layout(p, r) != "pack")
    return keep or tuple(t["MR_alt"])


def l1_kc(mr: int, nr: int, elem: int, target: TargetInfo) -> int:
    """The k-block from the L1 model of BLIS (Low, Igual, Smith, Quintana-Orti, *Analytical Modeling
    Is Enough for High-Performance BLIS*, TOMS 2016, eq. 2): the B micro-panel (KC x NR) stays in
    L1 across the A micro-panels (MR x KC) streamed past it when B takes at most ``W - 1 - C_A``
    of the ``W`` ways, with ``C_A = floor((W - 1) / (1 + NR/MR))`` ways for A:
    ``KC = C_A x (L1 / W) / (MR x elem)``, rounded down to a multiple of 8 (units: elements;
    ``elem`` bytes each). A 32 KB 8-way L1 gives 168 for 6x16 float32 tiles and 256 for 4x16;
    Sapphire Rapids' 48 KB 12-way 256 for 8x32. Measured on Zen 3 at 512^3, 1 thread: KC 256
    (the table's until 2026-12) 70-74% of torch.mm on 6x16 tiles, 128-168 89-92%."""
    ways = max(1, target.l1_ways)
    c_a = max(1, (ways - 1) * mr // (mr + nr))
    kc = c_a * (target.l1_bytes // ways) // (mr * elem)
    return max(8, kc - kc % 8)


def fit_kc(k: int, kc: int) -> int:
    """A k-block for K near ``kc``: K itself if it fits; else the largest multiple of 8 in
    [kc/2, kc] that divides K, else the largest one whose last block is at least half a block (a
    last block of a few k steps would pay a whole C update for them), else ``kc``.

    Never two or three equal blocks: ``opt`` fully unrolls a k-block loop of 2 or 3 trips (the
    whole nest duplicated: 48 or 72 FMAs in the library instead of 24) and the unrolled code ran at
    26-54 GFLOP/s instead of 70 (Zen 3, 1024x768 by K = 256 and 384). Then one block when K is at
    most ``2 kc``, else four or more (measured at K = 384: 96 x 4 within 3% of one block)."""
    if k <= kc:
        return k
    cands = range(kc - kc % 8, max(8, kc // 2) - 1, -8)
    c = next((c for c in cands if k % c == 0), None) or next((c for c in cands if k % c >= c // 2), kc)
    if k % c == 0 and k // c in (2, 3):
        if k <= 2 * kc:
            return k
        c = next((d for d in range(k // 4 - (k // 4) % 8, 7, -8) if k % d == 0), -(-k // 32) * 8)
    return c


def register_rows(m: int, t: Mapping[str, Any], small: bool = False) -> int:
    """MR, the register tile's rows, from the ISA row ``t``: the ``MR_alt`` candidate of least
    :func:`tile_time`, then with no M edge, then first in the table. Choosing the candidate that
    divides M (the rule until 2026-12) put 512 and 1024 on 4×16 tiles, whose 8 accumulators cap
    Zen 2 at 80% of its FMA rate: 1024³ measured 104% of torch.mm with MR = 4 and 126% with
    MR = 6 (one thread; 512³ 96% → 112%).

    ``small`` (M in one block, B packed once for all of it): the candidates that divide M come
    first, since an M edge reads all of B once more for its few rows. nn.Linear with M = 128
    (128×768 by 768×3072 and back) measured 5–10% slower on 6×16 tiles plus a 2-row edge than on
    4×16 tiles, and each edge region adds about 0.14 s to the cold compile.
    """
    cands = _dividing_tiles(m, t) if small else t["MR_alt"]
    return min(cands, key=lambda r: (tile_time(m, r, t), m % r != 0, t["MR_alt"].index(r)))


def _dividing_tiles(m: int, t: Mapping[str, Any]) -> Sequence[int]:
    """The ``MR_alt`` candidates that divide M (no M edge), or all of them if none does."""
    return [r for r in t["MR_alt"] if m % r == 0] or t["MR_alt"]


def tile_time(m: int, r: int, t: Mapping[str, Any]) -> float:
    """Modelled time of M rows in register tiles of ``r`` rows (units: rows at the FMA peak).

    A tile of ``r`` rows keeps ``r·NR/VL`` accumulators in flight and runs at
    ``min(1, that / FMA_CHAINS)`` of the peak; the ``e = M mod r`` rows left over form an edge
    region with a tile of ``e`` rows (all of M when ``r > M``): ``(M - e)/speed(r) + e/speed(e)``.
    """
    lanes = t["NR"] // t["VL"]

    def speed(rows: int) -> float:
        return min(1.0, rows * lanes / t["FMA_CHAINS"])
    e = m % r
    return (m - e) / speed(r) + (e / speed(e) if e else 0.0)


def even_block(m: int, mc: int, mr: int) -> int:
    """An M block near ``mc`` (within 2/3..4/3 of it, a multiple of ``mr``) that divides ``m``, or
    ``mc`` if none does. The threads split the forall's blocks statically; unequal blocks leave
    one thread idle at the end: M = 512 in 96-row blocks is 5 full blocks and a 32-row one, so
    with 2 threads one computed 288 rows and the other 224 (86% of torch.mm at 2 threads; 64-row
    blocks: 96%). Ties go to the smaller block (more blocks balance more thread counts)."""
    cands = [c for c in range(mr * -(-(2 * mc // 3) // mr), 4 * mc // 3 + 1, mr) if m % c == 0]
    return min(cands, key=lambda c: (abs(c - mc), c)) if cands else mc


def _block_sizes(n: int, block: int) -> list[int]:
    return [min(block, n - i) for i in range(0, n, block)]


def static_balance(m_blocks: Sequence[int], n_blocks: Sequence[int], threads: Sequence[int]) -> float:
    """How evenly a static split of the forall's M×N blocks (row-major, the sizes given per dim)
    loads ``threads`` threads: useful work over threads × the busiest thread's work, averaged
    over the thread counts (the plan ranks 2 threads first, then 4). Blocks go to threads as
    OpenMP's static schedule gives them (equal runs of consecutive blocks, the first ``b mod t``
    threads one more). N = 512 in 192-wide blocks
    (192, 192, 128) is 0.67 at 2 threads (measured 1.34x from 1 to 2 threads for the MLP's second
    Linear); in 256-wide blocks it is 1.0 (1.9x)."""
    work = [mb * nb for mb in m_blocks for nb in n_blocks]
    score = 0.0
    for t in threads:
        q, r = divmod(len(work), t)
        starts = [i * q + min(i, r) for i in range(t + 1)]
        busiest = max(sum(work[starts[i]:starts[i + 1]]) for i in range(t))
        score += sum(work) / (t * busiest)
    return score / len(threads)


def _finish(q: dict[str, Any], p: GemmProblem, overrides: Mapping[str, Any] | None) -> Schedule:
    q.update(overrides or {})
    kc = min(q["KC"], p.k) if "KC" in (overrides or {}) else fit_kc(p.k, q["KC"])
    if q["fuse_pack_b"] and p.k % kc:  # a fused pack needs static tiles: KC must divide K
        kc = next((c for c in range(kc - kc % 8, 7, -8) if p.k % c == 0), None)
        if kc is None:
            q["fuse_pack_b"], kc = False, min(q["KC"], p.k)
            # no k-block divides K (a vocabulary-sized K: GPT-2's LM head gradient 128x768x50257):
            # a row-major B is streamed as it is rather than packed whole up front, which writes
            # and reads B (154 MB there) once more: 136 -> 109 ms (Sapphire Rapids, 1 thread)
            if p.b_n_contiguous and "pack_b" not in (overrides or {}):
                q["pack_b"] = False
    q["KC"] = kc
    # up-front packs: panels per tile (a strided source reads 64-byte lines) and per forall step;
    # both must divide the panel count (partial tiles do not vectorize)
    for side, panel, mem_contig in (("a", q["MR"], p.a_k_contiguous), ("b", q["NR"], not p.b_n_contiguous)):
        count = (p.m if side == "a" else p.n) // panel
        want = max(1, 16 // panel) if not mem_contig else 1
        pt = next((d for d in range(want, 0, -1) if count % d == 0), 1) if count else 1
        q[f"pack_tile_{side}"] = pt
        q[f"pack_forall_{side}"] = next((c for c in range(max(pt, 8 // pt * pt), 0, -pt) if count % c == 0), pt) \
            if count else pt
    if q.get("transpose_a"):
        # the copy At [K, M] -> A [M, K] in tiles of up to 8 x 8 (a transposed vector read each),
        # rows in forall blocks of up to 64 that divide M (static tiles for the threads)
        tm, tk = _largest_divisor(p.m, 8), _largest_divisor(p.k, 8)
        q["transpose_tile"] = [tm, tk]
        q["transpose_forall"] = next(c for c in range(min(p.m, 64) // tm * tm, 0, -tm) if p.m % c == 0)
    return Schedule("matmul", {"problem": asdict(p), **q})


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most`` (1 if none larger)."""
    return next(d for d in range(min(n, at_most), 0, -1) if n % d == 0)


@dataclass(frozen=True)
class Region:
    """A rectangle of C with one register-tile shape: ``m1`` panels of ``mr`` rows from ``mlo``,
    ``n1`` panels of ``nr`` columns from ``nlo``; ``a_packed``/``b_packed``: reads the packed operand."""

    idx: int
    mlo: int
    m1: int
    mr: int
    nlo: int
    n1: int
    nr: int
    a_packed: bool
    b_packed: bool


def regions(m: int, n: int, s: Mapping[str, Any]) -> list[Region]:
    """Full tiles first, then the M edge, then N edges in power-of-two widths (and corners)."""
    mr, nr = s["MR"], s["NR"]
    m1, n1 = m // mr, n // nr
    mm, nm = m1 * mr, n1 * nr
    out = []
    if m1 and n1:
        out.append(Region(0, 0, m1, mr, 0, n1, nr, s["pack_a"], s["pack_b"]))
    if mm < m and n1:
        out.append(Region(1, mm, 1, m - mm, 0, n1, nr, False, s["pack_b"]))
    pieces, lo, rest, w = [], nm, n - nm, nr // 2
    while rest:
        if rest >= w:
            pieces.append((lo, w))
            lo, rest = lo + w, rest - w
        w //= 2
    i = 2
    for lo, w in pieces:
        if m1:
            out.append(Region(i, 0, m1, mr, lo, 1, w, s["pack_a"], False))
            i += 1
        if mm < m:
            out.append(Region(i, mm, 1, m - mm, lo, 1, w, False, False))
            i += 1
    return out


def _inside_gemm_nests(what: str, name: str) -> str:
    """Transform ops binding ``%{name}`` to every op matching ``what`` inside the GEMM loop nests
    (tagged ``neuron.gemm``; matched anew, since canonicalization may replace the ops)."""
    return (f'    %{name}_nests = transform.structured.match ops{{["scf.forall"]}} attributes {{neuron.gemm = 1 : i64}} '
            f"in %root : ({ANY}) -> {ANY}\n"
            f"    %{name} = transform.foreach %{name}_nests : {ANY} -> {ANY} {{\n"
            f"    ^bb0(%nest: {ANY}):\n"
            f"      %m = transform.structured.match {what} in %nest : ({ANY}) -> {ANY}\n"
            f"      transform.yield %m : {ANY}\n    }}")


# Once for every GEMM after all kernels' tiling, at function scope (patterns applied to a loop handle
# missed folds the schedule needs: 3.8 against 32.5 GFLOP/s): kill untiled originals (toolchain trap
# 6); fold unit dims so each tile is a 2-D outer-product update keeping fastmath<contract> (→ FMA);
# vectorize the ops of the GEMM nests only; hoist the accumulators into registers; lower transposes
# (packing; 8x8 float32 ones as MLIR's AVX2 shuffle sequence: A.T@B 1024^3's A copy in 8x8 tiles
# took 37.3 ms with the elementwise lowering against 34.8, A@B's time, so) and broadcasts, each group in
# its own apply_patterns (trap 7). Unit-dim folding rebuilds
# generics without their tags, so it runs after every other kernel's sequence (``order``).
GEMM_CLEANUP = "\n".join([
    f'    %gf = transform.structured.match ops{{["func.func"]}} attributes {{neuron.code}} in %root : ({ANY}) -> {ANY}',
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.canonicalization }} : {ANY}",
    f"    transform.foreach %gf : {ANY} {{",
    f"    ^bb0(%gfn: {ANY}):",
    f"      transform.apply_dce to %gfn : {ANY}",
    f"      transform.apply_cse to %gfn : {ANY}",
    "    }",
    _inside_gemm_nests('ops{["linalg.fill"]}', "gfills"),
    f"    %ggen = transform.structured.generalize %gfills : ({ANY}) -> {ANY}",
    f'    %gnests = transform.structured.match ops{{["scf.forall"]}} attributes {{neuron.gemm = 1 : i64}} in %root : ({ANY}) -> {ANY}',
    f"    transform.foreach %gnests : {ANY} {{",
    f"    ^bb0(%gn: {ANY}):",
    f"      transform.apply_patterns to %gn {{ transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices }} : {ANY}",
    "    }",
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.canonicalization }} : {ANY}",
    _inside_gemm_nests("interface{LinalgOp}", "glin"),
    f"    transform.structured.vectorize %glin : {ANY}",
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.vector.transfer_permutation_patterns }} : {ANY}",
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.canonicalization "
    f"transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers }} : {ANY}",
    _inside_gemm_nests('ops{["scf.for"]}', "gfors"),
    # three rounds: an implicit-GEMM convolution's accumulator sits in three nested reduction
    # loops (c, kh, kw), and each round hoists it out of one more (the loops come outer first)
    *[line for _ in range(3) for line in (
        f"    transform.foreach %gfors : {ANY} {{",
        f"    ^bb0(%l: {ANY}):",
        f"      transform.loop.hoist_loop_invariant_subsets %l : {ANY}",
        "    }")],
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.canonicalization }} : {ANY}",
    f'    transform.apply_patterns to %gf {{ transform.apply_patterns.vector.lower_transpose lowering_strategy = "eltwise" avx2_lowering_strategy = true }} : {ANY}',
    f"    transform.apply_patterns to %gf {{ transform.apply_patterns.vector.lower_broadcast "
    f"transform.apply_patterns.vector.lower_shape_cast }} : {ANY}",
])


class MatmulTiled:
    """Applies the schedule :func:`plan` chose when the emitter wrote the kernel (recorded in the
    kernel's ``attrs["gemm"]``); a matmul emitted as one plain generic keeps ``loops``."""

    name: ClassVar[str] = "matmul"
    kinds: ClassVar[frozenset[str]] = frozenset({"matmul"})
    fragments: ClassVar[Mapping[Slot, str]] = FRAGMENTS
    cleanup: ClassVar[str] = GEMM_CLEANUP
    order: ClassVar[int] = 1  # after every other kernel's sequence (see GEMM_CLEANUP)

    def select(self, k: KernelInfo, target: TargetInfo) -> Schedule | None:
        g = k.attrs.get("gemm")
        return Schedule(self.name, g) if g else None

    def transform(self, k: KernelInfo, s: Schedule) -> str:
        q = s.params
        if "conv" in q:
            return _implicit_conv_transform(k, q)
        if "conv_wgrad" in q:
            return _implicit_wgrad_transform(k, q)
        p = GemmProblem(**q["problem"])
        nb = 1 if p.batch else 0
        z, one = [0] * nb, [1] * nb
        za, onea = ([], []) if p.shared_a else (z, one)   # A's ops have no batch dim when shared
        w = SequenceWriter()

        def part(name: str, op: str | None = None, typed: bool = False) -> str:
            h = w.fresh(name.replace("_", ""))
            ty = f'!transform.op<"{op}">' if typed else ANY
            ops = f'ops{{["{op}"]}} ' if op else ""
            w(f'{h} = transform.structured.match {ops}attributes {{neuron.kernel = {k.id} : i64, '
              f'neuron.part = "{name}"}} in %root : ({ANY}) -> {ty}')
            return h

        for r in regions(p.m, p.n, q):
            i = r.idx
            mct = max(1, min(r.m1, q["MC"] // r.mr if r.m1 > 1 else 1))
            nct = max(1, min(r.n1, q["NC"] // r.nr if r.n1 > 1 else 1))
            if mct >= r.m1 and nct >= r.n1 and not p.batch:
                # one block: canonicalization folds a one-iteration forall away, and with it the
                # nest GEMM_CLEANUP vectorizes (an N edge of nn.Linear with M <= 256 ran as scalar
                # loops with an accumulator malloc per micro-tile); two blocks or more keep it
                if r.n1 > 1:
                    nct = _largest_divisor(r.n1, r.n1 // 2)
                elif r.m1 > 1:
                    mct = _largest_divisor(r.m1, r.m1 // 2)
            mm, init = part(f"gemm_r{i}", "linalg.generic"), part(f"init_r{i}")
            t0, forall = w.tile_forall(mm, one + [mct, nct, 0, 0, 0])
            w.annotate(forall, "neuron.root", k.id)
            w.annotate(forall, "neuron.gemm", 1)
            fused_init, forall = w.fuse(init, forall)
            if q["fuse_pack_b"] and r.b_packed:
                # GotoBLAS: each (NC x KC) block of B is packed right before use, into L2
                pkf, forall = w.fuse(part(f"packB_r{i}", "linalg.pack"), forall)
            tk, (kloop,) = w.tile_for(t0, z + [0, 0, q["KC"], 0, 0])
            if q["fuse_pack_b"] and r.b_packed:
                pkk, _ = w.fuse(pkf, kloop)
                tile, _ = w.tile_for(pkk, z + [1, 8 if q["KC"] % 8 == 0 else 1])
                w.vectorize(tile)  # a linalg.pack does not bufferize: it must become vector ops here
            tn, _ = w.tile_for(tk, z + [0, 1, 0, 0, 0])   # one B micro-panel (stays in L1)
            tm, _ = w.tile_for(tn, z + [1, 0, 0, 0, 0])   # one A panel (streams from L2)
            parts = [w.fresh(x) for x in ("rf", "rs", "rc", "rl")]
            w(f"{', '.join(parts)} = transform.structured.tile_reduction_using_for {tm} by tile_sizes = "
              f"{z + [0, 0, 1, 0, 0]} : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})")
            w.tile_for(fused_init, z + [1, 0, 1, 0])
        if q.get("transpose_a"):
            tr = part("transA", "linalg.generic")
            ft, fl = w.tile_forall(tr, onea + [q["transpose_forall"], 0])
            w.annotate(fl, "neuron.root", k.id)
            w.annotate(fl, "neuron.gemm", 1)
            w.tile_for(ft, za + q["transpose_tile"])
        kt = 8 if p.k % 8 == 0 else 1
        for side in ("a", "b"):
            if not q[f"pack_{side}"] or (side == "b" and q["fuse_pack_b"]):
                continue
            if (p.m if side == "a" else p.n) // q["MR" if side == "a" else "NR"] == 0:
                continue
            # a pack is a pad (none here), an expand_shape and a transpose: tile the transpose
            pk = part(f"pack{side.upper()}", "linalg.pack", typed=True)
            pad, exp, tr = w.fresh("pad"), w.fresh("exp"), w.fresh("tr")
            w(f'{pad}, {exp}, {tr} = transform.structured.lower_pack {pk} : (!transform.op<"linalg.pack">) -> '
              f'(!transform.op<"tensor.pad">, !transform.op<"tensor.expand_shape">, !transform.op<"linalg.transpose">)')
            trc = w.fresh("trc")
            w(f"{trc} = transform.cast {tr} : !transform.op<\"linalg.transpose\"> to {ANY}")
            oa, za_ = (onea, za) if side == "a" else (one, z)
            ft, fl = w.tile_forall(trc, oa + [q[f"pack_forall_{side}"], 0, 0])
            w.annotate(fl, "neuron.root", k.id)
            w.annotate(fl, "neuron.gemm", 1)
            w.tile_for(ft, za_ + [q[f"pack_tile_{side}"], kt, 0])
        return w.text()


def _implicit_conv_transform(k: KernelInfo, q: Mapping[str, Any]) -> str:
    """The schedule of an implicit-GEMM convolution (:mod:`lowering.implicit_gemm`): the GEMM's,
    with K as three loop dims (c, kh, kw). A k-block takes ``kc_c`` channels and every kernel
    offset; the windowed B pack is fused into it, tiled to rows of NR and vectorized there (unit
    dims folded first: the window is then a plain row; vectorized before any canonicalization,
    which would fold the copy into slices that lower to scalar copies)."""
    w = SequenceWriter()

    def part(name: str) -> str:
        h = w.fresh(name.replace("_", ""))
        w(f'{h} = transform.structured.match attributes {{neuron.kernel = {k.id} : i64, neuron.part = "{name}"}} '
          f"in %root : ({ANY}) -> {ANY}")
        return h
    p = GemmProblem(**q["problem"])
    m1, n1 = p.m // q["MR"], p.n // q["NR"]
    nct = max(1, min(n1, q["NC"] // q["NR"]))
    lead = 1 if q["conv"].get("groups", 1) > 1 else 0   # a grouped convolution's group loop, after b
    zero, one = [0] * lead, [1] * lead
    mm, init = part("gemm_r0"), part("init_r0")
    # loops: (b, [g,] m1, n1, c, kh, kw, m0, n0); one M block per image (and group), N in NC blocks
    t0, forall = w.tile_forall(mm, [1, *one, m1, nct, 0, 0, 0, 0, 0])
    w.annotate(forall, "neuron.root", k.id)
    w.annotate(forall, "neuron.gemm", 1)
    fused_init, forall = w.fuse(init, forall)
    if q["pack_b"]:
        pkf, forall = w.fuse(part("packB_r0"), forall)
    tk, (kloop,) = w.tile_for(t0, [0, *zero, 0, 0, q["conv"]["kc_c"], 0, 0, 0, 0])
    if q["pack_b"]:
        pkk, _ = w.fuse(pkf, kloop)
        _, rows = w.tile_for(pkk, [0, *zero, 1, 1, 1, 1, 0])     # pack: (b, [g,] n1, c, kh, kw, n0) in rows of NR
        w(f"transform.apply_patterns to {rows[-1]} "
          f"{{ transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices }} : {ANY}")
        row = w.fresh("prow")
        w(f"{row} = transform.structured.match interface{{LinalgOp}} in {rows[-1]} : ({ANY}) -> {ANY}")
        w.vectorize(row)
    tn, _ = w.tile_for(tk, [0, *zero, 0, 1, 0, 0, 0, 0, 0])   # one B micro-panel
    tm, _ = w.tile_for(tn, [0, *zero, 1, 0, 0, 0, 0, 0, 0])   # one A panel
    parts = [w.fresh(x) for x in ("rf", "rs", "rc", "rl")]
    w(f"{', '.join(parts)} = transform.structured.tile_reduction_using_for {tm} by tile_sizes = "
      f"{[0, *zero, 0, 0, 1, 1, 1, 0, 0]} : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})")
    w.tile_for(fused_init, [0, *zero, 1, 0, 1, 0])
    return w.text()


def _implicit_wgrad_transform(k: KernelInfo, q: Mapping[str, Any]) -> str:
    """The schedule of an implicit-GEMM weight gradient (:func:`lowering.implicit_gemm.weight_grad`):
    loops (m1, n1, image, p, kh, kw, m0, n0). The forall takes (channel, output-channel) blocks,
    the k-blocks (image, KC grid positions) pack the gradient's B panels once for every kernel
    offset, and the offsets are loops just outside the micro-kernel (unrolled by LLVM like a k
    loop); each micro-kernel reads its window of the input in place as an unpacked A."""
    w = SequenceWriter()

    def part(name: str, op: str | None = None) -> str:
        h = w.fresh(name.replace("_", ""))
        ops = f'ops{{["{op}"]}} ' if op else ""
        w(f'{h} = transform.structured.match {ops}attributes {{neuron.kernel = {k.id} : i64, neuron.part = "{name}"}} '
          f"in %root : ({ANY}) -> {ANY}")
        return h
    p = GemmProblem(**q["problem"])
    m1, n1 = p.m // q["MR"], p.n // q["NR"]
    # two blocks at least where the channels allow (threads), else one
    mct = m1 // 2 if m1 % 2 == 0 and m1 > 1 else 1
    lead = 1 if q["conv_wgrad"].get("groups", 1) > 1 else 0   # a grouped convolution's group loop, first
    zero, one = [0] * lead, [1] * lead
    mm, init = part("gemm_r0", "linalg.generic"), part("init_r0")
    t0, forall = w.tile_forall(mm, [*one, mct, n1, 0, 0, 0, 0, 0, 0])
    w.annotate(forall, "neuron.root", k.id)
    w.annotate(forall, "neuron.gemm", 1)
    fused_init, forall = w.fuse(init, forall)
    pkf, forall = w.fuse(part("packB_r0", "linalg.pack"), forall)
    tk, (_, ploop) = w.tile_for(t0, [*zero, 0, 0, 1, q["KC"], 0, 0, 0, 0])
    pkk, _ = w.fuse(pkf, ploop)
    tile, _ = w.tile_for(pkk, [0, *one, 1, 8 if q["KC"] % 8 == 0 else 1])
    w.vectorize(tile)   # a linalg.pack does not bufferize: it must become vector ops here
    tn, _ = w.tile_for(tk, [*zero, 0, 1, 0, 0, 0, 0, 0, 0])
    tm, _ = w.tile_for(tn, [*zero, 1, 0, 0, 0, 0, 0, 0, 0])
    to, _ = w.tile_for(tm, [*zero, 0, 0, 0, 0, 1, 1, 0, 0])   # kernel offsets around the micro-kernel
    parts = [w.fresh(x) for x in ("rf", "rs", "rc", "rl")]
    w(f"{', '.join(parts)} = transform.structured.tile_reduction_using_for {to} by tile_sizes = "
      f"{[*zero, 0, 0, 0, 1, 0, 0, 0, 0]} : ({ANY}) -> ({ANY}, {ANY}, {ANY}, {ANY})")
    w.tile_for(fused_init, [*one, 1, 1, 1, 0, 1, 0])
    return w.text()
