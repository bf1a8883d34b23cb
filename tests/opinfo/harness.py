"""Run PyTorch's OpInfo samples through ``backend="neuron"`` and classify each against eager.

One *case* is an (OpInfo, dtype) pair; it runs some of the OpInfo's CPU sample inputs. Each sample
is compiled with ``torch.compile(fn, backend="neuron", fullgraph=True, dynamic=False)`` and compared
with eager PyTorch on the same inputs (cloned, same RNG seed). A sample's outcome is one of:

- ``pass``: the compiled result equals eager within the OpInfo's tolerances;
- ``unsupported``: compilation raised :class:`~neuron_compile.errors.UnsupportedOpsError`, a clean
  refusal naming the ATen ops without a lowering rule;
- ``dynamo``: Dynamo refused to capture the call under ``fullgraph=True`` (a graph break, or an
  internal Dynamo error); our backend was never called;
- ``wrong`` (a result differs from eager), ``crash`` (any other error) or ``hang`` (a sample ran
  longer than :data:`SAMPLE_TIMEOUT_S`): never acceptable.

This mirrors how PyTorch tests Inductor (``test/inductor/test_torchinductor_opinfo.py``).
"""
from __future__ import annotations

import signal
import zlib
from dataclasses import dataclass, field

import pytest
import torch
import torch.testing._internal.common_methods_invocations as _cmi
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_device_type import toleranceOverride
from torch.utils._pytree import tree_leaves, tree_map

from neuron_compile.errors import NeuronCompileError, UnsupportedOpsError



def _call_unseeded(op, *args, **kwargs):
    """Stand-in for OpInfo's ``wrapper_set_seed``, which wraps random ops (dropout, ``rand_like``,
    multi-head attention, ...) in ``torch.manual_seed(42)`` under ``freeze_rng_state`` so two eager
    calls agree. Dynamo cannot trace that RNG-state save/restore, so, as PyTorch's Inductor OpInfo
    test does (``test/inductor/test_torchinductor_opinfo.py`` replaces the same global), we call
    the op directly; :func:`run_sample` seeds the generator identically before the eager and the
    compiled call instead."""
    return op(*args, **kwargs)


_cmi.wrapper_set_seed = _call_unseeded  # the OpInfo lambdas look the name up in this module

F32, I64, BOOL, F16, BF16 = torch.float32, torch.int64, torch.bool, torch.float16, torch.bfloat16
DTYPES = (F32, I64, BOOL, F16, BF16)
# floating dtypes whose results may also pass by being as close to eager-at-float64 as eager's own
LOW_PRECISION = (F32, F16, BF16)
SAMPLE_TIMEOUT_S = 300
OUTCOMES = ("pass", "unsupported", "dynamo", "wrong", "crash", "hang")
# How far a case's outcome is from a pass: a case's outcome is its worst sample's.
SEVERITY = {"pass": 0, "unsupported": 1, "dynamo": 2}



