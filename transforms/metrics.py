"""One metrics namespace for every stage."""
from apache_beam.metrics import Metrics

NAMESPACE = "rollout_relabel"


def counter(name: str):
    return Metrics.counter(NAMESPACE, name)
