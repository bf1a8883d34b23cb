"""``neuron-compile``: the command line.

    neuron-compile cache info|list|verify|clear [--older-than DAYS] [--json] [--cache-dir DIR]
    neuron-compile compile FILE.py:FACTORY|FILE.pt2 [--train] [--jobs N] [--cache-dir DIR] [-o BUNDLE | --emit PHASE -o DIR] [--json]
    neuron-compile compile NN.linalg.mlir --from linalg --emit llvm|obj [-o OUT] [--plan NN.plan.json]
    neuron-compile bundle export -o BUNDLE [--keys KEY..] | bundle import BUNDLE   [--cache-dir DIR]
    neuron-compile inspect ENTRY_DIR|KEY|BUNDLE

``compile FILE.py:FACTORY`` compiles a model ahead of time into the cache that a later
``torch.compile(model, backend="neuron", dynamic=False)`` reads (:mod:`neuron_compile.aot`).
``compile FILE.mlir`` runs the phases of the pipeline from a dumped file (``NEURON_DUMP_DIR``), e.g.
to reproduce a failing stage, to look at the LLVM dialect of one kernel, or (``--emit obj``) to
rebuild the graph's executable from edited MLIR and run it with ``neuron_compile.load_executable``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def _cache(args: argparse.Namespace):
    from neuron_compile.cache import ArtifactCache
    from neuron_compile.config import resolve_config
    from neuron_compile.compiler import cache_for
    cfg = resolve_config({"cache_dir": args.cache_dir} if args.cache_dir else None)
    cache: ArtifactCache = cache_for(cfg)
    return cache


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1) if args.json else text)


def cmd_info(args: argparse.Namespace) -> int:
    cache = _cache(args)
    entries = list(cache.entries()) if cache.usable else []
    total = sum(e.bytes for e in entries)
    quarantined = cache.quarantined() if cache.usable else []
    data = {"root": str(cache.root), "usable": cache.usable, "writable": cache.writable, "entries": len(entries),
            "bytes": total, "max_bytes": cache.max_bytes, "quarantined": len(quarantined)}
    _emit(args, data, f"cache root   {cache.root}\nusable       {cache.usable}\nentries      {len(entries)}\n"
                      f"size         {_human(total)} of {_human(cache.max_bytes)}\n"
                      f"quarantined  {len(quarantined)}")
    return 0


def _manifest_summary(path: Path) -> dict[str, Any]:
    from neuron_compile.executable import read_manifest
    try:
        m = read_manifest(path)
        return {"name": m.get("name"), "created": m.get("created"), "ops": m.get("ops"),
                "compile_seconds": round(sum(m.get("compile_seconds", {}).values()), 3)}
    except Exception as exc:  # listing must show broken entries too
        return {"error": str(exc)}


def cmd_list(args: argparse.Namespace) -> int:
    cache = _cache(args)
    rows = []
    for e in cache.entries():
        used = datetime.datetime.fromtimestamp(e.last_used, datetime.timezone.utc).isoformat(timespec="seconds")
        rows.append({"key": e.key, "bytes": e.bytes, "last_used": used, **_manifest_summary(e.path)})
    lines = [f"{'key':<16} {'size':>10} {'last used (UTC)':<25} {'ops':>5} {'compile s':>9}  graph"]
    for r in rows:
        lines.append(f"{r['key'][:16]} {_human(r['bytes']):>10} {r['last_used']:<25} {r.get('ops') or '-':>5} "
                     f"{r.get('compile_seconds', '-'):>9}  {r.get('name') or r.get('error')}")
    _emit(args, rows, "\n".join(lines))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from neuron_compile.executable import read_manifest, verify_payloads
    from neuron_compile.errors import ExecutableError
    cache = _cache(args)
    results = []
    for e in cache.entries():
        try:
            problems = verify_payloads(e.path, read_manifest(e.path))
        except ExecutableError as exc:
            problems = [str(exc)]
        if problems and args.quarantine:
            cache.quarantine(e.path, "; ".join(problems))
        results.append({"key": e.key, "ok": not problems, "problems": problems})
    bad = [r for r in results if not r["ok"]]
    text = "\n".join(f"{'ok ' if r['ok'] else 'BAD'} {r['key']}" + (f"  {'; '.join(r['problems'])}" if r['problems']
                                                                  else "") for r in results)
    _emit(args, results, (text + "\n" if text else "") + f"{len(results) - len(bad)} ok, {len(bad)} bad")
    return 1 if bad else 0


def cmd_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    cutoff = time.time() - args.older_than * 86400 if args.older_than is not None else None
    removed, kept = 0, 0
    for e in list(cache.entries()):
        if cutoff is not None and e.last_used > cutoff:
            continue
        if cache.remove(e):
            removed += 1
        else:
            kept += 1
    side = cache.clear_side_dirs() if cutoff is None and cache.usable else 0
    _emit(args, {"removed": removed, "locked": kept, "quarantined_removed": side},
          f"removed {removed} entries" + (f" and {side} quarantined" if side else "")
          + (f", {kept} in use by other processes kept" if kept else ""))
    return 0


def _compile_failed(args: argparse.Namespace, exc: BaseException, what: str = "") -> int:
    """Report a failed ahead-of-time compile in one message (ours from inside Dynamo's
    ``BackendCompilerFailed`` when there is one); ``--json`` prints it as ``{"error": ...}``."""
    from neuron_compile.errors import NeuronCompileError
    inner: BaseException | None = exc
    while inner is not None and not isinstance(inner, NeuronCompileError):
        inner = getattr(inner, "inner_exception", None) or inner.__cause__ or inner.__context__
    shown = inner or exc
    text = str(shown) if isinstance(shown, (ValueError, NeuronCompileError)) else f"{type(shown).__name__}: {shown}"
    if args.json:
        print(json.dumps({"error": what + text}))
    print(f"neuron-compile compile: {what}{text}", file=sys.stderr)
    return 1


def cmd_compile_target(args: argparse.Namespace) -> int:
    """``compile FILE.py:FACTORY|FILE.pt2``: every graph of the model into the cache (or, with
    ``--emit``, each graph's phase files into a dump directory)."""
    from neuron_compile.aot import compile_target
    from neuron_compile.errors import NeuronCompileError
    from neuron_compile.phases import Phase
    options: dict[str, Any] = {}
    if args.cache_dir:
        options["cache_dir"] = args.cache_dir
    source = Path(args.file.rpartition(":")[0] if ".py:" in args.file.lower() else args.file).resolve()
    for flag, value in (("-o", args.output), ("--save-function", args.save_function)):
        if value and (Path(value).resolve() == source or (Path(value).is_dir() and not args.emit_given)):
            return _compile_failed(args, ValueError(f"{flag} {value}: give a new file name (not the model's file, "
                                                    "not a directory)"))
        if value and not args.emit_given and not Path(value).resolve().parent.is_dir():
            return _compile_failed(args, ValueError(f"{flag} {value}: the directory {Path(value).parent} does not "
                                                    "exist"))
    if args.emit_given and args.save_function:
        return _compile_failed(args, ValueError("--save-function needs the compiled executables in the cache, "
                                                "which --emit does not fill: run them separately"))
    if args.emit_given and args.jobs > 1:
        return _compile_failed(args, ValueError("--emit writes one dump directory per graph, numbered per "
                                                "process: use it with --jobs 1"))
    if not args.emit_given:  # the point is to fill the cache: it must be there and writable
        from neuron_compile.compiler import cache_for
        from neuron_compile.config import resolve_config
        try:
            cfg = resolve_config(options)
            cache = cache_for(cfg)
        except (NeuronCompileError, OSError) as exc:
            return _compile_failed(args, exc)
        if not cfg.cache or not (cache.usable and cache.writable and os.access(cache.base, os.W_OK)):
            why = ("disabled (NEURON_CACHE=0): unset NEURON_CACHE" if not cfg.cache else
                   f"at {cache.root} not usable or not writable: set --cache-dir or NEURON_CACHE_DIR to a "
                   "writable directory")
            return _compile_failed(args, ValueError(f"nothing compiled would be stored, the cache is {why}"))
    try:
        if args.emit_given:
            phase = Phase.parse(args.emit)
            out = Path(args.output or "neuron-dump")
            # numbered files per graph, for every phase up to this one; nothing cached
            options.update(dump_dir=str(out), cache=False, stop_after="" if phase is Phase.OBJ else phase.value)
        summary = compile_target(args.file, train=args.train, options=options, progress=not args.json,
                                 jobs=args.jobs)
    except Exception as exc:  # the user's file, factory or model failed: one clear line, no traceback
        return _compile_failed(args, exc)
    if args.emit_given:
        summary["emitted"] = sorted(str(p) for p in out.glob(f"*/*.{args.emit}.*"))
    elif args.output:  # a portable bundle of exactly this target's graphs
        from neuron_compile.bundle import save_bundle
        keys = [g["cache_key"] for g in summary["graph_keys"]]
        written = save_bundle(args.output, args.cache_dir, keys) if keys else {"entries": 0}
        if written["entries"] < len(keys):
            return _compile_failed(args, ValueError(
                f"only {written['entries']} of the {len(keys)} graphs are in the cache to bundle (is the cache "
                "disabled, NEURON_CACHE=0, or read-only?)"), "-o BUNDLE: ")
        summary["bundle"] = {"path": args.output, "entries": written["entries"]}
    if args.save_function:
        from neuron_compile.aot import save_function
        try:
            summary.update(save_function(args.file, args.save_function, options))
        except Exception as exc:  # Dynamo refuses some guards (e.g. PackageError on ID_MATCH): say so
            return _compile_failed(args, exc, "--save-function failed: ")
    lines = [f"{summary['target']}: {summary['input_sets']} input set(s), "
             f"{'inference + training' if summary['train'] else 'inference'}"
             f"{' + optimizer step' if summary['optimizer'] else ''}"
             f"{f', {args.jobs} processes' if args.jobs > 1 else ''}",
             f"graphs {summary['graphs']} (compiled {summary['graphs_compiled']}, already cached "
             f"{summary['disk_hits'] + summary['memory_hits']}), kernels {summary['kernels']}, "
             f"host calls {summary['host_calls']}, {summary['seconds']:.1f} s",
             "seconds per phase: " + ", ".join(f"{k} {v:.2f}" for k, v in summary["phase_seconds"].items())]
    lines += [f"  {g['cache_key'][:16]}  {g['name']}" for g in summary["graph_keys"]]
    lines += [f"  wrote {p}" for p in summary.get("emitted", [])]
    if "bundle" in summary:
        lines.append(f"wrote bundle {summary['bundle']['path']} ({summary['bundle']['entries']} entries; "
                     "neuron-compile bundle import it on the machines that run the model)")
    if "saved_function" in summary:
        lines.append(f"saved function {summary['saved_function']}: torch.compiler.load_compiled_function(f)"
                     "(model, *inputs)")
    _emit(args, summary, "\n".join(lines))
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    lower = args.file.lower()
    if ".py:" in lower or lower.endswith(".pt2"):
        return cmd_compile_target(args)
    if lower.endswith(".py"):
        print(f"neuron-compile compile: {args.file}: name the factory function too, as {args.file}:FACTORY "
              "(a function returning (model, example_inputs))", file=sys.stderr)
        return 2
    from neuron_compile.compiler import mlir_to_llvm
    from neuron_compile.errors import PipelineError
    from neuron_compile.phases import Phase
    from neuron_compile.target import HostCPU
    src = Path(args.file)
    if not src.is_file():
        print(f"neuron-compile compile: {src}: no such file (give a dumped NN.linalg.mlir, see NEURON_DUMP_DIR)",
              file=sys.stderr)
        return 2
    start, stop = Phase.parse(args.from_phase), Phase.parse(args.emit)
    if start is not Phase.LINALG or stop not in (Phase.LLVM, Phase.OBJ):
        print("neuron-compile compile: supported today: --from linalg --emit llvm|obj "
              "(FX phases run inside torch.compile)", file=sys.stderr)
        return 2
    dest = Path(args.output) if args.output else None
    if dest is not None and (dest.resolve() == src.resolve() or (dest.is_dir() and stop is Phase.LLVM)
                             or (dest.suffix == ".o" and dest.is_dir())):
        print(f"neuron-compile compile: -o {dest}: give a new file name (not the input, not a directory)",
              file=sys.stderr)
        return 2
    try:
        src.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"neuron-compile compile: {src} is not readable MLIR text ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    codegen = None
    if not args.schedule:  # a dump keeps the schedules beside the linalg file (NN.schedule.json)
        found = sorted(src.parent.glob("*.schedule.json"))
        args.schedule = str(found[-1]) if found else None
    if args.schedule:
        from neuron_compile.codegen import plan_from_json
        try:
            codegen = plan_from_json(json.loads(Path(args.schedule).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"neuron-compile compile: {args.schedule} is not a schedule file written by a neuron-compile dump "
                  f"({type(exc).__name__}: {exc}); give another with --schedule", file=sys.stderr)
            return 2
    import tempfile
    work = Path(tempfile.mkdtemp(prefix="neuron-cli-"))
    keep = False
    try:
        if stop is Phase.OBJ and not (args.output or "").endswith(".o"):
            return _write_executable(args, src, work, codegen)
        out = mlir_to_llvm(src, work, timeout=600, codegen=codegen)
        if stop is Phase.OBJ:
            HostCPU.detect().codegen(out, work, 3, 600)
            out = work / "kernel.o"  # the relocatable object (kernel.so is what the runtime loads)
        dest = dest or src.with_suffix(".llvm.mlir")
        shutil.move(out, dest)
    except PipelineError as exc:
        keep = True  # the error's reproduce command reads the stage's input from here
        print(f"{exc}\n(work files kept in {work})", file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(dest)
    return 0


_SIGNATURE_ARG = re.compile(r"%(\w+): (memref<.*?>) \{llvm\.noalias\}")


def _signature_problem(mlir: str, plan: Any) -> str | None:
    """Why ``plan`` cannot call the kernel function of ``mlir`` (argument count or a memref type
    differs), or ``None``. The entry point passes one pointer per plan spec (inputs, host results,
    outputs) and trusts their shapes, so a mismatch would read or write out of bounds."""
    from neuron_compile.lowering.ir import memref_type
    from neuron_compile.runtime import KERNEL_SYMBOL
    m = re.search(rf"func\.func @{KERNEL_SYMBOL}\((.*)\) attributes", mlir)
    if m is None:
        return f"it has no func.func @{KERNEL_SYMBOL}(...) as a neuron-compile dump has"
    got = [t for _, t in _SIGNATURE_ARG.findall(m.group(1))]
    want = [memref_type(s.shape, s.dtype, s.stride) for s in (*plan.input_specs, *plan.host_specs, *plan.output_specs)]
    if len(got) != len(want):
        return f"@{KERNEL_SYMBOL} takes {len(got)} memrefs, the plan passes {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"argument {i} of @{KERNEL_SYMBOL} is {g}, the plan passes {w}"
    return None


def _write_executable(args: argparse.Namespace, src: Path, work: Path, codegen: Any) -> int:
    """``--from linalg --emit obj``: ``src`` and the graph's call plan (``NN.plan.json`` of the
    same dump, or ``--plan``) → an executable directory (manifest + native code) that
    ``neuron_compile.load_executable(DIR)`` loads and calls with the graph's inputs. The plan must
    match the kernel function's signature (checked: else the call would go out of bounds).

    Raises:
        PipelineError: a stage failed (the caller keeps ``work`` for its reproduce command).
    """
    from neuron_compile.compiler import linalg_to_native
    from neuron_compile.config import resolve_config
    from neuron_compile.executable import Build, write_executable
    from neuron_compile.plan import CallPlan
    from neuron_compile.target import HostCPU
    dest = Path(args.output) if args.output else src.parent / (src.name.split(".")[0] + ".executable")
    plan_file = Path(args.plan) if args.plan else None
    if plan_file is None:
        found = sorted(src.parent.glob("*.plan.json"))
        plan_file = found[-1] if found else None
    if plan_file is None or not plan_file.is_file():
        print(f"neuron-compile compile: no call plan for {src}: an executable needs the graph's NN.plan.json "
              f"from the same dump (give it with --plan), or write a relocatable object with -o FILE.o",
              file=sys.stderr)
        return 2
    if dest.is_file() or (dest.is_dir() and any(dest.iterdir())):
        print(f"neuron-compile compile: {dest} exists and is not an empty directory; choose another -o",
              file=sys.stderr)
        return 2
    try:
        saved = json.loads(plan_file.read_text())
        plan = CallPlan.from_json(saved["plan"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"neuron-compile compile: {plan_file} is not a call plan written by a neuron-compile dump "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    problem = _signature_problem(src.read_text(), plan)
    if problem:
        print(f"neuron-compile compile: the call plan {plan_file} does not fit {src}: {problem}; give the plan "
              "of the same graph's dump with --plan", file=sys.stderr)
        return 2
    target = HostCPU.detect()
    build = Build(saved.get("name", src.stem), plan, ops=saved.get("ops", 0),
                  kernels=(codegen.to_json()["kernels"] if codegen is not None else []))
    build.payloads = linalg_to_native(src, work, plan, codegen, target, resolve_config(None), build.seconds)
    write_executable(dest, build, None, target)
    print(dest)
    return 0


def cmd_bundle_export(args: argparse.Namespace) -> int:
    from neuron_compile.bundle import save_bundle
    r = save_bundle(args.output, args.cache_dir, args.keys or None)
    _emit(args, r, f"wrote {r['entries']} entries to {r['path']}"
          + "".join(f"\n  left out {s['key'][:16]}: {'; '.join(s['problems'])}" for s in r["skipped"]))
    return 0


def cmd_bundle_import(args: argparse.Namespace) -> int:
    from neuron_compile.bundle import BundleError, load_bundle
    try:
        r = load_bundle(args.bundle, args.cache_dir)
    except BundleError as exc:
        print(f"neuron-compile bundle import: {exc}", file=sys.stderr)
        return 1
    lines = [f"imported {len(r['imported'])}, already in the cache {len(r['existing'])}"
             + (f", {len(r['repaired'])} of them replacing damaged entries" if r["repaired"] else "")]
    lines += [f"  skipped {k[:16]}: compiled for another CPU than this host's" for k in r["other_cpu"]]
    _emit(args, r, "\n".join(lines))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from neuron_compile.bundle import BundleError, read_index
    from neuron_compile.errors import ExecutableError
    from neuron_compile.executable import read_manifest
    path = Path(args.path)
    if not path.exists() and len(args.path) >= 4:  # a cache key (or a prefix of one)
        found = [e.path for e in _cache(args).entries() if e.key.startswith(args.path)]
        path = found[0] if len(found) == 1 else path
    if not path.exists():
        print(f"neuron-compile inspect: {args.path} is neither a file, an entry directory nor a cache key "
              f"(or key prefix) of exactly one entry in {_cache(args).root}", file=sys.stderr)
        return 1
    try:
        data = read_manifest(path) if path.is_dir() else read_index(path)
    except (ExecutableError, BundleError) as exc:
        print(f"neuron-compile inspect: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=1))
    return 0


def _days(text: str) -> float:
    """A non-negative number of days (a negative age would select every entry)."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not days >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text!r}: the age must be 0 or more days")
    return days


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of processes") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 or more processes")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="neuron-compile", description="neuron-compile command line")
    sub = ap.add_subparsers(dest="command", required=True)
    cache = sub.add_parser("cache", help="inspect and manage the artifact cache")
    csub = cache.add_subparsers(dest="action", required=True)
    for name, fn, hlp in (("info", cmd_info, "root, size and bound"), ("list", cmd_list, "one line per entry"),
                          ("verify", cmd_verify, "check every payload's sha256"),
                          ("clear", cmd_clear, "remove entries")):
        p = csub.add_parser(name, help=hlp)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--cache-dir", help="cache root (default: NEURON_CACHE_DIR or ~/.cache/neuron-compile)")
        p.set_defaults(func=fn)
        if name == "clear":
            p.add_argument("--older-than", type=_days, metavar="DAYS", help="only entries unused for DAYS days")
        if name == "verify":
            p.add_argument("--quarantine", action="store_true", help="move bad entries to quarantine")
    comp = sub.add_parser(
        "compile", help="compile a model ahead of time (FILE.py:FACTORY or FILE.pt2) or run pipeline phases on a "
                        "dumped file",
        description="FILE.py:FACTORY: FACTORY() returns (model, example_inputs[, optimizer]); example_inputs "
                    "is a tuple of arguments or a list of them (one per input shape); with --train the "
                    "optimizer's step is compiled too, as torch.compile(optimizer.step, backend='neuron', "
                    "dynamic=False) compiles it. FILE.pt2: a torch.export program (torch.export.save), called "
                    "with its example inputs. The graphs are compiled into the cache that "
                    "torch.compile(model, backend='neuron', dynamic=False) reads. "
                    "FILE.mlir: run phases from a dumped NN.linalg.mlir (--from linalg --emit llvm|obj; obj writes an "
                    "executable directory, or a relocatable object when -o ends in .o).")
    comp.add_argument("file", help="FILE.py:FACTORY, FILE.pt2, or a dumped FILE.mlir")
    comp.add_argument("--from", dest="from_phase", default="linalg", help="phase of FILE.mlir (linalg)")
    comp.add_argument("--emit", default=None,
                      help="FILE.mlir: phase to stop after (llvm, or obj: an executable directory, or a relocatable "
                           "object when -o ends in .o; default llvm). FILE.py:FACTORY: write every "
                           "graph's numbered phase files up to this phase into -o DIR, stop there, and list those of "
                           "this phase (fx, fx-opt, linalg, llvm, obj)")
    comp.add_argument("-o", "--output", help="FILE.py:FACTORY|FILE.pt2: a bundle file to write with the target's "
                                             "executables (.tar.gz), or with --emit the dump directory; FILE.mlir: "
                                             "the output file or executable directory")
    comp.add_argument("--train", action="store_true",
                      help="FILE.py:FACTORY|FILE.pt2: also compile the training graphs (forward and backward) and "
                           "the factory's optimizer step, if it returns an optimizer")
    comp.add_argument("--cache-dir", help="cache root (default: NEURON_CACHE_DIR or ~/.cache/neuron-compile)")
    comp.add_argument("--jobs", "-j", type=_jobs, default=1, metavar="N",
                      help="FILE.py:FACTORY|FILE.pt2: compile independent graphs (input sets, inference and "
                           "training) in N processes at once (default 1)")
    comp.add_argument("--json", action="store_true", help="machine-readable summary, no progress bar")
    comp.add_argument("--save-function", metavar="PATH",
                      help="FILE.py:FACTORY: also aot_compile model(*first input set) and save it to PATH "
                           "(torch.compiler.load_compiled_function(open(PATH, 'rb'))(model, *inputs) in a new "
                           "process runs with no tracing)")
    comp.add_argument("--plan", metavar="NN.plan.json",
                      help="FILE.mlir --emit obj: the graph's call plan (default: the NN.plan.json beside FILE.mlir); "
                           "with it -o DIR is an executable that neuron_compile.load_executable(DIR) runs")
    comp.add_argument("--schedule", metavar="NN.schedule.json",
                      help="apply the kernels' schedules recorded in a dump (default: the NN.schedule.json beside "
                           "FILE.mlir if there is one, else every kernel as plain loops)")
    comp.set_defaults(func=cmd_compile)
    bundle = sub.add_parser("bundle", help="move cache entries between machines in one file")
    bsub = bundle.add_subparsers(dest="action", required=True)
    bexp = bsub.add_parser("export", help="write cache entries into a bundle")
    bexp.add_argument("-o", "--output", required=True, help="bundle file to write (a .tar.gz)")
    bexp.add_argument("--keys", nargs="*", help="only entries whose cache key starts with one of these")
    bimp = bsub.add_parser("import", help="add a bundle's entries to the cache (never overwrites; checks "
                                          "integrity first; skips entries compiled for another CPU)")
    bimp.add_argument("bundle")
    for p, fn in ((bexp, cmd_bundle_export), (bimp, cmd_bundle_import)):
        p.add_argument("--cache-dir", help="cache root (default: NEURON_CACHE_DIR or ~/.cache/neuron-compile)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=fn)
    insp = sub.add_parser("inspect", help="print the manifest of a cache entry (directory or key) or a bundle's index")
    insp.add_argument("path", help="an entry directory, a cache key (prefix), or a bundle file")
    insp.add_argument("--cache-dir", help="cache root for a key (default: NEURON_CACHE_DIR or ~/.cache/neuron-compile)")
    insp.set_defaults(func=cmd_inspect)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compile":
        args.emit_given = args.emit is not None
        args.emit = args.emit or "llvm"
    from neuron_compile.errors import NeuronCompileError
    try:
        return args.func(args)
    except BrokenPipeError:  # `neuron-compile cache list | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python docs, "Note on SIGPIPE"
        return 0
    except (OSError, ValueError, NeuronCompileError) as exc:  # bad paths, files, values: one line, no traceback
        name = " ".join(filter(None, (args.command, getattr(args, "action", None))))
        print(f"neuron-compile {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