def op_id(op) -> str:
    """``name`` or ``name.variant`` (the OpInfo's unique name in ``op_db``)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


_BY_ID = {op_id(op): op for op in op_db}


def op_db_by_id(name: str):
    """The OpInfo whose :func:`op_id` is ``name`` (``KeyError`` when op_db has none)."""
    return _BY_ID[name]


def op(name: str, variant: str = ""):
    """The OpInfo object named ``name`` (and ``variant``). Raises ``KeyError`` when op_db has none,
    so a stale expectation fails loudly instead of silently matching nothing."""
    return _BY_ID[f"{name}.{variant}" if variant else name]


def _definition_families() -> dict[int, str]:
    from torch.testing._internal.opinfo.definitions import fft, linalg, signal as sig, special
    out = {}
    for fam, mod in (("linalg", linalg), ("special", special), ("fft", fft), ("signal", sig)):
        out.update({id(o): fam for o in mod.op_db})
    return out


_FAMILY = _definition_families()
_CLASS_FAMILY = {"UnaryUfuncInfo": "unary", "BinaryUfuncInfo": "binary", "ReductionOpInfo": "reduction",
                 "ShapeFuncInfo": "shape", "SpectralFuncInfo": "fft"}


def family(opinfo) -> str:
    """A coarse family for the coverage table: the op_db module it comes from (linalg, special,
    fft, signal), ``masked.*``/``nn.functional.*`` by name, else the OpInfo class (unary, binary,
    reduction, shape), else ``other``."""
    if id(opinfo) in _FAMILY:
        return _FAMILY[id(opinfo)]
    for prefix in ("masked.", "nn.functional.", "linalg.", "special.", "fft."):
        if opinfo.name.startswith(prefix):
            return prefix[:-1]
    return _CLASS_FAMILY.get(type(opinfo).__name__, "other")


def cases(dtypes=DTYPES) -> list[tuple[object, torch.dtype]]:
    """Every (OpInfo, dtype) whose op supports ``dtype`` on CPU, in op_db order."""
    return [(o, d) for o in op_db for d in dtypes if d in o.supported_dtypes("cpu")]


def in_ci_sample(opinfo, dtype) -> bool:
    """The deterministic CI subset: every float32 case, int64/bool for a third of the ops, and
    float16/bfloat16 each for a disjoint eighth of the ops (chosen by a CRC of the op's name, so the
    subset never changes between runs; every dtype path of the lowering is exercised, and CI stays
    within its time budget on 2 cores)."""
    crc = zlib.crc32(op_id(opinfo).encode())
    if dtype == F32:
        return True
    if dtype in (F16, BF16):
        return crc % 8 == (1 if dtype == F16 else 2)
    return crc % 3 == 0


@dataclass(frozen=True)
class OpShare:
    """``--opinfo-part K/N``: the ops whose name's CRC is ``K`` modulo ``N`` (the N parts are disjoint
    and cover every op; the newest-torch stage of ``.ci/run`` sweeps one part)."""
    k: int
    n: int

    @classmethod
    def parse(cls, text: str) -> "OpShare":
        try:
            k, n = (int(v) for v in text.split("/"))
        except ValueError:
            raise pytest.UsageError(f"--opinfo-part takes K/N (two integers), got {text!r}") from None
        if not 0 <= k < n:
            raise pytest.UsageError(f"--opinfo-part K/N needs 0 <= K < N, got {text!r}")
        return cls(k, n)

    def holds(self, opinfo) -> bool:
        return zlib.crc32(op_id(opinfo).encode()) % self.n == self.k


def tolerances(opinfo, dtype) -> tuple[float | None, float | None]:
    """(rtol, atol): the largest ``toleranceOverride`` the OpInfo declares for ``dtype`` over its
    decorators, never below ``assert_close``'s defaults for ``dtype``; ``(None, None)`` (so
    ``assert_close`` picks its defaults per *result* dtype) when it declares none."""
    from torch.testing._comparison import default_tolerances
    found = [dec.d[dtype] for info in opinfo.decorators for dec in getattr(info, "decorators", [info])
             if isinstance(dec, toleranceOverride) and dtype in dec.d]
    if not found:
        return None, None
    rtol, atol = default_tolerances(dtype)
    return max([rtol] + [t.rtol for t in found]), max([atol] + [t.atol for t in found])


@dataclass
class SampleResult:
    """The outcome of one sample and, for anything but a pass, a one-line reason."""
    outcome: str
    detail: str = ""


@dataclass
class CaseResult:
    """Outcomes of the samples one case ran, and whether those were all of its samples."""
    samples: list[SampleResult] = field(default_factory=list)
    complete: bool = True

    def counts(self) -> dict[str, int]:
        return {k: sum(s.outcome == k for s in self.samples) for k in OUTCOMES}

    def outcome(self) -> str:
        """The worst acceptable outcome over the samples (``pass`` when there were none)."""
        ok = [s.outcome for s in self.samples if s.outcome in SEVERITY]
        return max(ok, key=SEVERITY.__getitem__, default="pass")

    def failures(self) -> list[str]:
        return [f"sample {i}: {s.outcome}: {s.detail}" for i, s in enumerate(self.samples)
                if s.outcome not in SEVERITY]


def _clone(x):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__


def classify(e: BaseException) -> SampleResult:
    """Map an exception from a compiled call to ``unsupported``, ``dynamo`` or ``crash``."""
    from torch._dynamo.exc import BackendCompilerFailed, InternalTorchDynamoError, Unsupported, UserError
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    chain = list(_chain(e))
    for inner in chain:
        if isinstance(inner, UnsupportedOpsError):
            return SampleResult("unsupported", ",".join(sorted({u.op for u in inner.ops})))
    if not isinstance(e, BackendCompilerFailed) and isinstance(
            e, (Unsupported, UserError, GuardOnDataDependentSymNode, InternalTorchDynamoError)):
        return SampleResult("dynamo", _one_line(e))
    inner = next((x for x in chain if isinstance(x, NeuronCompileError)), chain[-1])
    return SampleResult("crash", _one_line(inner))


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_sample(opinfo, dtype, sample) -> SampleResult | None:
    """Compile and run one sample; compare with eager. ``None`` when eager itself raises."""
    args, kwargs = (sample.input, *sample.args), sample.kwargs
    fn = opinfo.op

    def call(*a, **k):
        return fn(*a, **k)

    try:
        torch.manual_seed(0)
        expected = call(*_clone(args), **_clone(kwargs))
    except Exception:
        return None
    torch._dynamo.reset()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SAMPLE_TIMEOUT_S)
    try:
        compiled = torch.compile(call, backend="neuron", fullgraph=True, dynamic=False)
        torch.manual_seed(0)
        got = compiled(*_clone(args), **_clone(kwargs))
    except _Timeout:
        return SampleResult("hang", f"no result after {SAMPLE_TIMEOUT_S} s")
    except Exception as e:  # noqa: BLE001 - every failure is classified, none is hidden
        return classify(e)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return compare(opinfo, dtype, got, expected, sample)


# Ops returning (values, indices) whose index among equal values is unspecified (ATen's CPU kernels
# use partial sorts and quickselect; ``sort`` without ``stable=True`` does not promise an order of
# equal elements): position of ``dim`` in (args after the input), its default.
TIE_INDEX_DIM = {"topk": (1, -1), "kthvalue": (1, -1), "median": (0, None), "nanmedian": (0, None),
                 "mode": (0, -1), "sort": (0, -1), "argsort": (0, -1)}


def _indices_point_at_values(opinfo, sample, got, expected, rtol, atol) -> bool:
    """For :data:`TIE_INDEX_DIM` ops: values equal eager's and the indices select those values."""
    if opinfo.name not in TIE_INDEX_DIM or sample.kwargs.get("stable"):
        return False
    pos, default = TIE_INDEX_DIM[opinfo.name]
    dim = sample.args[pos] if len(sample.args) > pos else sample.kwargs.get("dim", default)
    if dim is None:
        return False
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.dtype == torch.int64:
        # argsort: the indices must order the input exactly as eager's do
        x = sample.input
        picked = (x.gather(dim, got), x.gather(dim, expected)) if x.dim() > 0 else (x, x)
        torch.testing.assert_close(*picked, rtol=0, atol=0, equal_nan=True)
        return True
    if not isinstance(got, tuple) or len(got) != 2:
        return False
    torch.testing.assert_close(got[0], expected[0], rtol=rtol, atol=atol, equal_nan=True)
    x, (values, indices) = sample.input, got
    if not sample.kwargs.get("keepdim", False) and x.dim() > 0 and values.dim() < x.dim():
        values, indices = values.unsqueeze(dim), indices.unsqueeze(dim)
    picked = x.gather(dim, indices) if x.dim() > 0 else x
    torch.testing.assert_close(picked, values, rtol=0, atol=0, equal_nan=True)
    return True


