"""CSV (and TSV) time series as pyarrow reads them, and its errors said in the user's terms.

pyarrow infers column types from the first block and reports a bad value by column number and
block; linpipe converts the file once into an Arrow IPC file (TimeSeriesInput does the caching),
parsing the channels as float64, and turns each error into one line naming the column, the line
of the file and the value.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from linpipe.errors import InputError, option

CSV_BLOCK = 4 << 20  # bytes per CSV block; column types are inferred from the first one
# Date and time formats CSV columns are read as (besides ISO 8601, which Arrow always reads);
# day-first and month-first formats are ambiguous, so those need --time-format.
DATE_FORMATS = ("%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M", "%Y/%m/%d", "%Y-%m-%d %H:%M", "%Y.%m.%d %H:%M:%S",
                "%Y.%m.%d %H:%M", "%Y.%m.%d", "%Y%m%dT%H%M%S")
NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(nan|NaN|NAN|inf|Inf|INF)\s*$"


def first_line(e: Exception) -> str:
    """The first line of an error's message (pyarrow's run on), or its type's name."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _numbers_and_texts(column):
    """(is a number, is other text) per value of a string column, as numpy bool arrays."""
    import pyarrow.compute as pc

    num = pc.match_substring_regex(column, NUMBER).fill_null(False).to_numpy(zero_copy_only=False)
    text = pc.not_equal(column, "").fill_null(False).to_numpy(zero_copy_only=False) & ~num
    return num, text


class CsvFile:
    """One CSV or TSV file (tab-separated when a suffix says .tsv), dates read with time_format
    when given, else as ISO 8601 or one of DATE_FORMATS."""

    def __init__(self, path: Path, time_format: str | None):
        self.path = Path(path)
        self.time_format = time_format

    def options(self, column_types=None, include=None) -> dict:
        """Keyword arguments of pyarrow.csv.open_csv."""
        import pyarrow.csv as pcsv

        delimiter = "\t" if ".tsv" in [s.lower() for s in self.path.suffixes] else ","
        return dict(
            read_options=pcsv.ReadOptions(block_size=CSV_BLOCK),
            parse_options=pcsv.ParseOptions(delimiter=delimiter),
            convert_options=pcsv.ConvertOptions(
                column_types=column_types or {}, include_columns=include or [],
                # the user's format alone when given: a date it does not match is an error
                timestamp_parsers=[self.time_format] if self.time_format else [pcsv.ISO8601, *DATE_FORMATS],
            ),
        )

    def schema(self):
        """The columns and the types pyarrow infers from the first block."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        try:
            first = pcsv.open_csv(self.path, **self.options())
        except pa.ArrowInvalid as e:
            raise InputError(f"{self.path}: not a readable CSV file: {first_line(e)}") from None
        schema = first.schema
        first.close()
        if all(f.type == pa.null() for f in schema):
            raise InputError(f"{self.path}: no rows: a zero-length series")
        return schema

    def convert(self, types: dict, text_columns: list[str], write) -> None:
        """Parse the whole file with these column types, batch by batch, into write(schema,
        batches); a text column of text_columns that mixes numbers and text is an error
        naming its first value that is not a number."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        rows = 0
        try:  # the first block is converted as the file opens
            reader = pcsv.open_csv(self.path, **self.options(types))
        except pa.ArrowInvalid as e:
            raise self.error(e, 0) from None

        def batches():
            nonlocal rows
            while True:
                try:
                    b = reader.read_next_batch()
                except StopIteration:
                    return
                except pa.ArrowInvalid as e:
                    raise self.error(e, rows) from None
                for name in text_columns:
                    col = b.column(name)
                    num, text = _numbers_and_texts(col)
                    if num.any() and text.any():
                        i = int(np.argmax(text))
                        raise InputError(
                            f"{self.path}: column {name!r}, line {rows + i + 2}: value "
                            f"{col[i].as_py()!r} is not a number (the column mixes dtypes: numbers "
                            f"and text); fix it or choose channels with {option('columns')}"
                        )
                rows += b.num_rows
                yield b

        write(reader.schema, batches())

    def error(self, err, rows_before: int) -> InputError:
        """pyarrow's CSV error as one naming the column and the line."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv

        msg = first_line(err)
        m = re.search(r"In CSV column #(\d+): CSV conversion error to ([\w\[\]]+): invalid value '(.*)'",
                      msg)
        if not m:
            return InputError(f"{self.path}: CSV error after line {rows_before + 1}: {msg}")
        names = pcsv.open_csv(self.path, **self.options()).schema.names
        col, value = names[int(m.group(1))], m.group(3)
        if m.group(2).startswith("timestamp"):
            return InputError(f"{self.path}: column {col!r}, after line {rows_before + 1}: value {value!r} "
                              f"does not match {option('time_format')} {self.time_format!r}")
        line = None
        reader = pcsv.open_csv(self.path, **self.options({col: pa.string()}, [col]))
        row = 0
        for b in reader:
            c = b.column(0)
            ok = pc.or_kleene(pc.match_substring_regex(c, NUMBER), pc.equal(c, ""))
            bad = np.flatnonzero(~ok.fill_null(True).to_numpy(zero_copy_only=False))
            if bad.size:
                line = row + int(bad[0]) + 2
                break
            row += b.num_rows
        where = f"line {line}" if line else f"after line {rows_before + 1}"
        return InputError(
            f"{self.path}: column {col!r}, {where}: value {value!r} is not a number "
            "(the column mixes dtypes: numbers and text)"
        )

    def raise_text_among_numbers(self, names: list[str]) -> None:
        """For text columns that are mostly numbers: an error naming the first value that is
        not one, by column, data row (1-based) and file line."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        if not names:
            return
        opts = self.options({n: pa.string() for n in names})
        opts["convert_options"].include_columns = names
        counts = {n: [0, 0, None] for n in names}  # numbers, texts, first text (row, value)
        row = 0
        for b in pcsv.open_csv(self.path, **opts):
            for n in names:
                c = b.column(n)
                num, text = _numbers_and_texts(c)
                counts[n][0] += int(num.sum())
                counts[n][1] += int(text.sum())
                if counts[n][2] is None and text.any():
                    i = int(np.argmax(text))
                    counts[n][2] = (row + i + 1, c[i].as_py())
            row += b.num_rows
        for n, (nums, texts, first) in counts.items():
            if nums > texts and first is not None:
                r, value = first
                raise InputError(f"{self.path}: column {n!r}, row {r} (line {r + 1}): value {value!r} is not "
                                 f"a number; fix it, or leave the column out with {option('columns')}")
