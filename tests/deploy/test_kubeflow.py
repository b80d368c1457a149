"""The Kubeflow manifests agree: the NetworkPolicy admits a group's TF traffic from its own pods
only, and the TFJob's arguments configure the group its replicas make."""

import os

import gin
import pytest
import yaml

from tf_codistill.launch import gin_config
from tf_codistill.training import train_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(REPO, "deploy", "kubeflow")
JOB_LABEL = "training.kubeflow.org/job-name"


def _load(name, group):
  with open(os.path.join(DEPLOY, name)) as f:
    return yaml.safe_load(f.read().replace("GROUP", str(group)))


@pytest.mark.parametrize("group", [0, 1])
def test_the_policy_selects_the_groups_pods_and_admits_only_the_same_job(group):
  job = _load("codistill-group-tfjob.yaml", group)
  policy = _load("codistill-group-networkpolicy.yaml", group)
  assert job["kind"] == "TFJob" and policy["kind"] == "NetworkPolicy"
  own_pods = {JOB_LABEL: job["metadata"]["name"]}
  spec = policy["spec"]
  assert spec["podSelector"] == {"matchLabels": own_pods}
  assert spec["policyTypes"] == ["Ingress"]  # with it, ingress not admitted below is denied
  for rule in spec["ingress"]:
    # Pods of this job, in the policy's namespace: no namespaceSelector, no ipBlock.
    assert rule["from"] == [{"podSelector": {"matchLabels": own_pods}}], rule
    assert rule["ports"] == [{"protocol": "TCP", "port": 2222}]


def test_one_groups_policy_does_not_admit_the_other_groups_pods():
  peer = _load("codistill-group-tfjob.yaml", 1)["metadata"]["name"]
  policy = _load("codistill-group-networkpolicy.yaml", 0)
  admitted = [p["podSelector"]["matchLabels"][JOB_LABEL]
              for rule in policy["spec"]["ingress"] for p in rule["from"]]
  assert peer not in admitted and admitted == ["codistill-criteo-group-0"]


def test_the_jobs_arguments_are_a_configuration_whose_shape_is_its_replicas():
  """What every pod of the TFJob runs parses, under today's names, into a group whose tasks are
  the job's replicas (the tasks read their roles from the TF_CONFIG the operator writes)."""
  job = _load("codistill-group-tfjob.yaml", 0)
  replicas = job["spec"]["tfReplicaSpecs"]
  args = replicas["Chief"]["template"]["spec"]["containers"][0]["args"]
  files = [a.split("=", 1)[1] for a in args if a.startswith("--gin_file=")]
  bindings = [a.split("=", 1)[1] for a in args if a.startswith("--gin_bindings=")]
  gin.clear_config()
  try:
    gin_config.parse_gin([os.path.join(REPO, f) for f in files], bindings)
    config = train_config.from_bindings()
  finally:
    gin.clear_config()
  assert config.data.train_files == ["gs://my-bucket/criteo/train-*.tsv"]
  assert (config.shape.strategy, config.shape.workers_per_group, config.shape.ps_per_group) == (
      "parameter_server", replicas["Worker"]["replicas"], replicas["PS"]["replicas"])