# Ops whose results hold singular vectors or eigenvectors, unique only up to sign (the
# torch.linalg.svd / eigh docs): name -> (index of the values, {index of vectors: stored as rows}).
VECTORS_UP_TO_SIGN = {"svd": (1, {0: False, 2: False}), "linalg.svd": (1, {0: False, 2: True}),
                      "linalg.eigh": (0, {1: False}), "svd_lowrank": (1, {0: False, 2: False}),
                      "pca_lowrank": (1, {0: False, 2: False})}


def _vectors_match_up_to_sign(opinfo, got, expected, rtol, atol) -> bool:
    """For :data:`VECTORS_UP_TO_SIGN` ops: the values equal eager's, and each of our vectors equals
    eager's once flipped to agree in sign with it at eager's largest-magnitude entry. Vectors past
    the k values (``full_matrices``' completion of U or Vh) only span a subspace, defined by its
    projector: those are compared as projectors."""
    if opinfo.name not in VECTORS_UP_TO_SIGN or not isinstance(got, tuple) or len(got) != len(expected):
        return False
    pos, vectors = VECTORS_UP_TO_SIGN[opinfo.name]
    torch.testing.assert_close(got[pos], expected[pos], rtol=rtol, atol=atol, equal_nan=True)
    k = expected[pos].shape[-1]
    for i, rows in vectors.items():
        g, e = (got[i].mT, expected[i].mT) if rows else (got[i], expected[i])
        torch.testing.assert_close(tree_map(_meta, g), tree_map(_meta, e))
        if e.numel() == 0:
            continue
        pivot = e[..., :k].abs().argmax(-2, keepdim=True)
        flip = torch.where((g[..., :k].gather(-2, pivot) < 0) != (e[..., :k].gather(-2, pivot) < 0), -1.0, 1.0)
        torch.testing.assert_close(g[..., :k] * flip.to(g.dtype), e[..., :k], rtol=rtol, atol=atol, equal_nan=True)
        torch.testing.assert_close(g[..., k:] @ g[..., k:].mT, e[..., k:] @ e[..., k:].mT, rtol=rtol, atol=atol)
    return True


