"""The docs' form, held: the walkthroughs' length, headings and glossary link, sentence and table
cell length, common/README.md's length, and text that speaks of the project only.

The checkers are plain functions over a Markdown text, each returning what it found wrong (empty:
nothing), so that a test can feed them bad samples and see them fail. What they read:
- prose: the text outside fenced code blocks (``` or ~~~), outside the generated
  `<!-- reference-table:<tag> begin ... end -->` blocks and other HTML comments, without image
  lines (`![...](...)`); a link `[text](target)` counts as its text alone.
- a sentence: prose is cut into pieces at blank lines, headings, list items and table rows; a
  piece's lines are joined with spaces, then split after ".", "?" or "!" (and any closing `*`,
  `_`, `)`, `"`, `]`) followed by a space and a capital letter or a backtick (markup such as
  `**` or `[` may come before it). "e.g. Foo" therefore ends a sentence: the split errs towards
  shorter sentences, never longer ones.
- a word: a whitespace-separated token (`torch.compile`, `1.5×` and `|` are one word each).
- a table cell: the text between two unescaped `|` on a prose line that starts with `|`, the
  `|---|` separator rows aside.
- a file's lines and words (the walkthroughs' and common/README.md's limits): every line and
  every word of the file as it is, code and tables included.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SENTENCE_MAX_WORDS = 40
CELL_MAX_WORDS = 25
WALKTHROUGH_MAX_LINES = 130
WALKTHROUGH_MAX_WORDS = 1300
COMMON_README_MAX_WORDS = 5000
WALKTHROUGH_H2 = ("## How it works", "## The diff", "## Where to look", "## The numbers",
                  "## What it costs", "## Next")
GLOSSARY = ROOT / "common" / "GLOSSARY.md"
WALKTHROUGH_GLOSSARY_LINK = "../../common/GLOSSARY.md"
TOP_GLOSSARY_LINK = "common/GLOSSARY.md"

# Text about how the work was done, not about the project: a project's docs name no tracker
# numbers, no folders outside the repository, and no circumstances of the people or machines
# that wrote them ("needs a CUDA GPU; not yet run on one" says what a missing number needs).
# Each entry: (what it is, a case-insensitive pattern). A reference into another project's
# tracker, `pytorch/kineto#1165`, is a citation, not one of ours: a "#12" right after a word or
# "/" is not counted, nor a Markdown anchor such as "#1-setup".
PROCESS_PHRASINGS = (
    ("an issue number", r"\b(?:issues?|pull requests?|PRs?|tickets?) #?\d+\b"),
    ("an issue number", r"(?<![\w/&])#\d+(?![\w-])"),
    ("a path outside the repository", r"\.\./shared\b"),
    ("a session", r"\bsessions?\b"),
    ("a lent machine", r"\blent\b"),
    ("a borrowed machine", r"\bborrow(?:s|ed|ing)?\b"),
    ("a helper", r"\bhelpers?\b"),
    ("an agent", r"\bagents?\b"),
    ("a GPU to come", (r"\b(?:when|once|until|as soon as) (?:a|one|the|some) (?:CUDA )?GPU "
                       r"(?:is|was|becomes|gets) (?:available|at hand|free)\b")),
    ("a GPU to come", r"\bGPUs? (?:is|are|was|were) at hand\b"),
    ("a GPU to come", (r"\b(?:when|once|until) (?:we|I|you) (?:have|get|had|got) (?:a|one) "
                       r"(?:CUDA )?GPU\b")),
)

FENCE = re.compile(r"^\s*(```|~~~)")
GENERATED_BLOCK = re.compile(r"<!-- reference-table:(\S+) begin.*?<!-- reference-table:\1 end -->",
                             re.DOTALL)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
PIECE_START = re.compile(r"^\s*(?:#{1,6}\s|[-*+]\s|\d+[.)]\s|\|)")
SENTENCE_END = re.compile(r"(?<=[.?!])[*_)\"\]]*\s+(?=[*_\[\"]*[A-Z`])")
SEPARATOR_ROW = re.compile(r"^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")


def words(text: str) -> int:
    return len(text.split())


def prose_lines(text: str) -> list[str]:
    """`text`'s prose lines (module docstring): code, generated blocks, comments and images out,
    links reduced to their text. A removed line leaves a blank one, so it ends a piece."""
    text = GENERATED_BLOCK.sub(lambda m: "\n" * m[0].count("\n"), text)
    text = HTML_COMMENT.sub(lambda m: "\n" * m[0].count("\n"), text)
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        elif fenced or line.lstrip().startswith("!["):
            lines.append("")
        else:
            lines.append(LINK.sub(r"\1", IMAGE.sub("", line)))
    return lines


def sentences(text: str) -> list[str]:
    """The prose's sentences (module docstring), table rows aside."""
    pieces, current = [], []
    for line in prose_lines(text) + [""]:
        if not line.strip() or PIECE_START.match(line):
            if current:
                pieces.append(" ".join(current))
            current = [] if not line.strip() or line.lstrip().startswith("|") else [line.strip()]
            if line.lstrip().startswith("#"):  # a heading is a piece of its own
                pieces.append(line.strip())
                current = []
        else:
            current.append(line.strip())
    return [s for piece in pieces for s in SENTENCE_END.split(piece) if s.strip()]


