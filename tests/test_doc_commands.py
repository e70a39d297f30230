"""Every command in the docs runs as printed on a fresh clone, or says what it needs first.

The docs (README.md, common/README.md, common/GLOSSARY.md, traces/**/README.md, every walkthrough)
hold their commands in fenced ```bash blocks. A block whose commands need a run first holds a line
`# needs a run first: ./scripts/run_demos.sh <pair>` naming the pair. Every other block's Python
commands (`python -m common.<module> ...`, `python scripts/<script>.py ...`, with `python`,
`python3` or `.venv/bin/python`) run here, as printed, in a copy of the repository's tracked files
(what a fresh clone holds: the committed reference, no runs of ours), and must exit 0. Scripts
whose job takes minutes (LONG_SCRIPTS) run with --help instead. Shell scripts (./scripts/*.sh)
must exist and be executable: they are the set-up, not something to run in a test.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import background_job, background_result

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted({ROOT / "README.md", ROOT / "common" / "README.md", ROOT / "common" / "GLOSSARY.md",
               *(ROOT / "traces").glob("**/README.md"), *(ROOT / "demos").glob("*/README.md")})
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
NEEDS_RUN = re.compile(r"^#\s*needs a run first:\s*(\S.*)$")
PYTHON = r"(?:\.venv/bin/python|python3?)"
PYTHON_COMMAND = re.compile(rf"^{PYTHON}\s+(?:-m\s+common\.\w+|scripts/\w+\.py)\b")
SHELL_SCRIPT = re.compile(r"^(\./scripts/[\w.-]+\.sh)\b")
# Scripts whose job takes minutes (a benchmark, every careless edit against the suite, every pair):
# their commands run as `<script> --help`, which still fails on a script that is gone or broken.
LONG_SCRIPTS = ("scripts/bench_analyze.py", "scripts/check_tests_catch.py", "scripts/run_demos.py")
# Stops a hung command only: the slowest (compare on a reference pair, matplotlib's first import
# building its font cache on a fresh machine) take tens of seconds on 2 busy cores.
COMMAND_TIMEOUT_S = 300
WORKERS = 1  # one core: they run in the background beside the other tests (conftest.py)


def shell_blocks(text: str) -> list[list[str]]:
    """The fenced blocks of a shell language, each as its lines, with backslash continuations
    joined."""
    blocks, current, fence = [], None, None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            match = re.match(r"^(`{3,}|~{3,})\s*(\w*)", stripped)
            if match:
                fence = match.group(1)
                current = [] if match.group(2) in SHELL_LANGUAGES else False
            continue
        if stripped.startswith(fence):
            if current is not False:
                blocks.append(current)
            current, fence = None, None
        elif current is not False:
            if current and current[-1].endswith("\\"):
                current[-1] = current[-1][:-1].rstrip() + " " + stripped
            else:
                current.append(stripped.removeprefix("$ "))
    return blocks


def doc_commands() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """(python commands to run, shell scripts named, "needs a run first" lines), each as
    (doc, text)."""
    runnable, scripts, needs = [], [], []
    for doc in DOCS:
        name = str(doc.relative_to(ROOT))
        for block in shell_blocks(doc.read_text()):
            marks = [NEEDS_RUN.match(line) for line in block]
            needs += [(name, m.group(1)) for m in marks if m]
            for line in block:
                if SHELL_SCRIPT.match(line):
                    scripts.append((name, SHELL_SCRIPT.match(line).group(1)))
                if PYTHON_COMMAND.match(line) and not any(marks):
                    runnable.append((name, line))
    return runnable, scripts, needs


def as_run(command: str) -> str:
    """The command as this test runs it: a long script's --help (LONG_SCRIPTS)."""
    for script in LONG_SCRIPTS:
        match = re.match(rf"^({PYTHON}\s+{re.escape(script)})\b", command)
        if match:
            return f"{match.group(1)} --help"
    return command


def fresh_copy(to: Path) -> Path:
    """The repository's tracked files, as they are in the working tree, under `to`; with a
    .venv/bin/python and python/python3 on PATH that are this interpreter."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    bin_dir = to / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for alias in ("python", "python3"):
        (bin_dir / alias).symlink_to(sys.executable)
    return to


def test_shell_blocks_read_continuations_and_skip_other_languages():
    text = ("```python\npython -m common.analyze x\n```\n"
            "```bash\n$ python -m common.compare a \\\n    b\n# needs a run first: y\n```\n")
    assert shell_blocks(text) == [["python -m common.compare a b", "# needs a run first: y"]]
    assert as_run("python scripts/bench_analyze.py --repeats 5") == \
        "python scripts/bench_analyze.py --help"


def test_needs_a_run_names_a_pair_that_exists():
    """A "needs a run first" line says which run; where it names a pair, the pair exists."""
    _, _, needs = doc_commands()
    assert needs, "no block says it needs a run: the marker reader is broken"
    for doc, what in needs:
        match = re.match(r"\./scripts/run_demos\.sh\s+([a-z_]+)\b", what)
        if match:
            assert (ROOT / "demos" / match.group(1) / "bad.py").is_file(), (doc, what)
        else:
            assert what.startswith(("./scripts/run_demos.sh", "the snippet")), (doc, what)


def test_shell_scripts_named_exist():
    _, scripts, _ = doc_commands()
    assert scripts, "the docs name no set-up script"
    for doc, script in scripts:
        path = ROOT / script
        assert path.is_file() and os.access(path, os.X_OK), (doc, script)


def failing_doc_commands(tmp_path: Path) -> list[str]:
    """Every runnable doc command, run in a fresh copy under `tmp_path`: one line for each that
    failed, naming its doc, the command, its exit code and its last line of output."""
    runnable, _, _ = doc_commands()
    assert runnable, "no runnable command found: the block reader is broken"
    commands = sorted({as_run(command) for _, command in runnable})
    where = {as_run(command): doc for doc, command in runnable}
    clone = fresh_copy(tmp_path / "clone")
    env = {**os.environ, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(clone), "MPLBACKEND": "Agg"}

    def run(command: str) -> tuple[str, subprocess.CompletedProcess]:
        return command, subprocess.run(["bash", "-c", command], cwd=clone, env=env, text=True,
                                       capture_output=True, timeout=COMMAND_TIMEOUT_S)

    with ThreadPoolExecutor(WORKERS) as pool:
        return [f"{where[command]}: `{command}` exit {done.returncode}: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}"
                for command, done in pool.map(run, commands) if done.returncode != 0]


background_job("doc_command_failures", failing_doc_commands)  # once the smoke run has ended


@pytest.fixture(scope="module")
def doc_command_failures(tmp_path_factory) -> list[str]:
    return background_result("doc_command_failures", tmp_path_factory)


def test_every_unmarked_command_runs_on_a_fresh_clone(doc_command_failures):
    assert not doc_command_failures, "\n".join(doc_command_failures)


@pytest.mark.parametrize("path", ["traces/item_sync/bad", "traces/item_sync"])
def test_a_missing_run_names_the_committed_run_of_the_pair(path):
    """A walkthrough's command on a fresh clone (no run yet): one line, exit 2, naming the command
    that makes the run and the committed reference run of the same pair."""
    module = "common.analyze" if path.endswith("bad") else "common.compare"
    done = subprocess.run([sys.executable, "-m", module, path], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if (ROOT / path).exists():
        pytest.skip(f"{path} exists here (a run was made); a fresh clone has none")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "./scripts/run_demos.sh item_sync makes it" in lines[0]
    assert f"traces/reference/h100/{path.removeprefix('traces/')}" in lines[0]
