"""slime: --custom-reward-post-process-path rollout_relabel.hooks.slime.post_process_rewards

slime calls it as `fn(self.args, samples)` from RolloutManager._post_process_rewards
(slime/ray/rollout.py, THUDM/slime@624b824a), before its own normalization, which it
then skips whatever --disable-rewards-normalization says. See rollout_relabel.hooks.
"""
from rollout_relabel.hooks import relabel_rewards


def post_process_rewards(args, samples):
    """(raw_rewards, rewards), one entry a sample: rewards are the project's advantages."""
    return relabel_rewards(args, samples)
