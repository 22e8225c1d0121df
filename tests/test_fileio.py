"""Atomic writes: the file appears whole or not at all."""
import csv
import json

import pytest

from experiments.fileio import write_csv, write_json


def test_writes_land_whole(tmp_path):
    write_json(tmp_path / "a" / "x.json", {"k": 1})
    write_csv(tmp_path / "a" / "y.csv", [{"p": 1, "q": 2}], ["p", "q"])
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == {"k": 1}
    assert list(csv.DictReader(open(tmp_path / "a" / "y.csv"))) == [{"p": "1", "q": "2"}]


def test_a_failed_write_leaves_no_file(tmp_path):
    with pytest.raises(ValueError):
        write_csv(tmp_path / "z.csv", [{"p": 1, "bad": 2}], ["p"])  # a column the header lacks
    assert list(tmp_path.iterdir()) == []