def table_cells(text: str) -> list[str]:
    cells = []
    for line in prose_lines(text):
        line = line.strip()
        if line.startswith("|") and not SEPARATOR_ROW.match(line):
            cells += re.split(r"(?<!\\)\|", line.strip("|"))
    return [cell.strip() for cell in cells]


def long_sentences(text: str, limit: int = SENTENCE_MAX_WORDS) -> list[str]:
    return [f"{words(s)} words: {s[:80]}..." for s in sentences(text) if words(s) > limit]


def long_cells(text: str, limit: int = CELL_MAX_WORDS) -> list[str]:
    return [f"{words(c)} words: {c[:80]}..." for c in table_cells(text) if words(c) > limit]


def heading_problems(text: str, expected: tuple[str, ...] = WALKTHROUGH_H2) -> list[str]:
    """What differs between the H2 headings outside code and `expected`, in order."""
    found, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            found.append(line.rstrip())
    if found == list(expected):
        return []
    return [f"H2 headings {found}, expected {list(expected)}"]


def size_problems(text: str, max_lines: int | None, max_words: int) -> list[str]:
    problems = []
    if max_lines is not None and len(text.splitlines()) > max_lines:
        problems.append(f"{len(text.splitlines())} lines (at most {max_lines})")
    if words(text) > max_words:
        problems.append(f"{words(text)} words (at most {max_words:,})")
    return problems


def link_problems(text: str, target: str) -> list[str]:
    """Empty when `text` links `target` (a Markdown link, an anchor after it allowed)."""
    if re.search(rf"\]\({re.escape(target)}(?:#[^)]*)?\)", text):
        return []
    return [f"no link to {target}"]


def process_phrasings(text: str) -> list[str]:
    """Each PROCESS_PHRASINGS match in `text`, with what it is."""
    return [f"{what}: {m[0]!r}" for what, pattern in PROCESS_PHRASINGS
            for m in re.finditer(pattern, text, re.IGNORECASE)]


# --- the files ---------------------------------------------------------------------------------

WALKTHROUGHS = sorted((ROOT / "demos").glob("*/README.md"))
PROJECT_DOCS = sorted({ROOT / "README.md", ROOT / "common" / "README.md", GLOSSARY,
                       *(ROOT / "traces").glob("**/README.md"),
                       *(ROOT / "demos").glob("**/README.md")})


def shown(path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("readme", WALKTHROUGHS, ids=lambda p: p.parent.name)
def test_walkthrough_form(readme):
    text = readme.read_text()
    problems = (size_problems(text, WALKTHROUGH_MAX_LINES, WALKTHROUGH_MAX_WORDS)
                + heading_problems(text) + link_problems(text, WALKTHROUGH_GLOSSARY_LINK)
                + long_sentences(text) + long_cells(text))
    assert not problems, f"{shown(readme)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", ["README.md", "traces/README.md", "traces/reference/README.md"])
def test_front_docs_form(doc):
    """The sentence and cell limits hold for the front door and the traces' READMEs too; the
    front door links the glossary."""
    text = (ROOT / doc).read_text()
    problems = long_sentences(text) + long_cells(text)
    if doc == "README.md":
        problems += link_problems(text, TOP_GLOSSARY_LINK)
    assert not problems, f"{doc}:\n" + "\n".join(problems)


def test_common_readme_length_and_glossary():
    text = (ROOT / "common" / "README.md").read_text()
    problems = size_problems(text, None, COMMON_README_MAX_WORDS)
    if not GLOSSARY.is_file():
        problems.append(f"{shown(GLOSSARY)} does not exist")
    assert not problems, "common/README.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", PROJECT_DOCS, ids=shown)
def test_docs_speak_of_the_project(doc):
    if not doc.is_file():
        pytest.skip(f"{shown(doc)} does not exist (test_common_readme_length_and_glossary)")
    found = process_phrasings(doc.read_text())
    assert not found, f"{shown(doc)}:\n" + "\n".join(found)


@pytest.mark.parametrize("module", ["common.analyze", "common.compare"])
def test_help_speaks_of_the_project(module):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "usage" in result.stdout, result.stderr
    found = process_phrasings(result.stdout + result.stderr)
    assert not found, f"{module} --help:\n" + "\n".join(found)


# --- each checker fails on a bad sample, and passes the sample at its limit --------------------

