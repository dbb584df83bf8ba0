"""rollout-relabel's public Python API.

    import rollout_relabel
    out = rollout_relabel.relabel(table, semantics="rollout-mainstream", std_normalization=False)
    out.training_rows, out.dead_letters, out.filtered

relabels rollout rows in memory exactly as `relabel run` does, and imports no
Apache Beam. The composite transforms for a Beam pipeline of your own are in
rollout_relabel.beam (imported only when asked for).
"""
from rollout_relabel.api import Relabeled, relabel
from rollout_relabel.options import OPTION_NAMES
from transforms.lib.errors import UsageError

__all__ = ["relabel", "Relabeled", "UsageError", "OPTION_NAMES"]
