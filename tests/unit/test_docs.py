"""The docs say only what the repository has: every `mldiag ...` line of a bash block in
README.md, CONTRIBUTING.md and docs/ parses with the real CLI parser, every relative link
points at a file (and heading) that exists, every `scripts/...` path exists, every
`mldiag.<module>[.<name>]` the prose cites can be imported, every module of ours a bash block
runs with `python -m` exists and runs, and every count of collection tools the prose states is
the registry's.

Command lines are parsed, never run: `mldiag.cli.main.build_parser()` is the parser `mldiag`
itself uses, and `_gcloud.normalise` is the step it takes after parsing. Placeholders such as
RUN or SESSION parse as the values they stand for.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mldiag.cli import _gcloud
from mldiag.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = sorted(p for p in [REPO / "README.md", REPO / "CONTRIBUTING.md",
                               *(REPO / "docs").rglob("*.md")] if p.exists())
SHELLS = {"bash", "sh", "shell"}
# Between two commands of one line; `(`/`)` open and close subshells.
SEPARATORS = {"|", "||", "&&", ";", "&", "|&", "(", ")"}
REDIRECTS = {">", ">>", "<", ">&", "<&", "&>", ">|"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


@dataclass(frozen=True)
class Line:
    """One logical line of a shell block (continuations joined), and where it starts."""

    doc: Path
    lineno: int
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.lineno}"


def _fences(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(info string, first content line number, content lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).lower()
        body, start = [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line)
            i += 1
        i += 1
        yield info, start, body


def shell_lines(doc: Path, text: str | None = None) -> list[Line]:
    """The logical lines of every bash block of `doc`, continuations joined."""
    text = doc.read_text() if text is None else text
    out: list[Line] = []
    for info, start, body in _fences(text):
        if info not in SHELLS:
            continue
        pending, first, heredoc = "", 0, ""
        for n, raw in enumerate(body, start):
            line = raw
            if heredoc:  # a here-document's body is input, not commands
                heredoc = "" if line.strip() == heredoc else heredoc
                continue
            if m := HEREDOC.search(line):
                heredoc = m.group(1)
            if not pending:
                first = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append(Line(doc, first, pending + line))
            pending = ""
        if pending:
            out.append(Line(doc, first, pending))
    return out


def _strip_comment(text: str) -> str:
    """The line without its comment: `#` at the start of a word, outside quotes."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def mldiag_argvs(text: str) -> list[list[str]]:
    """The argv (after `mldiag`) of every mldiag command on one shell line: after env
    prefixes, in pipes and lists, inside `$(...)` (which stands for one value elsewhere)."""
    text = _strip_comment(text)
    found: list[list[str]] = []
    while m := SUBSTITUTION.search(text):
        found += mldiag_argvs(m.group(1))
        text = text[:m.start()] + "SUBSTITUTED" + text[m.end():]
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = [*lexer, ";"]
    except ValueError as e:  # an unclosed quote: bash would not run it either
        raise ValueError(f"{e}: {text!r}") from None
    segment: list[str] = []
    for token in tokens:
        if token not in SEPARATORS:
            segment.append(token)
            continue
        words: list[str] = []
        for i, word in enumerate(segment):
            after = segment[i + 1] if i + 1 < len(segment) else ""
            if word in REDIRECTS or (i and segment[i - 1] in REDIRECTS):
                continue  # a redirection and its target
            if word.isdigit() and after in REDIRECTS:
                continue  # the `2` of `2>&1`
            words.append(word)
        while words and ENV_ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words and words[0].rsplit("/", 1)[-1] == "mldiag":
            found.append(words[1:])
        segment = []
    return found


