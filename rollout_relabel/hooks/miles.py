"""miles: --custom-reward-post-process-path rollout_relabel.hooks.miles.post_process_rewards

miles calls it as `f(args, samples)` from _post_process_rewards
(miles/ray/rollout/train_data_conversion.py, radixark/miles@31f1ca96), without the
step's prompt_group_sizes: prompt groups come from group_index (rule (b) of the
rollout semantics), else from --n-samples-per-prompt x --rollout-batch-size, else the
step is one group. See rollout_relabel.hooks.
"""
from rollout_relabel.hooks import relabel_rewards


def post_process_rewards(args, samples):
    """(raw_rewards, rewards), one entry a sample: rewards are the project's advantages."""
    return relabel_rewards(args, samples)
