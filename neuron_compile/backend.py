"""The ``neuron`` backend for ``torch.compile``.

Registered through the ``torch_dynamo_backends`` entry point, so ``torch.compile(m, backend="neuron")``
works without importing this package. Dynamo hands us a torch-level FX graph; AOTAutograd (with our
decomposition table) turns it into ATen forward/backward graphs, each compiled by
:func:`neuron_compile.compiler.compile_graph`. ``neuron_backend`` is one module-level object: Dynamo
caches per backend identity, and a new object per call would recompile every time.
"""
from __future__ import annotations

import importlib.metadata
import warnings
from typing import Any, Callable, Mapping, Sequence

import torch

from neuron_compile import counters
from neuron_compile.config import resolve_config
from neuron_compile.errors import DynamicShapeError

_OUR_ENTRY = "neuron_compile.backend:neuron_backend"


def _warn_on_conflicting_registration() -> None:
    try:
        eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    except Exception:  # metadata of a broken install must not break compile
        return
    others = [ep for ep in eps if ep.name == "neuron" and ep.value != _OUR_ENTRY]
    if others:
        names = ", ".join(f"{ep.value} (from {getattr(ep.dist, 'name', '?')})" for ep in others)
        warnings.warn(
            "\n*** Two torch.compile backends are registered under the name 'neuron': neuron-compile "
            f"({_OUR_ENTRY}) and {names}. torch.compile(backend='neuron') may pick either one. "
            "Pass the backend object instead: torch.compile(m, backend=neuron_compile.backend.neuron_backend), "
            "or uninstall one of them. ***", RuntimeWarning, stacklevel=2)


_warn_on_conflicting_registration()


def _check_static(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, x in enumerate(example_inputs):
        sym = isinstance(x, torch.SymInt) or (
            isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape))
        if sym:
            node = placeholders[i] if i < len(placeholders) else None
            ga = node.meta.get("grapharg") if node is not None else None
            source = getattr(ga, "source", None)
            label = getattr(source, "name", None) if source is not None else None
            label = label() if callable(label) else label
            label = label or (node.name if node is not None else f"#{i}")
            raise DynamicShapeError(
                f"input {label} (dynamic=True, mark_dynamic, or torch.compile's default dynamic=None after a "
                "second size make dimensions symbolic)")


def _check_no_data_dependent_sizes(gm: torch.fx.GraphModule) -> None:
    """Refuse, before AOTAutograd traces it, a Dynamo graph in which a value's size depends on
    tensor values (``nonzero``, ``masked_select``, ``unique``, ``.item()`` used as a size): Dynamo
    gives those unbacked symbols; neuron-compile compiles static shapes only.

    Raises:
        UnsupportedOpsError: listing each node that introduces such a size, with its source line.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from neuron_compile.errors import UnsupportedOp, UnsupportedOpsError
    from neuron_compile.lowering.locations import user_location
    seen: set = set()
    found = []
    for n in gm.graph.nodes:
        new = set(free_unbacked_symbols(n.meta.get("example_value"))) - seen
        if new:
            seen |= new
            what = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
            if what == "item":
                found.append(UnsupportedOp("item", n.name, user_location(n), "lowering/emit.py",
                                           "a Python number read from tensor data and used by further computation "
                                           "in the graph; return it, or compute with the tensor (x * t, not "
                                           "x * t.item())"))
                continue
            found.append(UnsupportedOp(str(what), n.name, user_location(n), "lowering/emit.py",
                                       "its output size depends on tensor values; only static shapes compile, "
                                       "except unique/nonzero/masked_select/x[mask] and .item() results returned "
                                       "directly"))
    if found:
        raise UnsupportedOpsError(found, "the Dynamo graph")


def _data_dependent_error(gm: torch.fx.GraphModule, e: BaseException):
    """An :class:`UnsupportedOpsError` for a size that turned out to depend on tensor values while
    AOTAutograd decomposed the graph, naming the Dynamo node being traced (found in the
    traceback's ``fx.Interpreter.run_node`` frame) and its source line."""
    from neuron_compile.errors import UnsupportedOp, UnsupportedOpsError
    from neuron_compile.lowering.locations import user_location
    nodes = set(gm.graph.nodes)
    node = None
    tb = e.__traceback__
    while tb is not None:  # the innermost frame of fx.Interpreter.run_node that holds one of gm's nodes
        cand = tb.tb_frame.f_locals.get("n")
        node = cand if isinstance(cand, torch.fx.Node) and cand in nodes else node
        tb = tb.tb_next
    what = (node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))) \
        if node is not None else "an op"
    return UnsupportedOpsError([UnsupportedOp(
        str(what), node.name if node is not None else "?", user_location(node) if node is not None else "?",
        "lowering/emit.py", "its decomposition needs a size that depends on tensor values; "
        "only static shapes compile")], "the Dynamo graph")


_compile_only_warned = False


