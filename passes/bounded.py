"""Bounded data-dependent outputs: ``unique``, ``nonzero``, ``masked_select`` and friends.

The size of these ops' results depends on tensor values, so Dynamo gives them an *unbacked* size
symbol (``u0``). neuron-compile compiles static shapes only, but each of these sizes has a static
upper bound (the input's element count). As JAX's ``jnp.nonzero(x, size=...)`` /
``jnp.unique(x, size=...)`` and XLA's bounded dynamic shapes do, we compute the result into a
buffer of the bound plus a 0-d ``int64`` count, and narrow the buffer to the count on the host
after the compiled call (:func:`narrow_outputs`).

Narrowing happens outside the compiled code, so this only applies when a data-dependent result
flows straight to the graph's outputs (``torch.unique(x)`` returned from the compiled function);
a graph that computes further with it (``x[x > 0].sum()``) is still refused with
:class:`~neuron_compile.errors.UnsupportedOpsError` by the backend's check.

Each padded form below returns ``(result, count)`` where ``result`` has the same structure, dtypes
and static sizes as the op's, except that the data-dependent dim has the bound's length. The
padded slots hold well-defined values (zeros, or the first element) that are narrowed away.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

aten = torch.ops.aten


def _sorted_rows(rows: torch.Tensor, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, rows[perm])``: rows (D, L) in lexicographic order, stable (LSD radix: one stable
    sort per column, last column first; NaN sorts last as in ``torch.sort``), or as they are."""
    perm = torch.arange(rows.shape[0])
    if sort:
        for c in reversed(range(rows.shape[1])):
            perm = perm[torch.sort(rows[perm, c], stable=True).indices]
    return perm, rows[perm]


def _unique_rows(rows: torch.Tensor, sort: bool, return_inverse: bool, return_counts: bool):
    """Unique rows of ``rows`` (D, L), sorted or consecutive, padded to D rows.

    Returns ``(values (D, L), inverse (D,) int64, counts (D,) int64, count 0-d int64)``: group
    ``g`` of equal (adjacent after sorting) rows goes to slot ``g``; rows past ``count`` are zero.
    Equality is ``!=`` per element, so NaNs never merge (as ATen's ``unique``)."""
    d, length = rows.shape
    perm, srt = _sorted_rows(rows, sort)
    first = torch.ones(min(d, 1), dtype=torch.bool)
    starts = torch.cat([first, (srt[1:] != srt[:-1]).any(-1)]) if length else torch.cat(
        [first, torch.zeros(max(d - 1, 0), dtype=torch.bool)])
    group = torch.cumsum(starts.to(torch.int64), 0) - 1                  # (D,) group of each sorted row
    values = torch.zeros_like(rows).scatter(0, group.unsqueeze(1).expand(d, length), srt)
    inverse = torch.zeros(d, dtype=torch.int64).scatter(0, perm, group) if return_inverse else None
    counts = torch.zeros(d, dtype=torch.int64).scatter_add(0, group, torch.ones(d, dtype=torch.int64)) \
        if return_counts else None
    return values, inverse, counts, starts.sum()


def _unique(x, sort: bool, return_inverse: bool, return_counts: bool, dim):
    if dim is None:
        rows = x.reshape(-1, 1)
    else:
        dim = dim % max(x.dim(), 1)
        moved = x.movedim(dim, 0) if x.dim() else x.reshape(1)
        rows = moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))
    values, inverse, counts, count = _unique_rows(rows, sort, return_inverse, return_counts)
    if dim is None:
        values, inverse = values.reshape(-1), inverse.reshape(x.shape) if return_inverse else None
    else:
        values = values.reshape(moved.shape).movedim(0, dim) if x.dim() else values.reshape(x.shape)
    out = [values] + ([inverse] if return_inverse else []) + ([counts] if return_counts else [])
    return (out[0] if len(out) == 1 else tuple(out)), count


