"""The small runtime linked into every kernel library, and binding it to the process at load time.

Kernel libraries must not depend on which C runtime or OpenMP library the host has, so everything
generated code calls besides libc/libm is defined here and compiled with the host's ``cc``:

- ``memrefCopy``: MLIR lowers ``memref.copy`` between non-identity layouts to this call, which
  upstream ships in ``libmlir_c_runner_utils.so`` (it drags in libMLIR and libLLVM: ~40 ms to load).
  Same contract as ``mlir/lib/ExecutionEngine/CRunnerUtils.cpp``, so a kernel.so loads alone.
- The OpenMP entry points MLIR's ``convert-scf-to-openmp`` + OpenMPIRBuilder emit
  (``__kmpc_fork_call``, ``__kmpc_for_static_init_*``, ``__kmpc_barrier``, ...; LLVM's
  ``openmp/runtime/src/kmp_csupport.cpp`` and ``kmp_sched.cpp`` define them), implemented on top of
  the GNU OpenMP runtime that torch itself uses (``GOMP_parallel``, libgomp's documented ABI). So
  a kernel's parallel loops run on torch's own thread pool: one OpenMP runtime in the process, no
  second pool spinning against it, and the thread count is ``torch.get_num_threads()`` (the
  calling thread's ``omp_set_num_threads`` value) at call time. Without libgomp in the process the
  loops run on the calling thread.
- ``memref.alloc``'s allocation functions (``finalize-memref-to-llvm{use-generic-functions}``):
  malloc with a small cache of freed large blocks, so temporaries do not cost page faults on every
  call.
- ``__truncsfbf2`` (float32 → bfloat16), the compiler-rt helper LLVM calls when it legalizes
  bfloat16 arithmetic that opt itself creates (``fabs(fpext(x))`` becomes ``fpext(fabs.bf16(x))``):
  GCC 12's libgcc lacks it (GCC 13 added it), so a kernel linked against it would load on one host
  and not another. The generated code itself rounds to bfloat16 in integer ops (``lowering/scalar.py``).
- The profile counters (:mod:`neuron_compile.profile`), linked only into profiled libraries.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any, Sequence

from neuron_compile.toolchain import run_stage, tool

# Linked into a kernel library, the runtime's entry points are hidden (each library has its own
# copy); built as a shared library for the JIT (NEURON_EXPORT_ALL), they are exported.
PRELUDE_C = r"""
#ifdef NEURON_EXPORT_ALL
#define HIDDEN
#else
#define HIDDEN __attribute__((visibility("hidden")))
#endif
"""

MEMREF_COPY_C = r"""
#include <stdint.h>
#include <string.h>
typedef struct { int64_t rank; void *descriptor; } UnrankedMemRef;
HIDDEN void memrefCopy(int64_t elem, UnrankedMemRef *src, UnrankedMemRef *dst) {
  int64_t rank = src->rank;
  int64_t *s = (int64_t *)src->descriptor, *d = (int64_t *)dst->descriptor;
  char *sp = (char *)s[1], *dp = (char *)d[1];
  int64_t so = s[2], dof = d[2];
  int64_t *sizes = s + 3, *ss = s + 3 + rank, *ds = d + 3 + rank;
  if (rank == 0) { memcpy(dp + dof * elem, sp + so * elem, elem); return; }
  for (int64_t i = 0; i < rank; i++) if (sizes[i] == 0) return;
  int64_t idx[rank];
  memset(idx, 0, sizeof idx);
  for (;;) {
    memcpy(dp + dof * elem, sp + so * elem, elem);
    int64_t ax = rank - 1;
    for (; ax >= 0; ax--) {
      idx[ax]++; so += ss[ax]; dof += ds[ax];
      if (idx[ax] < sizes[ax]) break;
      so -= ss[ax] * sizes[ax]; dof -= ds[ax] * sizes[ax]; idx[ax] = 0;
    }
    if (ax < 0) return;
  }
}
"""

# compiler-rt's contract (lib/builtins/truncsfbf2.c): round to nearest even, a NaN stays a quiet
# NaN with its sign and top payload bits. bfloat16 is returned in xmm0's low 16 bits, as _Float16.
FLOAT_CONVERSIONS_C = r"""
#include <stdint.h>
#include <string.h>
HIDDEN _Float16 __truncsfbf2(float f) {
  uint32_t b;
  union { uint16_t u; _Float16 h; } r;
  memcpy(&b, &f, sizeof b);
  if ((b & 0x7fffffffu) > 0x7f800000u) r.u = (uint16_t)((b >> 16) | 0x40u);
  else r.u = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  return r.h;
}
"""

OPENMP_C = r"""
#include <stdarg.h>
#include <stdint.h>
typedef void (*kmpc_micro)(int32_t *, int32_t *, ...);
static void (*gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static void (*gomp_barrier)(void);
static int (*omp_thread_num)(void);
static int (*omp_num_threads)(void);

/* Called by the loader with libgomp's entry points (all or none). */
void neuron_runtime_bind_openmp(void *parallel, void *barrier, void *thread_num, void *num_threads) {
  gomp_parallel = parallel; gomp_barrier = barrier; omp_thread_num = thread_num; omp_num_threads = num_threads;
}

static int32_t tid(void) { return omp_thread_num ? omp_thread_num() : 0; }
static int32_t nth(void) { return omp_num_threads ? omp_num_threads() : 1; }

#define MAX_ARGS 16
struct fork { kmpc_micro fn; int32_t argc; void *argv[MAX_ARGS]; };

static void run_microtask(void *p) {
  struct fork *f = p;
  int32_t gtid = tid(), btid = gtid;
  void **a = f->argv;
  switch (f->argc) {
    case 0: f->fn(&gtid, &btid); break;
    case 1: f->fn(&gtid, &btid, a[0]); break;
    case 2: f->fn(&gtid, &btid, a[0], a[1]); break;
    case 3: f->fn(&gtid, &btid, a[0], a[1], a[2]); break;
    case 4: f->fn(&gtid, &btid, a[0], a[1], a[2], a[3]); break;
    case 5: f->fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4]); break;
    case 6: f->fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5]); break;
    case 7: f->fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6]); break;
    default: f->fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                   a[12], a[13], a[14], a[15]); break;
  }
}