def sentence_of(n: int) -> str:
    """A sentence of `n` words: "Start word ... end."."""
    return " ".join(["Start"] + ["word"] * (n - 2) + ["end."])


def test_a_long_sentence_is_caught_and_one_at_the_limit_is_not():
    at_limit = f"First line of {sentence_of(37)}\n`Next` sentence here."  # 40 words, wrapped
    assert long_sentences(at_limit) == []
    over = f"First line of {sentence_of(38)}\nNext sentence."  # 41 words across two lines
    assert len(long_sentences(over)) == 1 and long_sentences(over)[0].startswith("41 words")
    # Two sentences of 30 are two; a paragraph break, a list item or a heading ends a piece.
    assert long_sentences(f"{sentence_of(30)} {sentence_of(30)}") == []
    assert long_sentences(f"{sentence_of(30)[:-1]}\n\n{sentence_of(30)}") == []
    assert long_sentences(f"{sentence_of(30)[:-1]}:\n- {sentence_of(30)}") == []
    assert long_sentences(f"## {sentence_of(30)[:-1]}\n{sentence_of(30)}") == []
    # A lower-case word after a full stop does not start a sentence ("1.5 x", "e.g. foo").
    assert len(long_sentences(f"{sentence_of(30)} and {sentence_of(11).lower()}")) == 1
    # Code blocks, generated blocks, images and link targets are not prose.
    assert long_sentences(f"```bash\n{sentence_of(50)}\n```\n") == []
    assert long_sentences(f"<!-- reference-table:h100 begin x -->\n{sentence_of(50)}\n"
                          "<!-- reference-table:h100 end -->\n") == []
    assert long_sentences(f"![{sentence_of(50)}](trace.png)") == []
    assert long_sentences(f"[a link]({'/'.join(['x'] * 20)} " + "y " * 20 + ") ends.") == []


def test_a_long_cell_is_caught_and_one_at_the_limit_is_not():
    header = "| pair | result |\n|---|---:|\n"
    assert long_cells(f"{header}| a | {' '.join(['w'] * 25)} |\n") == []
    caught = long_cells(f"{header}| a | {' '.join(['w'] * 26)} |\n")
    assert len(caught) == 1 and caught[0].startswith("26 words")
    assert long_cells(f"{header}| a | b \\| {' '.join(['w'] * 24)} |\n")  # "\|" is in the cell
    assert long_cells(f"```\n{header}| a | {' '.join(['w'] * 26)} |\n```\n") == []


def test_headings_out_of_order_or_extra_are_caught():
    body = "\n\ntext\n\n".join(WALKTHROUGH_H2)
    assert heading_problems(f"# Title\n\n{body}\n\n### A third level is free\n") == []
    swapped = list(WALKTHROUGH_H2)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert heading_problems("\n\n".join(swapped))
    assert heading_problems(f"{body}\n\n## Reference run (GPU)\n")
    assert heading_problems("\n\n".join(WALKTHROUGH_H2[:-1]))
    assert heading_problems(f"{body}\n\n```\n## a comment in code\n```\n") == []


def test_length_and_links_are_caught():
    assert size_problems("line\n" * 131, WALKTHROUGH_MAX_LINES, WALKTHROUGH_MAX_WORDS)
    assert size_problems("line\n" * 130, WALKTHROUGH_MAX_LINES, WALKTHROUGH_MAX_WORDS) == []
    assert size_problems("w " * 1301, WALKTHROUGH_MAX_LINES, WALKTHROUGH_MAX_WORDS)
    assert size_problems("w " * 5001, None, COMMON_README_MAX_WORDS)
    assert link_problems("see [the glossary](../../common/GLOSSARY.md#verdict)",
                         WALKTHROUGH_GLOSSARY_LINK) == []
    assert link_problems("see ../../common/GLOSSARY.md", WALKTHROUGH_GLOSSARY_LINK)
    assert link_problems("[g](common/GLOSSARY.md)", WALKTHROUGH_GLOSSARY_LINK)


@pytest.mark.parametrize("bad", [
    "as asked in issue 38", "fixed (#38).", "see Issue #7", "PR 12 moved it",
    "the traces in ../shared/traces", "in this session", "a machine lent to us",
    "a borrowed H100", "the helper wrote it", "an agent ran it",
    "to be measured when a GPU is available", "once a GPU is at hand",
    "until the GPU becomes free", "when we get a GPU"])
def test_process_phrasings_are_caught(bad):
    assert process_phrasings(f"Some text, {bad}, more text.")


@pytest.mark.parametrize("fine", [
    "see pytorch/kineto#1165 upstream", "[the H100](README.md#1-on-the-h100)",
    "a plain sentence about the GPU", "needs a CUDA GPU; not yet run on one",
    "its lentil soup", "the issues it shows", "GPU idle 93.3 %", "## The numbers"])
def test_project_text_is_not_caught(fine):
    assert process_phrasings(fine) == []
