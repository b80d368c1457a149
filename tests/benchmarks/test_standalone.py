"""What the registered benchmarks share (benchmarks/standalone.py)."""

import os
import sys

import pytest

from benchmarks import standalone


def test_markdown_table_renders_every_cell():
  table = standalone.markdown_table(["a", "b"], [[1, "x"], [2.5, None]])
  assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]


def test_launch_args_name_the_gin_file_under_gin_criteo_unless_absolute():
  args = standalone.launch_args("/m", "baseline.gin", ["--num_groups=1"], ["x = 1"])
  assert args[:3] == [sys.executable, "-m", "tf_codistill.bin.launch"]
  assert args[3:] == ["--model_dir=/m", f"--gin_file={standalone.REPO}/gin/criteo/baseline.gin",
                      "--num_groups=1", "--gin_bindings=x = 1"]
  assert standalone.launch_args("/m", "/abs.gin")[4] == "--gin_file=/abs.gin"


def test_wait_for_returns_the_first_true_value_or_names_what_timed_out():
  values = iter([None, 0, "ready"])
  assert standalone.wait_for(lambda: next(values), 5, "x", poll=0) == "ready"
  with pytest.raises(TimeoutError, match="waiting for the thing"):
    standalone.wait_for(lambda: None, 0.05, "the thing", poll=0.01)


def test_generated_ctr_data_is_made_once_and_reused(tmp_path):
  data = standalone.ensure_ctr_data(str(tmp_path / "data"), 200, eval_rows=50, vocab_size=100)
  files = sorted(os.listdir(data))
  assert files == ["eval-00000-of-00001.tsv"] + [f"train-{i:05d}-of-00004.tsv" for i in range(4)]
  stamp = os.path.getmtime(os.path.join(data, files[0]))
  standalone.ensure_ctr_data(data, 200, eval_rows=50, vocab_size=100)
  assert os.path.getmtime(os.path.join(data, files[0])) == stamp
  assert standalone.ctr_data_bindings(data) == [
      f"tfc.Data.train_files = ['{data}/train-*']",
      f"tfc.Data.eval_files = ['{data}/eval-*']"]


def test_source_digest_follows_the_python_sources_only(tmp_path, monkeypatch):
  monkeypatch.setattr(standalone, "REPO", str(tmp_path))
  (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
  (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
  first = standalone.source_digest(["pkg"])
  (tmp_path / "pkg" / "notes.md").write_text("not code")
  (tmp_path / "pkg" / "__pycache__" / "a.py").write_text("cached")
  assert standalone.source_digest(["pkg"]) == first
  (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
  assert standalone.source_digest(["pkg"]) != first