def compare(opinfo, dtype, got, expected, sample=None) -> SampleResult:
    """``pass`` when ``got`` matches ``expected`` (values, dtypes, NaN positions), else ``wrong``."""
    rtol, atol = tolerances(opinfo, dtype)
    try:
        if sample is not None and _indices_point_at_values(opinfo, sample, got, expected, rtol, atol):
            return SampleResult("pass")
        if not opinfo.has_nondeterministic_output and _vectors_match_up_to_sign(opinfo, got, expected, rtol, atol):
            return SampleResult("pass")
        if opinfo.has_nondeterministic_output or opinfo.skip_correctness_check_compile_vs_eager:
            # uninitialised memory (empty*) or random values: only shapes and dtypes can match
            torch.testing.assert_close(tree_map(_meta, got), tree_map(_meta, expected))
        else:
            try:
                torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError:
                if not (sample is not None and _as_accurate_as_eager(opinfo, sample, got, expected, rtol, atol)):
                    raise
    except (AssertionError, TypeError, ValueError) as e:
        return SampleResult("wrong", " ".join(str(e).split())[:300])
    return SampleResult("pass")


def _as_accurate_as_eager(opinfo, sample, got, expected, rtol, atol) -> bool:
    """Whether every float32 (float16, bfloat16) result is at least as close to eager-at-float64 as
    eager's own result is, within the tolerances: ``|got - ref64| <= |eager - ref64| + atol + rtol·|ref64|``.

    A sum of many terms (a weighted histogram, a long reduction) rounds differently in another
    order; ours is not wrong when it is no further from the exact value than eager's (the float64
    reference standard of PyTorch's own ``test_ops`` for reduced precision)."""
    if torch.float64 not in opinfo.supported_dtypes("cpu"):
        return False
    up = tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION else t,
                  ((sample.input, *sample.args), sample.kwargs))
    try:
        torch.manual_seed(0)
        ref = opinfo.op(*up[0], **up[1])
    except Exception:  # noqa: BLE001 - no float64 reference: the float32 comparison stands
        return False
    flat = list(zip(tree_leaves(got), tree_leaves(expected), tree_leaves(ref)))
    from torch.testing._comparison import default_tolerances
    for g, e, r in flat:
        if not isinstance(g, torch.Tensor) or g.dtype not in LOW_PRECISION or not isinstance(r, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != e.dtype or not torch.equal(g, e):
                return False
            continue
        rt, at = default_tolerances(g.dtype)
        rt, at = (rtol if rtol is not None else rt), (atol if atol is not None else at)
        r = r.double()
        err_got, err_eager = (g.double() - r).abs(), (e.double() - r).abs()
        nan_ok = torch.isnan(g) == torch.isnan(r)
        ok = (err_got <= err_eager + at + rt * r.abs()) | (torch.isnan(g) & torch.isnan(r))
        if not bool((ok & nan_ok).all()):
            return False
    return True


def _meta(x):
    return torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x


def run_case(opinfo, dtype, max_samples: int | None = None) -> CaseResult:
    """Run the first ``max_samples`` samples of a case (all when ``None``)."""
    result = CaseResult()
    for i, sample in enumerate(opinfo.sample_inputs("cpu", dtype)):
        if max_samples is not None and i >= max_samples:
            result.complete = False
            break
        r = run_sample(opinfo, dtype, sample)
        if r is not None:
            result.samples.append(r)
    return result
