"""Reads the math of the book's pages and finds symbols used with a meaning other
than the one book/notation.md gives them.

A page gives a symbol a meaning in three ways, and each has its rule:

- words next to the symbol ("a batch of $B$ sequences", "the mask $M$"): a word
  that names a meaning (batch, mask, cache, log-sum-exp, ...) must be one of the
  symbol's own words;
- an equation with the symbol alone on the left ("$D = 64$"): its right-hand side
  must have the form the symbol's meaning allows (D is a row sum, not a number);
- the symbol's place in a formula: a temperature divides the scores and never
  multiplies a matrix, a budget is never multiplied by a number of heads, a
  fast-memory size has no entries and is not added to scores.

A symbol with a subscript that names something else (d_k, B_r, n_q, N_B) is
another symbol and is not checked; subscripts that index (L_i, M_{ij}) are the
same symbol. In the exercises, a tensor's shape written as code, `(B, H, N, D)`,
is read as a formula: its axes are the symbols of the table too.

Besides symbols, a page's wording is checked in two ways: a claim that holds only
under a condition says the condition in the same paragraph (CLAIMS: softmax
weights are positive in exact arithmetic only), and an abbreviation is defined
where the course first uses it (ABBREVIATIONS)."""
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

INDEX_SUBSCRIPTS = {"i", "j", "ij", "t"}

# Words between a noun and the symbol it names: "a batch of $B$", "the mask $M$".
ARTICLES = {"of", "the", "a", "an", "its", "their", "each", "every", "all", "this", "that", "size", "number"}
# Words after a symbol that introduce what it names: "$B$ is the batch size", "$N$ for the length".
DEFINING = {"is", "are", "be", "denotes", "denote", "stands", "means", "for"}
# Nouns that count things without saying what they are: "$H$ key rows" counts rows of keys.
GENERIC = {"values", "numbers", "entries", "rows", "columns", "elements", "items", "copies", "times", "pairs"}
# Words that start something other than a noun phrase after a symbol.
LINKS = {"and", "or", "in", "on", "at", "to", "from", "with", "by", "into", "over", "per", "as", "than", "that",
         "which", "where", "when", "while", "like", "of"}


@dataclass(frozen=True)
class Rule:
    latex: str                   # how the symbol is written in the table and the pages
    words: frozenset             # nouns that may stand next to it
    equals: str = r".*"          # what may follow "symbol =" (a regex matched at the start)
    forbidden: tuple = ()        # (regex on a formula, what the match would mean)


def _w(text):
    return frozenset(text.split())