def unique(x, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """Padded ``torch.unique``: x any shape and dtype; values padded to ``x.numel()`` elements
    (``dim=None``) or ``x.shape[dim]`` slices. Sorted whatever ``sorted`` says: ATen's CPU
    kernel sorts too. Rows compare lexicographically as ATen's ``unique_dim``."""
    return _unique(x, True, return_inverse, return_counts, dim)


def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """Padded ``torch.unique_consecutive``: runs of equal adjacent elements (or slices)."""
    return _unique(x, False, return_inverse, return_counts, dim)


def _unique_dims(x, *args, dim=None, return_inverse=False, return_counts=False, sorted=True):
    """The bounded dim of each result of ``unique(_consecutive)`` (None: the inverse, static)."""
    if args and isinstance(args[0], bool) and len(args) == 4:  # unique(x, sorted, inverse, counts, dim)
        args = args[1:]
    return_inverse, return_counts, dim = (list(args) + [return_inverse, return_counts, dim][len(args):])[:3]
    values = 0 if dim is None or x.dim() == 0 else dim % x.dim()
    return [values] + ([None] if return_inverse else []) + ([0] if return_counts else [])


def nonzero(x, *, as_tuple=False):
    """Padded ``torch.nonzero``: (x.numel(), x.dim()) int64 indices in row-major order, -1 after
    the count (``nonzero_static``'s fill); ``as_tuple``: its columns (a 0-d x counts as 1-d)."""
    idx = torch.nonzero_static(x if x.dim() or not as_tuple else x.reshape(1), size=x.numel(), fill_value=-1)
    return (tuple(idx.unbind(1)) if as_tuple else idx), (x != 0).sum()


def masked_select(x, mask):
    """Padded ``torch.masked_select``: :func:`boolean_index` of the broadcast ``x`` by the broadcast
    ``mask`` (the selected elements in row-major order)."""
    return boolean_index(*torch.broadcast_tensors(x, mask))


def boolean_index(x, mask):
    """Padded ``x[mask]`` for a boolean ``mask`` over x's leading dims: the selected slices in
    row-major order, padded to ``mask.numel()`` slices with the first one (narrowed away)."""
    k = mask.dim()
    at = torch.nonzero_static(mask.reshape(-1), size=mask.numel(), fill_value=0).reshape(-1)
    return x.reshape(mask.numel(), *x.shape[k:])[at], mask.sum()


@dataclass(frozen=True)
class Padded:
    """A padded form and, from the op's arguments (tensors as fake tensors), the bounded dim of each
    leaf of its result (``None`` for a leaf of static size)."""
    fn: Callable
    dims: Callable[..., list]


_UNIQUE = Padded(unique, _unique_dims)
_UNIQUE_CONSECUTIVE = Padded(unique_consecutive, _unique_dims)
_NONZERO = Padded(nonzero, lambda x, as_tuple=False: [0] * max(x.dim(), 1) if as_tuple else [0])
_MASKED_SELECT = Padded(masked_select, lambda x, mask: [0])
_BOOLEAN_INDEX = Padded(boolean_index, lambda x, mask: [0])
# Dynamo call targets (functions, or Tensor method names) -> padded form.
PADDED: dict[Any, Padded] = {
    torch.unique: _UNIQUE, "unique": _UNIQUE,
    torch.unique_consecutive: _UNIQUE_CONSECUTIVE, "unique_consecutive": _UNIQUE_CONSECUTIVE,
    torch.nonzero: _NONZERO, "nonzero": _NONZERO, torch.argwhere: _NONZERO, "argwhere": _NONZERO,
    torch.masked_select: _MASKED_SELECT, "masked_select": _MASKED_SELECT,
}
_SIZE_CHECKS = (aten.sym_size.int, aten._assert_scalar.default, operator.ge, operator.le, operator.gt,
                operator.lt, operator.eq)


@dataclass(frozen=True)
class Narrow:
    """Graph output ``output`` is narrowed along ``dim`` to the value of extra output ``count``."""
    output: int
    dim: int
    count: int


def _is_boolean_index(node: torch.fx.Node) -> bool:
    """``x[mask]``: Dynamo's ``getitem`` of a tensor by one boolean tensor (not a tuple's getitem)."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return False
    x, idx = node.args
    xv = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    iv = idx.meta.get("example_value") if isinstance(idx, torch.fx.Node) else None
    return (isinstance(xv, torch.Tensor) and isinstance(iv, torch.Tensor) and iv.dtype == torch.bool
            and 0 < iv.dim() <= xv.dim() and tuple(iv.shape) == tuple(xv.shape[:iv.dim()]))


def _padded_form(node: torch.fx.Node) -> Padded | None:
    if _is_boolean_index(node):
        return _BOOLEAN_INDEX
    if node.op in ("call_function", "call_method"):
        try:
            return PADDED.get(node.target)
        except TypeError:  # an unhashable target
            return None
    return None


def _symbols(node: torch.fx.Node) -> set:
    return set(free_unbacked_symbols(node.meta.get("example_value")))


def rewrite(gm: torch.fx.GraphModule) -> list[Narrow]:
    """Replace each bounded data-dependent node of Dynamo's graph ``gm`` (:data:`PADDED`) by its
    padded form when its results only reach the graph's outputs; return how to narrow those outputs
    (empty when nothing was rewritten). ``gm`` is left unchanged when a data-dependent node cannot
    be handled (another op, or a result used by further computation), so the backend's refusal
    names it."""
    graph = gm.graph
    sources = [n for n in graph.nodes if _padded_form(n) is not None]
    introduced = {n for n in graph.nodes
                  if _symbols(n) - set().union(set(), *(_symbols(a) for a in n.all_input_nodes))}
    if not sources or not introduced <= set(sources):
        return []
    output = next(n for n in graph.nodes if n.op == "output")
    flat_out = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    leaf_dim = {}  # node -> (source, its bounded dim) for the sources and their getitems
    for node in graph.nodes:
        if node in sources:
            meta = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["example_value"])
            dims = _padded_form(node).dims(*meta[0], **meta[1])
            leaf_dim[node] = (node, dims[0] if not isinstance(node.meta["example_value"], (tuple, list)) else dims)
        elif node.target is operator.getitem and node.args[0] in leaf_dim:
            src, dims = leaf_dim[node.args[0]]
            leaf_dim[node] = (src, dims[node.args[1]])
    checks: list[torch.fx.Node] = []  # size checks on the unbacked sizes (Dynamo's runtime asserts)
    todo = [u for n in leaf_dim for u in n.users]
    while todo:  # every use: a getitem, the output itself, or a size check used only by size checks
        user = todo.pop()
        if user is output or user in leaf_dim or user in checks:
            continue
        if user.target not in _SIZE_CHECKS:
            return []
        checks.append(user)
        todo.extend(user.users)
    narrows = []
    for i, leaf in enumerate(flat_out):
        if isinstance(leaf, torch.fx.Node) and leaf in leaf_dim:
            src, dim = leaf_dim[leaf]
            if isinstance(dim, list):
                return []  # a whole tuple result returned as one output
            if dim is not None:
                narrows.append(Narrow(i, dim, len(flat_out) + sources.index(src)))
    counts = []
    for node in sources:
        with graph.inserting_after(node):
            padded = graph.call_function(_padded_form(node).fn, tuple(node.args), dict(node.kwargs))
        with graph.inserting_after(padded):
            result = graph.call_function(operator.getitem, (padded, 0))
        with graph.inserting_after(result):
            counts.append(graph.call_function(operator.getitem, (padded, 1)))
        node.replace_all_uses_with(result)
    new_out = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    output.args = (tuple(new_out) + tuple(counts),)
    for node in reversed([n for n in graph.nodes if n in set(checks)]):
        graph.erase_node(node)
    for node in list(leaf_dim):
        node.meta.pop("example_value", None)
        if node in sources:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return narrows


def _is_item(node: torch.fx.Node) -> bool:
    """``t.item()`` as Dynamo records it (under ``fullgraph=True`` or ``capture_scalar_outputs``)."""
    return ((node.op == "call_method" and node.target == "item")
            or (node.op == "call_function" and node.target in (torch.Tensor.item, aten._local_scalar_dense.default)))


def _scalar_checks(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes that only check an ``.item()`` value's range (Dynamo's runtime asserts on an
    unbacked bool or int: ``sym_ite``, comparisons, ``_assert_scalar``), or ``None`` if some use
    computes with it."""
    checks, todo = [], [u for u in node.users if u.op != "output" and u.target is not torch.scalar_tensor]
    while todo:
        user = todo.pop()
        if user in checks:
            continue
        if user.target not in _SIZE_CHECKS and user.target is not torch.sym_ite:
            return None
        checks.append(user)
        todo.extend(user.users)
    return checks


def host_scalars(gm: torch.fx.GraphModule) -> list[int]:
    """Let ``.item()`` results that go straight to the graph's outputs be read on the host, as
    Inductor reads them with an extern ``_local_scalar_dense``. Dynamo returns such a result either
    as ``torch.scalar_tensor(t.item(), dtype=d)`` (a float), which becomes ``t.reshape(()).to(d)``
    in the graph, or as the number itself (an int or bool), which the graph now returns as the
    0-d tensor ``t`` and :func:`narrow_outputs` turns into its number after the compiled call.
    Returns the latter's output positions. An ``.item()`` that further computation uses is left
    for the backend to refuse (a data-dependent scalar inside the kernel)."""
    graph = gm.graph
    items = [n for n in graph.nodes if _is_item(n)]
    if not items:
        return []
    output = next(n for n in graph.nodes if n.op == "output")
    positions: list[int] = []
    for item in items:
        checks = _scalar_checks(item)
        wraps = [u for u in item.users if u.target is torch.scalar_tensor]
        if checks is None or any(set(w.users) != {output} for w in wraps):
            continue
        with graph.inserting_after(item):
            value = graph.call_method("reshape", (item.args[0], ()))
        for w in wraps:
            with graph.inserting_after(w):
                cast = graph.call_method("to", (value,), {"dtype": w.kwargs.get("dtype") or torch.get_default_dtype()})
            w.replace_all_uses_with(cast)
            graph.erase_node(w)
        flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        positions += [i for i, leaf in enumerate(flat) if leaf is item]
        flat = [value if leaf is item else leaf for leaf in flat]
        for c in reversed([n for n in graph.nodes if n in set(checks)]):
            graph.erase_node(c)
        output.args = (tuple(flat) if isinstance(output.args[0], (list, tuple)) else flat[0],)
        graph.erase_node(item)
    graph.lint()
    gm.recompile()
    return sorted(positions)


def narrow_outputs(fn: Callable, narrows: list[Narrow], scalars: Sequence[int] = ()) -> Callable:
    """Wrap AOTAutograd's compiled callable ``fn`` (called with unboxed arguments) so each bounded
    output is narrowed to its count and the count outputs are dropped, and each output position in
    ``scalars`` (:func:`host_scalars`) becomes its Python number (``Tensor.item``)."""
    if not narrows and not scalars:
        return fn
    n_counts = len({n.count for n in narrows})

    def fix(outs):
        outs = list(outs)
        for n in narrows:
            outs[n.output] = outs[n.output].narrow(n.dim, 0, int(outs[n.count]))
        for i in scalars:
            outs[i] = outs[i].item()
        return outs[:len(outs) - n_counts]

    def run(*args):  # aot_module_simplified's forward takes the arguments unboxed for a GraphModule
        return fix(fn(*args))
    return run
