"""Finds graded solutions that copy the book: a run of K consecutive lines that
a solution shares with a code cell of the book or a file the book shows, once
names, literals, comments, docstrings and layout are normalised away. Renaming
variables or reflowing a statement does not hide a copy; a short common idiom
(`return x`) is shorter than K and does not count."""
import io
import re
import keyword
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

RUN = 4  # lines; three shared lines are common idiom, four are a copied block

_CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.M | re.S)
_LITERALINCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)", re.M)
_SKIP_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
                tokenize.ENDMARKER}
# Python 3.12 splits f-strings into several tokens; each stands for a string.
_FSTRING_TOKENS = {getattr(tokenize, name) for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
                   if hasattr(tokenize, name)}

_BEFORE_SIGN = {"(", "[", "{", ",", "=", ":", "return", "**", "*", "/", "lambda"}


@dataclass(frozen=True)
class Line:
    where: str  # file (and cell) the line comes from
    number: int  # first physical line of the statement, within that source
    text: str  # the statement as written
    shape: str  # the statement normalised


def _cell_body(text):
    """A code cell without its MyST options (a `---` YAML block or `:key:` lines)."""
    lines = text.split("\n")
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
        lines = lines[end + 1:]
    while lines and re.match(r"^:\w[\w-]*:", lines[0]):
        lines = lines[1:]
    return "\n".join(lines)


def _token_shape(tok):
    if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
        return "_"
    if tok.type == tokenize.NUMBER:
        return "0"
    if tok.type == tokenize.STRING or tok.type in _FSTRING_TOKENS:
        return "'s'"
    return tok.string


def normalised_lines(source, where):
    """One Line per logical statement of `source`; docstrings and bare strings
    are dropped. IPython magics and shell escapes are skipped; a source that
    does not tokenize gives nothing."""
    source = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.split("\n"))
    physical = source.split("\n")
    out, shape, start = [], [], None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source + "\n").readline):
            if tok.type in _SKIP_TOKENS:
                continue
            if tok.type == tokenize.NEWLINE:
                if shape and not all(s == "'s'" for s in shape):
                    text = " ".join(ln.strip() for ln in physical[start - 1:tok.start[0]])
                    out.append(Line(where, start, text, " ".join(shape)))
                shape, start = [], None
                continue
            if start is None:
                start = tok.start[0]
            if tok.string in "()":
                continue  # redundant parentheses and line continuations are layout
            token = _token_shape(tok)
            if token == "0" and shape[-1:] in (["-"], ["+"]) and (len(shape) == 1 or shape[-2] in _BEFORE_SIGN):
                shape.pop()  # a signed literal is one literal: axis=-1 and axis=1 look alike
            shape.append(token)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return out


def book_sources(repo):
    """(where, code) for every code cell of the book and every file it shows or ships as helpers."""
    repo = Path(repo).resolve()
    sources, files = [], set()
    for page in sorted((repo / "book").rglob("*.md")):
        text = page.read_text()
        for i, match in enumerate(_CODE_CELL.finditer(text), start=1):
            sources.append((f"{page.relative_to(repo)} (code cell {i})", _cell_body(match.group(1))))
        for target in _LITERALINCLUDE.findall(text):
            path = (page.parent / target).resolve()
            if path.is_file() and path.suffix == ".py":
                files.add(path)
    for package in ("bookutils", "coursekit"):
        files.update(path.resolve() for path in (repo / package).glob("*.py"))
    sources += [(str(path.relative_to(repo)), path.read_text()) for path in sorted(files)]
    return sources


def solution_sources(notebook):
    """(grade_id, code) for the code between the solution markers of each solution cell."""
    nb = nbformat.read(notebook, as_version=4)
    found = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("solution"):
            continue
        match = re.search(r"### BEGIN SOLUTION\n(.*?)^\s*### END SOLUTION", cell.source, re.S | re.M)
        if match:
            found.append((meta.get("grade_id", "?"), _dedent(match.group(1))))
    return found


def _dedent(code):
    lines = [ln for ln in code.split("\n") if ln.strip()]
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines), default=0)
    return "\n".join(ln[indent:] for ln in code.split("\n"))


class BookIndex:
    """Every run of RUN consecutive normalised statements of the book, with where it is."""

    def __init__(self, sources, run=RUN):
        self.run = run
        self.runs = {}
        for where, code in sources:
            lines = normalised_lines(code, where)
            for i in range(len(lines) - run + 1):
                key = tuple(line.shape for line in lines[i:i + run])
                self.runs.setdefault(key, lines[i:i + run])

    def copies(self, code, where="solution"):
        """[(solution lines, book lines)] for each run of `code` found in the book."""
        lines = normalised_lines(code, where)
        hits = []
        for i in range(len(lines) - self.run + 1):
            key = tuple(line.shape for line in lines[i:i + self.run])
            if key in self.runs:
                hits.append((lines[i:i + self.run], self.runs[key]))
        return hits


def describe(hits):
    """A report a person can check: each shared run, side by side."""
    parts = []
    for ours, theirs in hits:
        parts.append(f"{ours[0].where}, statement at line {ours[0].number}, matches "
                     f"{theirs[0].where}, line {theirs[0].number}:\n"
                     + "\n".join(f"    {a.text}\n  ~ {b.text}" for a, b in zip(ours, theirs)))
    return "\n".join(parts)


def index_of(repo):
    return BookIndex(book_sources(Path(repo)))