RULES = {
    "n": Rule("n", _w("tokens token sequence sequences length lengths keys key queries query positions position "
                      "steps"),
              equals=r"(\d|\d*\s*d\b|4d/H)"),
    "N": Rule("N", _w("tokens token sequence sequences length lengths keys key queries query positions position "
                      "steps"),
              equals=r"(\d|T\s*B_r)"),
    "d": Rule("d", _w("width dimension dimensions head features coordinates"),
              equals=r"(\d|B_c|d_k|d_\\text\{model\})"),
    "tau": Rule(r"\tau", _w("temperature"),
                equals=r"(\\sqrt\{d(_k|_h)?\}|\d|1\s*/\s*\d)",
                forbidden=((r"\\tau(\s*\\[,;:!])*\s*(\\cdot\s*)?([A-Za-z(]|\\frac|\\sqrt)",
                            "multiplies what follows it (a temperature divides the scores)"),)),
    "D": Rule("D", _w("sums sum"),
              equals=r"(\\operatorname\{rowsum\}|\\sum|dO)",
              forbidden=((r"(\d|\^\{?\d\}?|\\cdot)\s*D(?![A-Za-z_])", "is a factor of a count (a dimension)"),
                         (r"D(?![A-Za-z_])\s*\\cdot", "is a factor of a count (a dimension)"),
                         (r"[(,]\s*D\s*[,)]", "is an axis of a tensor's shape (a head width)"))),
    "B": Rule("B", _w("budget bytes memory GiB"),
              equals=r"(\d|2\^)",
              forbidden=((r"B(?![A-Za-z_])\s*\\cdot", "is multiplied like a count of sequences"),
                         (r"\\cdot\s*B(?![A-Za-z_])", "is multiplied like a count of sequences"),
                         (r"[(,]\s*B\s*,", "is an axis of a tensor's shape"))),
    "L": Rule("L", _w("distance apart steps positions position tokens earlier"),
              equals=r"\d"),
    "M": Rule("M", _w("memory fast capacity SRAM chip KiB"),
              equals=r"(\d|2\^)",
              forbidden=((r"M_\{?ij\}?", "has entries, like a matrix"),
                         (r"\+\s*M(?![A-Za-z_])", "is added to scores, like a mask"))),
    "H": Rule("H", _w("heads head blocks"), equals=r"\d"),
    "P": Rule("P", _w("weights probabilities tile tiles attention softmax"),
              equals=r"(\\operatorname\{softmax\}|e\^|\\frac\{e|0)"),
    # The maximum of a row (running, in Chapter 4): never an index, which another letter names.
    "m": Rule("m", _w("maximum maxima running max statistics state"),
              forbidden=((r"_(m(?![A-Za-z])|\{\s*m\s*(\}|=|\\in|\\le|<|,))", "is a subscript, an index (m is a row's maximum)"),
                         (r"\|\s*m\s*\|", "is an integer of a range, an index (m is a row's maximum)"))),
    # A Chapter 4 letter: another page may name a matrix C for a moment (C = XW), never a count of chunks.
    "C": Rule("C", _w("chunk length lengths keys key positions position tokens token"),
              forbidden=((r"\(\s*C\s*,\s*\.\.\.", "is the axis that counts the chunks (C is a chunk length)"),)),
    "phi": Rule(r"\phi", _w("feature features map kernel"),
                equals=r"\\(operatorname|mathrm)\{elu\}",
                forbidden=((r"\\phi\s*\([^()]*,", "takes two arguments, like a recurrent cell (phi is a feature map)"),)),
    "delta": Rule(r"\delta", _w("Kronecker delta"),
                  forbidden=((r"\\delta(?![A-Za-z])(?!\s*_\s*\{?\s*[a-z]\s*[a-z])",
                              "stands without the two indices of the Kronecker delta"),)),
}

# Nouns that name a meaning. One of them next to a symbol must be among that symbol's words.
MEANING_WORDS = frozenset().union(*(rule.words for rule in RULES.values())) | _w(
    "batch batches mask masks cache caches layer layers log-sum-exp logsumexp scale model "
    "permutation permutations chunk chunks block blocks programs cell cells dilation dilations gap")


@dataclass
class Finding:
    page: str
    symbol: str
    text: str
    why: str

    def __str__(self):
        return f"{self.page}: {self.symbol} {self.why}: ...{self.text}..."


@dataclass
class Page:
    name: str
    prose: str                          # the page without code, with math kept
    formulas: list = field(default_factory=list)   # (start, end, latex) in prose


_CODE = re.compile(r"^(`{3,}|~{3,}).*?^\1\s*$", re.S | re.M)
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$((?:[^$\n]|\n(?!\s*\n))+?)\$", re.S)
_WRAPPERS = re.compile(r"\\(text|operatorname|mathrm|mathit|mathcal|mathbb|mathbf|tilde|hat|bar|texttt)\s*\{[^{}]*\}")


def read_page(path, name=None):
    return page_of(path.read_text(encoding="utf-8"), name or str(path))


def page_of(text, name="page"):
    text = _CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)       # code blocks and code cells
    text = re.sub(r"`[^`\n]*`", "code", text)                               # inline code, roles' targets
    formulas = [(m.start(), m.end(), m.group(1) or m.group(2)) for m in _MATH.finditer(text)]
    return Page(name, text, formulas)