HIDDEN void __kmpc_fork_call(void *loc, int32_t argc, kmpc_micro fn, ...) {
  struct fork f = {fn, argc, {0}};
  va_list ap;
  va_start(ap, fn);
  for (int32_t i = 0; i < argc && i < MAX_ARGS; i++) f.argv[i] = va_arg(ap, void *);
  va_end(ap);
  if (gomp_parallel) gomp_parallel(run_microtask, &f, 0, 0);  /* 0: the caller's omp_get_max_threads() */
  else run_microtask(&f);
}

HIDDEN int32_t __kmpc_global_thread_num(void *loc) { return tid(); }
HIDDEN void __kmpc_barrier(void *loc, int32_t gtid) { if (gomp_barrier && nth() > 1) gomp_barrier(); }
HIDDEN void __kmpc_for_static_fini(void *loc, int32_t gtid) {}

/* kmp_sch_static (34), balanced: thread t of n gets iterations [lo, hi] (inclusive); a thread with
   none gets hi == lo - incr, so the generated trip count (hi - lo) / incr + 1 is zero. */
#define STATIC_INIT(NAME, T)                                                                        \
  HIDDEN void NAME(void *loc, int32_t gtid, int32_t sched, int32_t *plast, T *plo, T *phi, T *pstride, \
                   T incr, T chunk) {                                                               \
    T lo = *plo, hi = *phi;                                                                         \
    uint64_t trips = (uint64_t)((hi - lo) / incr) + 1;                                              \
    uint64_t n = (uint64_t)nth(), t = (uint64_t)tid();                                              \
    uint64_t small = trips / n, extra = trips % n;                                                  \
    uint64_t first = t * small + (t < extra ? t : extra), count = small + (t < extra ? 1 : 0);     \
    *plo = lo + (T)first * incr;                                                                    \
    *phi = *plo + ((T)count - 1) * incr;                                                            \
    *pstride = (T)trips * incr;                                                                     \
    if (plast) *plast = count > 0 && first + count == trips;                                        \
  }
STATIC_INIT(__kmpc_for_static_init_4, int32_t)
STATIC_INIT(__kmpc_for_static_init_4u, uint32_t)
STATIC_INIT(__kmpc_for_static_init_8, int64_t)
STATIC_INIT(__kmpc_for_static_init_8u, uint64_t)
"""

ALLOC_C = r"""
#include <stdint.h>
#include <stdlib.h>
/* Every block carries its size and header length in the 16 bytes before it. Freed blocks of at
   least CACHE_MIN bytes are kept (up to CACHE_SLOTS of them) and handed out again for the same
   size: a graph allocates the same temporaries in the same order on every call, so after the first
   call no temporary costs an mmap and first-touch page faults (16 MB cost ~4-5 ms per call here).
   Up to CACHE_SLOTS blocks and CACHE_BYTES in all: with 64 slots a UNet's backward graph (more
   large temporaries than that) faulted its pages in again on every call, 24 ms of a 98 ms graph
   (AMD Zen 4, 1 thread); a block that does not fit is freed. */