def _placeholders(gm: torch.fx.GraphModule) -> Callable[[list], list]:
    """Compile-only mode (``options={"compile_only": True}`` / ``NEURON_COMPILE_ONLY=1``, as
    TorchNeuron's): the graph was compiled and cached; the call returns zero-filled tensors of each
    output's shape, strides and dtype (non-tensor outputs as traced) and warns once per process."""
    global _compile_only_warned
    if not _compile_only_warned:
        _compile_only_warned = True
        warnings.warn("neuron-compile compile_only: graphs are compiled and cached but not run; every output "
                      "is a zero-filled placeholder of the right shape and dtype", RuntimeWarning, stacklevel=3)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    metas = [o.meta.get("val") if isinstance(o, torch.fx.Node) else o
             for o in (out if isinstance(out, (list, tuple)) else [out])]

    def run(args: list) -> list:
        return [torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="cpu").zero_()
                if isinstance(m, torch.Tensor) else m for m in metas]
    return run


def _output_code(exe: Any) -> Callable[[list], list]:
    """The compiled graph as AOTAutograd's ``OutputCode`` (see :mod:`neuron_compile.serialized`),
    so ``torch.compile(...).aot_compile`` can save it by cache key; a plain boxed function when
    torch's Inductor package (which defines ``OutputCode``) cannot be imported."""
    try:
        from neuron_compile.serialized import NeuronOutputCode
    except ImportError:
        return _boxed(exe)
    return NeuronOutputCode.wrap(exe)


def _boxed(fn: Callable[[list], list]) -> Callable[[list], list]:
    @torch._disable_dynamo
    def run(args: list) -> list:
        try:
            return fn(args)
        finally:
            args.clear()
    run._boxed_call = True  # type: ignore[attr-defined]
    return run


class NeuronBackend:
    """``backend(gm, example_inputs, options=None)`` as Dynamo calls it.

    Args:
        gm: Dynamo's FX graph. example_inputs: its example tensors (static shapes required).
        options: ``torch.compile(options=...)``, see :class:`neuron_compile.config.Config`.
    Returns:
        A callable with Dynamo's calling convention (AOTAutograd's runtime wrapper).
    Raises:
        DynamicShapeError: a symbolic size (use ``dynamic=False``). UnsupportedOpsError and the
        other :mod:`neuron_compile.errors` from compilation, surfaced by Dynamo as
        ``BackendCompilerFailed`` with our message inside.
    """

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: Mapping[str, Any] | None = None, mode: str | None = None) -> Callable:
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from neuron_compile.compiler import compile_graph
        from neuron_compile.input_overlap import exact_input_overlap
        from neuron_compile.passes import bounded
        from neuron_compile.passes.aten_checks import check_arguments
        from neuron_compile.passes.decompose import decomposition_table

        if mode not in (None, "default"):
            warnings.warn(f"torch.compile mode={mode!r} has no meaning for backend 'neuron' and is ignored; "
                          "use options={...} (see neuron_compile.config.Config)", RuntimeWarning, stacklevel=2)
        config = resolve_config(options)
        _check_static(gm, example_inputs)
        check_arguments(gm)  # ATen's CPU-kernel argument checks that fake tensors skip: eager's error
        scalars = bounded.host_scalars(gm)  # .item() results returned directly: read on the host
        narrows = bounded.rewrite(gm)  # unique/nonzero/... whose results go straight to the outputs
        _check_no_data_dependent_sizes(gm)

        def compiler(kind: str):
            @torch._disable_dynamo  # a backward compiled inside a traced region must not be traced
            def compile_one(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable:
                # AOTAutograd calls us with its FakeTensorMode active; constants are real tensors.
                with unset_fake_temporarily():
                    exe = compile_graph(graph, config, kind)
                counters.bump("graphs")
                if config.compile_only:
                    return _boxed(_placeholders(graph))
                return _output_code(exe)
            return compile_one

        from torch.fx.experimental.symbolic_shapes import (GuardOnDataDependentSymNode,
                                                           PendingUnbackedSymbolNotFound)
        # Dynamo's DDPOptimizer (a DDP model split at gradient-bucket boundaries) asks AOTAutograd to
        # return fake outputs from each piece's first call, and consumes that call itself only if
        # it sees this counter move (as torch's own aot_autograd backend helper bumps it); otherwise
        # the user's first real step got the fake outputs
        from torch._dynamo.utils import counters as dynamo_counters
        dynamo_counters["aot_autograd"]["total"] += 1
        try:
            with exact_input_overlap():   # torch's check misses some overlapping input views
                compiled = aot_module_simplified(gm, list(example_inputs), fw_compiler=compiler("forward"),
                                                 bw_compiler=compiler("backward"),
                                                 inference_compiler=compiler("inference"),
                                                 decompositions=decomposition_table())
            return bounded.narrow_outputs(compiled, narrows, scalars)
        except (GuardOnDataDependentSymNode, PendingUnbackedSymbolNotFound) as e:
            raise _data_dependent_error(gm, e) from e

    def __repr__(self) -> str:
        return "neuron_backend"


neuron_backend = NeuronBackend()