def occurrences(latex, rule):
    """Positions in a formula where the rule's symbol itself stands (not d_k, not \\mathcal{L})."""
    plain = _WRAPPERS.sub(lambda m: " " * len(m.group(0)), latex)
    pattern = (re.escape(rule.latex) + r"(?![A-Za-z])" if rule.latex.startswith("\\")
               else r"(?<![A-Za-z\\])" + re.escape(rule.latex) + r"(?![A-Za-z'])")
    found = []
    for m in re.finditer(pattern, plain):
        subscript = re.match(r"_(\{[^}]*\}|\\?[A-Za-z0-9]+)", plain[m.end():])
        if subscript and subscript.group(1).strip("{}") not in INDEX_SUBSCRIPTS:
            continue
        found.append((m.start(), m.end() + (subscript.end() if subscript else 0)))
    return plain, found


_WORD = r"[A-Za-z][A-Za-z'’-]*"


def _clause(text):
    """The words of a stretch of text up to the nearest clause or table boundary, formulas removed."""
    return re.findall(_WORD, re.sub(r"\$[^$]*\$", " ", text))


def words_before(prose, start):
    """The nouns that name the symbol from the left: 'a batch of $B$' gives [batch],
    'the permutation matrix $P$' gives [matrix, permutation] (nearest first)."""
    words = _clause(re.split(r"[.;:!?|,()\n]", prose[max(0, start - 120):start])[-1])[::-1]
    while words and words[0].lower() in ARTICLES:
        words.pop(0)
    named = []
    for word in words[:2]:
        if word.lower() not in MEANING_WORDS:
            break
        named.append(word.lower())
    return named


def words_after(prose, end):
    """The noun that names the symbol from the right: '$B$ sequences' gives [sequences],
    '$H$ query heads' gives [heads], '$B$ is the batch size' gives [batch]."""
    rest = prose[end:end + 80]
    if not re.match(r"\s+[A-Za-z]", rest):
        return []
    words = _clause(re.split(r"[.;:!?|,()\n]", rest)[0])
    if words and words[0].lower() in DEFINING:
        words = [w for w in words[1:] if w.lower() not in ARTICLES]
        return [words[0].lower()] if words and words[0].lower() in MEANING_WORDS else []
    first, second = (words + ["", ""])[:2]
    first, second = first.lower(), second.lower()
    if first in LINKS:                              # "$d = 64$ and query blocks": not a noun phrase
        return []
    if second in MEANING_WORDS:                     # "$H$ query heads": the second noun is the head
        return [second]
    if second in GENERIC:                           # "$H$ key rows", "$N$ log-sum-exp values"
        return []
    return [first] if first in MEANING_WORDS else []


def check_page(page, rules=RULES):
    findings = []
    for start, end, latex in page.formulas:
        for key, rule in rules.items():
            plain, found = occurrences(latex, rule)
            if not found:
                continue
            # Words next to a formula that is the symbol alone, or "symbol = value".
            alone = r"\s*" + re.escape(rule.latex) + r"(_\{?(i|j|ij|t)\}?)?\s*(=\s*[^=]*)?"
            if re.fullmatch(alone, plain):
                # The noun after a symbol says what it counts ("a batch of $B$ sequences");
                # without one, the nouns before it do ("the mask $M$").
                for word in words_after(page.prose, end) or words_before(page.prose, start):
                    if word in MEANING_WORDS and word not in rule.words:
                        findings.append(Finding(page.name, rule.latex, page.prose[max(0, start - 50):end + 30],
                                                f"is called '{word}'"))
            # Equations with the symbol alone on the left.
            for a, b in found:
                before = plain[:a].rstrip()
                if before and not re.search(r"(,|\(|\\q?quad|\\\\|&|\\text\s*\{[^}]*\}|\\le|\\ge|<|>)$", before):
                    continue
                rhs = re.match(r"\s*=\s*([^=]*)", latex[b:])
                if rhs and rhs.group(1).strip() and not re.match(rule.equals, rhs.group(1).strip()):
                    findings.append(Finding(page.name, rule.latex, latex.strip(),
                                            f"is set to '{rhs.group(1).strip()[:30]}'"))
            for pattern, meaning in rule.forbidden:
                if re.search(pattern, plain):
                    findings.append(Finding(page.name, rule.latex, latex.strip(), meaning))
    return findings