def parse_error(argv: list[str]) -> str | None:
    """None when the real parser takes `argv`, else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _gcloud.normalise(build_parser().parse_args(argv))
    except SystemExit as e:
        if e.code in (0, None):  # --help, --version
            return None
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(e)
    return None


def _commands() -> list[tuple[Line, list[str]]]:
    return [(line, argv) for doc in DOC_FILES for line in shell_lines(doc)
            for argv in mldiag_argvs(line.text)]


COMMANDS = _commands()


def test_the_docs_have_commands_to_check() -> None:
    # An extractor that finds nothing would pass every check below.
    assert len(COMMANDS) >= 40, [line.where() for line, _ in COMMANDS]
    docs = {line.doc.name for line, _ in COMMANDS}
    assert "README.md" in docs


@pytest.mark.parametrize(("line", "argv"), COMMANDS,
                         ids=[f"{line.where()}:{' '.join(argv[:2])}" for line, argv in COMMANDS])
def test_command_parses(line: Line, argv: list[str]) -> None:
    error = parse_error(argv)
    assert error is None, f"{line.where()}: `mldiag {' '.join(argv)}`: {error}"


def test_the_readme_is_a_front_door_to_a_manual() -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 300
    # The title, then the two commands anyone starts with.
    assert readme[:3] == ["# mldiag", "", "```bash"]
    assert readme[3].startswith("scripts/demo ") and readme[4].startswith("scripts/test ")
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert {"console.md", "capture.md", "porting.md", "analysis.md", "diff.md",
            "configuration.md", "architecture.md", "deploy-gcp.md", "benchmarks.md"} <= pages
    assert (REPO / "CONTRIBUTING.md").exists()


# The extractor and the check on lines whose verdict is known.


@pytest.mark.parametrize(("text", "argvs"), [
    (".venv/bin/mldiag up --port 0   # comment: mldiag fake --x", [["up", "--port", "0"]]),
    ("MLDIAG_BACKEND=gcp A=b mldiag roles list", [["roles", "list"]]),
    ("TOKEN=$(mldiag tokens create --role viewer) && curl -H \"x: $TOKEN\" http://h/#top",
     [["tokens", "create", "--role", "viewer"]]),
    ("mldiag sessions list --json | head -3; mldiag runs list 2>&1 > /dev/null",
     [["sessions", "list", "--json"], ["runs", "list"]]),
    ("gcloud pubsub topics publish t --message='{\"a\": \"mldiag up\"}'", []),
    ("echo mldiag up", []),
])
def test_argvs_are_found_where_bash_would_run_them(text: str, argvs: list[list[str]]) -> None:
    assert mldiag_argvs(text) == argvs


def test_continuations_join_and_indented_fences_count(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    text = ("- a list item\n\n  ```bash\n  mldiag capture s1 --run r \\\n"
            "      --duration 2s\n  python - <<'EOF'\n  mldiag = 'not a command\n  EOF\n"
            "  ```\n\n```python\nmldiag = 1\n```\n")
    lines = shell_lines(doc, text)
    assert [(ln.lineno, mldiag_argvs(ln.text)) for ln in lines] == [
        (4, [["capture", "s1", "--run", "r", "--duration", "2s"]]), (6, [])]


@pytest.mark.parametrize("argv", [
    ["analyse", "PATH"],                          # misspelt subcommand
    ["analyze", "PATH", "--ouput", "DIR"],        # misspelt flag
    ["sessions", "lst"],
    ["capture", "s1", "--run", "r", "--host-tracer-level", "loud"],
])
def test_a_wrong_command_fails(argv: list[str]) -> None:
    assert parse_error(argv)


def test_a_placeholder_parses_as_a_value() -> None:
    assert parse_error(["diff", "RUN/SESSION", "RUN/OTHER", "--out", "DIR"]) is None


# Links, paths and modules.


def _prose(text: str) -> str:
    """The text outside fenced blocks."""
    out, fenced = [], ""
    for line in text.splitlines():
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m and (not fenced or m.group(1).startswith(fenced)):
            fenced = "" if fenced else m.group(1)
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def slugs(doc: Path) -> set[str]:
    """GitHub's anchors of `doc`'s headings: lower case, punctuation dropped, spaces to `-`,
    repeats numbered."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _prose(doc.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def link_errors(doc: Path, root: Path = REPO) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", _prose(doc.read_text()))  # `csv[a](b)` is no link
    errors = []
    for target in LINK.findall(prose) + REFERENCE.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            errors.append(f"{target}: no such file")
        elif root not in dest.parents:
            errors.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            errors.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return errors


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: str(d.relative_to(REPO)))
def test_relative_links_point_at_what_exists(doc: Path) -> None:
    assert link_errors(doc) == []


