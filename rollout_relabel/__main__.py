"""`python -m rollout_relabel`: the `relabel` command."""
from rollout_relabel.pipeline.cli import entry

if __name__ == "__main__":  # a worker process started by spawn (Dask's LocalCluster) imports this module too
    entry()
