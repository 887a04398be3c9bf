"""Reading report pages back: the text of every table cell, row by row (html.parser, no browser)."""

from __future__ import annotations

from html.parser import HTMLParser


class TableCells(HTMLParser):
    """Collects the stripped text of each <td>/<th> into the row of its <tr>. Subclasses say where a
    finished row goes (`add_row`), whether a <tr> starts one (`in_table`), and what other tags do
    (`open`, `close`)."""

    def __init__(self) -> None:
        super().__init__()
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def in_table(self) -> bool:
        return True

    def open(self, tag: str, attrs: dict[str, str | None]) -> None:
        pass

    def close(self, tag: str) -> None:
        pass

    def add_row(self, row: list[str]) -> None:
        raise NotImplementedError

    def handle_starttag(self, tag, attrs):
        if tag == "tr" and self.in_table():
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []
        else:
            self.open(tag, dict(attrs))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.add_row(self.row)
            self.row = None
        else:
            self.close(tag)

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)