SCRIPT_PATH = re.compile(r"(?<![\w/.-])scripts/[\w./-]*")


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: str(d.relative_to(REPO)))
def test_scripts_named_exist(doc: Path) -> None:
    named = {m.rstrip(".,:-") for m in SCRIPT_PATH.findall(doc.read_text())}
    assert [p for p in sorted(named) if not (REPO / p).exists()] == []


# Not a Kubernetes label or annotation key (`mldiag.dev/run`), which a "/" follows.
MODULE = re.compile(r"`[^`\n]*?\b(mldiag(?:\.[A-Za-z_]\w*)+)(?![\w/])")


def unresolved(dotted: str) -> str | None:
    """None when `dotted` is a module, or a name inside one (`module.Class.method`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return f"{dotted}: {'.'.join(parts[:cut])} has no {name}"
            obj = getattr(obj, name)
        return None
    return f"{dotted}: no such module"


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: str(d.relative_to(REPO)))
def test_modules_named_exist(doc: Path) -> None:
    named = sorted(set(MODULE.findall(doc.read_text())))
    assert [e for e in map(unresolved, named) if e] == []


def test_the_checks_catch_what_is_broken(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (tmp_path / "outside.md").write_text("# Out\n")
    doc = root / "x.md"
    doc.write_text("# A title: `x`\n\n[ok](#a-title-x) [gone](missing.md) [anchor](#nowhere) "
                   "[up](../outside.md) [web](https://example.com/a) `csv[x](y)`\n")
    assert link_errors(doc, root=root) == [
        "missing.md: no such file", "#nowhere: no heading #nowhere in x.md",
        "../outside.md: outside the repository"]
    assert unresolved("mldiag.cli.main.build_parser") is None
    assert unresolved("mldiag.cli.mian") is not None
    assert unresolved("mldiag.cli.main.no_such_name") is not None


# The collection tools in prose: a count is the registry's, and the manual names every tool.


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: str(d.relative_to(REPO)))
def test_counts_of_collection_tools_are_the_registrys(doc: Path) -> None:
    from mldiag.analysis.collection import registry
    from tests.helpers.counts import TOOL_COUNT

    stated = [int(m.group(1)) for m in TOOL_COUNT.finditer(doc.read_text())]
    assert [n for n in stated if n != len(registry.TOOLS)] == []


def test_the_manual_names_every_collection_tool() -> None:
    from mldiag.analysis.collection import registry

    named = set(re.findall(r"`(\w+)`", (REPO / "docs" / "analysis.md").read_text()))
    assert [t.name for t in registry.TOOLS if t.name not in named] == []


RUN_MODULE = re.compile(r"\bpython[\d.]*\s+-m\s+((?:mldiag|tests)(?:\.\w+)+)")


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda d: str(d.relative_to(REPO)))
def test_our_modules_run_with_python_m_exist_and_run(doc: Path) -> None:
    # `python -m tests.unit.test_findings_golden`: a module of ours that a bash block runs
    # exists and does something when run (it has a `__main__` block, or is a package's).
    import importlib.util

    found = {m for line in shell_lines(doc) for m in RUN_MODULE.findall(_strip_comment(line.text))}
    broken = []
    for module in sorted(found):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            broken.append(f"{module}: no such module")
        elif spec.submodule_search_locations is not None:
            if importlib.util.find_spec(f"{module}.__main__") is None:
                broken.append(f"{module}: a package without __main__")
        elif "__main__" not in Path(spec.origin).read_text():
            broken.append(f"{module}: does nothing when run")
    assert broken == []


def test_the_goldens_commands_are_checked() -> None:
    commands = {m for line in shell_lines(REPO / "CONTRIBUTING.md")
                for m in RUN_MODULE.findall(line.text)}
    assert {"tests.unit.test_findings_golden", "tests.unit.report.make_goldens"} <= commands
