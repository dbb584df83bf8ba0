"""rollout-relabel's public Python API.

    import rollout_relabel
    out = rollout_relabel.relabel(table, semantics="rollout-mainstream", std_normalization=False)
    out.training_rows, out.dead_letters, out.filtered

relabels rollout rows in memory exactly as `relabel run` does, and imports no
Apache Beam. The composite transforms for a Beam pipeline of your own are in
rollout_relabel.beam (imported only when asked for); the reward hooks a live
slime / miles run loads with --custom-reward-post-process-path are in
rollout_relabel.hooks.slime and rollout_relabel.hooks.miles.

The names below are loaded on first use, so that importing a hook (which runs
this file first) imports neither pyarrow nor Beam.
"""
__all__ = ["relabel", "Relabeled", "UsageError", "OPTION_NAMES"]


def __getattr__(name):
    if name in ("relabel", "Relabeled"):
        from rollout_relabel import api
        return getattr(api, name)
    if name == "OPTION_NAMES":
        from rollout_relabel.options import OPTION_NAMES
        return OPTION_NAMES
    if name == "UsageError":
        from rollout_relabel.transforms.lib.errors import UsageError
        return UsageError
    raise AttributeError(f"module 'rollout_relabel' has no attribute {name!r}")