#define CACHE_SLOTS 1024
#define CACHE_MIN (64u << 10)
#define CACHE_BYTES (1ull << 30)
static struct { char *raw; uint64_t size, header; } cache[CACHE_SLOTS];
static uint64_t cached_bytes;
static char lock;
static void acquire(void) { while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) { } }
static void release(void) { __atomic_clear(&lock, __ATOMIC_RELEASE); }

HIDDEN void *_mlir_memref_to_llvm_aligned_alloc(uint64_t align, uint64_t size) {
  uint64_t header = align > 64 ? align : 64;
  char *raw = 0;
  if (size >= CACHE_MIN) {
    acquire();
    for (int i = 0; i < CACHE_SLOTS; i++)
      if (cache[i].raw && cache[i].size == size && cache[i].header == header) {
        raw = cache[i].raw; cache[i].raw = 0; cached_bytes -= size; break;
      }
    release();
  }
  if (!raw) {
    uint64_t total = (header + size + header - 1) / header * header;
    raw = aligned_alloc(header, total);
    if (!raw) return 0;
  }
  uint64_t *meta = (uint64_t *)(raw + header);
  meta[-1] = header; meta[-2] = size;
  return raw + header;
}

HIDDEN void *_mlir_memref_to_llvm_alloc(uint64_t size) { return _mlir_memref_to_llvm_aligned_alloc(16, size); }

HIDDEN void _mlir_memref_to_llvm_free(void *p) {
  if (!p) return;
  uint64_t header = ((uint64_t *)p)[-1], size = ((uint64_t *)p)[-2];
  char *raw = (char *)p - header;
  if (size >= CACHE_MIN) {
    acquire();
    if (cached_bytes + size <= CACHE_BYTES)
      for (int i = 0; i < CACHE_SLOTS; i++)
        if (!cache[i].raw) {
          cache[i].raw = raw; cache[i].size = size; cache[i].header = header; cached_bytes += size; raw = 0;
          break;
        }
    release();
  }
  free(raw);
}

