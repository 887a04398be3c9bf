"""Atomic writes (workloads/io.py): the file appears whole or not at all, with the permissions a plain
write gives it, and a failed write leaves nothing behind; the Parquet writers of result rows and
teacher files are this one."""

import os
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from genrec.platform import tracking
from genrec.workloads.io import atomic_write, atomic_write_text, write_parquet_atomic
from genrec.workloads.training import teacher


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_files_get_the_mode_a_plain_write_gives(tmp_path):
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        text = atomic_write_text(tmp_path / "a.txt", "x")
        table = write_parquet_atomic(pa.table({"a": [1, 2]}), tmp_path / "t.parquet")
    finally:
        os.umask(old)
    assert mode(text) == mode(table) == mode(plain) == 0o644  # not mkstemp's 0600
    assert pq.read_table(table).column("a").to_pylist() == [1, 2] and text.read_text() == "x"


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path):
    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / "out.parquet", fail)
    assert list(tmp_path.iterdir()) == []


def test_result_rows_and_teacher_files_use_the_one_writer():
    assert tracking.write_parquet_atomic is write_parquet_atomic
    assert teacher.write_parquet_atomic is write_parquet_atomic
