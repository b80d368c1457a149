"""trainer.train in this process: the step count asked for is the step count run."""

import functools
import json
import os

from data_pipelines import criteo
from tf_codistill import layout
from tf_codistill import trainer
from tf_codistill.models import ctr


def test_train_steps_are_honoured_when_not_a_whole_number_of_epochs(tmp_path, criteo_dir):
  model_dir = str(tmp_path / "run")
  results = trainer.train(
      model_dir, train_files=[f"{criteo_dir}/train-*"], eval_files=[f"{criteo_dir}/eval-*"],
      dataset_fn=functools.partial(criteo.make_dataset, num_buckets=1000),
      model_fn=functools.partial(ctr.ctr_model, num_buckets=1000, embedding_dim=4,
                                 hidden_units=(16,)),
      batch_size=64, train_steps=70, steps_per_epoch=30, eval_steps=2,
      checkpoint_every_steps=30, verbose=0)
  assert results["steps"] == 70
  with open(layout.RunDir(model_dir).progress) as f:
    assert [json.loads(line)["step"] for line in f] == [30, 60, 70]
  # Every output is where the run layout says.
  run = layout.RunDir(model_dir)
  for path in (run.results, run.heartbeat, os.path.join(run.export, "saved_model.pb"),
               run.step_summaries):
    assert os.path.exists(path), path
  with open(run.results) as f:
    assert json.load(f)["steps"] == 70