/* Called when the executable is dropped: give the cached blocks back. */
void neuron_runtime_trim(void) {
  acquire();
  for (int i = 0; i < CACHE_SLOTS; i++) { free(cache[i].raw); cache[i].raw = 0; }
  cached_bytes = 0;
  release();
}
"""

RUNTIME_C = PRELUDE_C + MEMREF_COPY_C + FLOAT_CONVERSIONS_C + OPENMP_C + ALLOC_C


@functools.lru_cache(maxsize=None)
def runtime_object(name: str) -> Path:
    """A piece of the kernel runtime compiled once per process: ``runtime`` (``memrefCopy`` and
    the OpenMP entry points) is linked into every kernel library, ``profile``
    (:mod:`neuron_compile.profile`) into profiled ones."""
    import atexit
    import shutil
    import tempfile

    from neuron_compile.profile import PROFILE_C
    d = Path(tempfile.mkdtemp(prefix="neuron-runtime-"))
    atexit.register(shutil.rmtree, d, True)
    src, obj = d / f"{name}.c", d / f"{name}.o"
    src.write_text({"runtime": RUNTIME_C, "profile": PROFILE_C}[name])
    run_stage("obj", [tool("cc"), "-O2", "-fPIC", "-c", str(src), "-o", str(obj)], src, 120)
    return obj


ENTRY_SYMBOL = "neuron_entry"


def entry_source(kernel_symbol: str, specs: Sequence[Any]) -> str:
    """C source of ``void neuron_entry(void **data)``: builds each memref descriptor (MLIR's
    "LLVM IR target" calling convention: allocated, aligned, offset, sizes, strides) on the stack
    from the static shapes and strides in ``specs`` and the data pointers the caller passes, and
    calls ``_mlir_ciface_<kernel_symbol>``. One foreign call per graph with one argument, instead
    of one ctypes struct and argument conversion per tensor; reentrant (nothing shared)."""
    decls, args = [], []
    for i, s in enumerate(specs):
        rank = len(s.shape)
        dims = (f", {{{', '.join(map(str, s.shape))}}}, {{{', '.join(map(str, s.stride))}}}" if rank else "")
        fields = f" int64_t sizes[{rank}], strides[{rank}];" if rank else ""
        decls.append(f"  struct {{ void *allocated, *aligned; int64_t offset;{fields} }} d{i} = "
                     f"{{data[{i}], data[{i}], 0{dims}}};")
        args.append(f"&d{i}")
    proto = ", ".join(["void *"] * len(specs)) or "void"
    return (f"#include <stdint.h>\nextern void _mlir_ciface_{kernel_symbol}({proto});\n"
            f"void {ENTRY_SYMBOL}(void **data) {{\n" + "\n".join(decls)
            + f"\n  _mlir_ciface_{kernel_symbol}({', '.join(args)});\n}}\n")


def entry_frame_bytes(specs: Sequence[Any]) -> int:
    """Bytes of stack a call into the graph's code uses before any kernel runs, for ``specs`` (every
    memref the call passes): the entry point's descriptors (:func:`entry_source`; 8·(3 + 2·rank)
    bytes each) and its pointer arguments, counted twice for the C wrapper the graph's function is
    inlined into, which reads every descriptor field. GCC 12 puts 208 KB in ``neuron_entry``'s
    frame for 2,000 memrefs of rank 4, at -O0 as at -O2 (``-fstack-usage``)."""
    return 2 * sum(8 * (3 + 2 * len(s.shape)) + 8 for s in specs)


@functools.lru_cache(maxsize=1)
def runtime_shared_library() -> Path:
    """The runtime as a shared library with every entry point exported, for code JIT-compiled in
    this process (``load_executable(mode="jit")``), which links against no object."""
    obj = runtime_object("runtime")
    src = obj.with_name("runtime_shared.c")
    src.write_text(RUNTIME_C)
    so = obj.with_name("libneuron_runtime.so")
    run_stage("obj", [tool("cc"), "-O2", "-fPIC", "-shared", "-DNEURON_EXPORT_ALL", str(src), "-o", str(so)], src, 120)
    bind(ctypes.CDLL(str(so)))
    return so


@functools.lru_cache(maxsize=1)
def _libgomp() -> tuple[int, int, int, int] | None:
    """Addresses of ``GOMP_parallel``, ``GOMP_barrier``, ``omp_get_thread_num`` and
    ``omp_get_num_threads`` in torch's own OpenMP runtime (:func:`_torch_openmp`), or ``None``."""
    lib = _torch_openmp()
    if lib is None:
        return None
    names = ("GOMP_parallel", "GOMP_barrier", "omp_get_thread_num", "omp_get_num_threads")
    try:
        return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)  # type: ignore[return-value]
    except AttributeError:
        return None


def set_thread_count(n: int) -> None:
    """The calling thread's OpenMP thread count, which the kernels' parallel loops read
    (``omp_set_num_threads``: a per-thread setting), without ``torch.set_num_threads``'s other
    effect, the default of threads started later; ``torch.set_num_threads`` without torch's runtime."""
    import torch
    fn = getattr(_torch_openmp(), "omp_set_num_threads", None)
    if fn is None:
        torch.set_num_threads(n)
    else:
        fn(ctypes.c_int(n))


@functools.lru_cache(maxsize=1)
def _torch_openmp() -> Any:
    """Torch's own OpenMP runtime library, or ``None``.

    Looked up through ``libtorch_cpu``'s handle (``dlsym`` on a handle searches the library's
    dependencies, so this is the libgomp torch was linked against), not by name among the mapped
    libraries: another package may load a second libgomp (scikit-learn's wheel bundles one), whose
    thread count ``torch.set_num_threads`` does not set. Binding to that one ran every parallel
    loop of the digits example on a second 2-thread team spinning against torch's pool (a
    32x128x64 matmul 6 ms instead of microseconds, the training step 36x eager's)."""
    import torch  # noqa: F401  (loads torch's OpenMP runtime)
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    mapped = sorted({ln.split()[-1] for ln in maps.splitlines() if ln.split()[-1].startswith("/")})
    owners = [p for p in mapped if Path(p).name.startswith("libtorch_cpu.")]
    gomps = [p for p in mapped if "libgomp" in Path(p).name]
    if owners:
        return ctypes.CDLL(owners[0])  # already mapped: dlopen hands back the same library
    if len(gomps) == 1:
        return ctypes.CDLL(gomps[0])
    return None  # no torch library to ask, and none or several OpenMP runtimes: run loops serially


def bind(library: Any) -> None:
    """Connect a freshly loaded kernel library to this process's OpenMP runtime (if any)."""
    fn = getattr(library, "neuron_runtime_bind_openmp", None)
    gomp = _libgomp()
    if fn is not None and gomp is not None:
        fn.restype = None
        fn(*[ctypes.c_void_p(a) for a in gomp])