def table_symbols(notation_text):
    """The LaTeX of the symbols in the first column of every table of the notation page."""
    symbols = set()
    for line in notation_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and cells and cells[0].startswith("$"):
            symbols.update(re.findall(r"\$([^$]+)\$", cells[0]))
    return symbols


def book_pages(book):
    return sorted(p for p in Path(book).rglob("*.md") if "_build" not in p.parts)


# A tensor's shape written as code in an exercise's text: `(B, H, N, D)`, `(n_c, ..., d_v)`.
_SHAPE = re.compile(r"`(\((?:\s*(?:[A-Za-z][A-Za-z0-9_]*|\.\.\.)\s*,)+\s*(?:[A-Za-z][A-Za-z0-9_]*|\.\.\.)?\s*\))`")


def notebook_text(path):
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def notebook_page(path, name=None):
    """The markdown cells of a notebook on the site (an exercise as students receive it), as one page.
    The shapes its text gives as code are formulas: their axes are the table's symbols."""
    return page_of(_SHAPE.sub(r"$\1$", notebook_text(path)), name or str(path))


# --- wording: claims that hold under a condition, abbreviations -------------------------

@dataclass(frozen=True)
class Claim:
    pattern: str                 # the claim (a regex on a paragraph, case-insensitive)
    condition: str               # what the same paragraph must also say
    why: str


CLAIMS = (
    Claim(r"\b[AP]_\{?ij\}?\s*>\s*0|strictly\s+positive\s+weight|weights?\s+(is|are)\s+strictly\s+positive",
          r"exact arithmetic|underflow",
          "says softmax weights are positive without 'in exact arithmetic' (in floating point they underflow to 0)"),
    Claim(r"m64n\w*k\d+",
          r"16-bit",
          "gives a wgmma shape without its input type (k = 16 holds for 16-bit inputs; 32 for 8-bit, 8 for tf32)"),
    Claim(r"paper[^.]*\$r\$[^.]*neighbou?rhood",
          r"2r\s*\+\s*1|size of the neighbou?rhood|neighbou?rhood's size",
          "takes the Transformer paper's r for our radius (the paper's r is the neighbourhood's size, 2r + 1)"),
)

# Abbreviations and the words that must stand where the course first uses them.
ABBREVIATIONS = {
    "CTA": r"cooperative thread array",
}


def paragraphs(text):
    """The prose paragraphs of a page: code blocks and cells removed, inline code kept."""
    return [p for p in re.split(r"\n\s*\n", _CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)) if p.strip()]


def unconditioned_claims(text, name="page", claims=CLAIMS):
    findings = []
    for paragraph in paragraphs(text):
        for claim in claims:
            found = re.search(claim.pattern, paragraph, re.I)
            if found and not re.search(claim.condition, paragraph, re.I):
                findings.append(Finding(name, found.group(0), " ".join(paragraph.split())[:200], claim.why))
    return findings


def undefined_abbreviations(texts, abbreviations=ABBREVIATIONS):
    """texts: (name, text) in reading order. The paragraph of each abbreviation's first use
    in prose (code and inline code aside) must say what it stands for."""
    findings = []
    for abbreviation, definition in abbreviations.items():
        for name, text in texts:
            first = next((p for p in paragraphs(text)
                          if re.search(rf"\b{abbreviation}s?\b", re.sub(r"`[^`\n]*`", "code", p))), None)
            if first is not None:
                if not re.search(definition, first, re.I):
                    findings.append(Finding(name, abbreviation, " ".join(first.split())[:200],
                                            f"is first used without its definition ({definition})"))
                break
    return findings
