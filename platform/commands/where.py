"""`genrec runs --where`: a small filter language over result columns, evaluated without eval.

    expr        := term (("or" | "|") term)*
    term        := factor (("and" | "&") factor)*
    factor      := ("not" | "~") factor | "(" expr ")" | comparison
    comparison  := operand OP operand            OP: == != < <= > >=
                 | column ["not"] "in" "[" literal ("," literal)* "]"
    operand     := column | literal              (at least one side of a comparison is a column)
    column      := NAME | `any name`             (backquotes for names like recall@10)
    literal     := number | 'text' | "text" | true | false

pandas' `DataFrame.query` (even with the numexpr engine) resolves `@names`, attribute access and
calls, so a --where string could reach Python objects; this parser only knows column names,
literals and the operators above, and builds the boolean mask with plain Series comparisons.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from genrec.workloads.errors import UserInputError

MAX_LENGTH = 2000  # a filter typed by a person; longer input is a mistake or an attack
MAX_DEPTH = 32  # nested parentheses / not

EXAMPLE = 'param_beam_width >= 20 and `recall@10` > 0.5 and decoder in ["beam", "static"]'
COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
KEYWORDS = {"and", "or", "not", "in", "true", "false"}
TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<column>`[^`]+`)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|<|>)
  | (?P<punct>[()\[\],&|~])
  | (?P<name>[A-Za-z_]\w*)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # column, number, string, op, punct, name (a keyword or a bare column name)
    text: str
    pos: int


def tokenize(text: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if m is None:
            raise WhereError(f"unexpected {text[pos]!r} at position {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    return tokens


class WhereError(Exception):
    """A parse or type problem; `filter_rows` words it as a UserInputError."""


class Parser:
    """Recursive descent over the tokens, producing the boolean mask directly."""

    def __init__(self, tokens: list[Token], df: pd.DataFrame) -> None:
        self.tokens, self.i, self.df, self.depth = tokens, 0, df, 0

    # ---- token helpers ---------------------------------------------------------------------------
    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind in ("name", "punct", "op") and tok.text.lower() in texts

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise WhereError("the expression ends too early")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise WhereError(f"expected {text!r} at position {tok.pos}, got {tok.text!r}")

    # ---- grammar ---------------------------------------------------------------------------------
    def parse(self) -> pd.Series:
        mask = self.expr()
        if self.peek() is not None:
            tok = self.peek()
            raise WhereError(f"unexpected {tok.text!r} at position {tok.pos}")
        return mask

    def expr(self) -> pd.Series:
        mask = self.term()
        while self.at("or", "|"):
            self.take()
            mask = mask | self.term()
        return mask

    def term(self) -> pd.Series:
        mask = self.factor()
        while self.at("and", "&"):
            self.take()
            mask = mask & self.factor()
        return mask

    def factor(self) -> pd.Series:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise WhereError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            if self.at("not", "~"):
                self.take()
                return ~self.factor()
            if self.at("("):
                self.take()
                mask = self.expr()
                self.expect(")")
                return mask
            return self.comparison()
        finally:
            self.depth -= 1

    def comparison(self) -> pd.Series:
        left = self.operand()
        if self.at("in", "not"):
            negate = self.take().text.lower() == "not"
            if negate:
                self.expect("in")
            if not isinstance(left, Column):
                raise WhereError("`in` needs a column on its left")
            mask = self.series(left).isin(self.literal_list())
            return ~mask if negate else mask
        tok = self.take()
        if tok.kind != "op":
            raise WhereError(
                f"expected a comparison (== != < <= > >= in) at position {tok.pos}, got {tok.text!r}"
            )
        right = self.operand()
        if not (isinstance(left, Column) or isinstance(right, Column)):
            raise WhereError(f"the comparison at position {tok.pos} compares two literals; name a column")
        a = self.series(left) if isinstance(left, Column) else left
        b = self.series(right) if isinstance(right, Column) else right
        try:
            result = COMPARE[tok.text](a, b)
        except TypeError as e:
            raise WhereError(f"cannot compare at position {tok.pos}: {e}") from None
        return pd.Series(result, index=self.df.index).fillna(False).astype(bool)

    def operand(self) -> Any:
        tok = self.take()
        if tok.kind == "column":
            return Column(tok.text[1:-1])
        if tok.kind == "name" and tok.text.lower() not in KEYWORDS:
            return Column(tok.text)
        return self.literal(tok)

    def literal(self, tok: Token) -> Any:
        if tok.kind in ("number", "string"):
            return ast.literal_eval(tok.text)  # only a number or string literal reaches here
        if tok.kind == "name" and tok.text.lower() in ("true", "false"):
            return tok.text.lower() == "true"
        raise WhereError(f"expected a column or a value at position {tok.pos}, got {tok.text!r}")

    def literal_list(self) -> list[Any]:
        self.expect("[")
        values = [self.literal(self.take())]
        while self.at(","):
            self.take()
            values.append(self.literal(self.take()))
        self.expect("]")
        return values

    def series(self, col: Column) -> pd.Series:
        if col.name not in self.df.columns:
            raise WhereError(f"no column {col.name!r}")
        return self.df[col.name]


@dataclass(frozen=True)
class Column:
    name: str


def filter_rows(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """The rows of `df` matching `where`, or UserInputError naming the problem and the columns."""
    if len(where) > MAX_LENGTH:
        raise UserInputError(f"--where is {len(where)} characters long; the limit is {MAX_LENGTH}")
    try:
        mask = Parser(tokenize(where), df).parse()
    except WhereError as e:
        raise UserInputError(
            f"--where {where!r}: {e}; write comparisons of columns with values joined by and/or/not, e.g. "
            f"{EXAMPLE} (backquote names like `recall@10`); columns: {list(df.columns)}"
        ) from None
    return df[mask]
