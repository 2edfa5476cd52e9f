"""benchmarks/gpu_corpus.py: the GPU scripts' corpus step (one table of training columns, FILE:TASK filters)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_corpus import concat, main  # noqa: E402


def export(path: Path, tasks: list[str], extra: bool = True) -> str:
    cols = {
        "messages": [f"m{i}" for i in range(len(tasks))],
        "task_id": tasks,
        "step_idx": list(range(len(tasks))),
    }
    if extra:
        cols["episode_id"] = [f"e{i}" for i in range(len(tasks))]
    pq.write_table(pa.table(cols), path)
    return str(path)


def test_concat_keeps_training_columns_and_filters_by_task(tmp_path):
    a = export(tmp_path / "A.parquet", ["synth/type", "synth/tabs"])
    b = export(tmp_path / "B.parquet", ["synth/click", "synth/search", "synth/click"], extra=False)
    out = tmp_path / "ABP.parquet"
    assert concat(str(out), [a, f"{b}:synth/click"]) == {"synth/click": 2, "synth/tabs": 1, "synth/type": 1}
    t = pq.read_table(out)
    assert t.schema.names == ["messages", "step_idx", "task_id"]  # episode_id dropped: training does not read it
    assert t.column("messages").to_pylist() == ["m0", "m1", "m0", "m2"]


def test_concat_rejects_a_missing_file_a_non_export_and_an_empty_filter(tmp_path, capsys):
    a = export(tmp_path / "A.parquet", ["synth/type"])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "bad.parquet")
    out = str(tmp_path / "o.parquet")
    with pytest.raises(SystemExit, match="no such export: .*nope.parquet"):
        concat(out, [a, str(tmp_path / "nope.parquet")])
    with pytest.raises(SystemExit, match=r"bad.parquet is not an SFT export \(no messages, task_id column\)"):
        concat(out, [str(tmp_path / "bad.parquet")])
    with pytest.raises(SystemExit, match="has no rows of task synth/click"):
        concat(out, [f"{a}:synth/click"])
    with pytest.raises(SystemExit, match="a held-out set is NAME=FILE"):
        main(["skills", "model", out, "HS.parquet"])
