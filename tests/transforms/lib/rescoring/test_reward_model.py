"""reward_model.py: what a checkpoint must hold, its identity, the padded batched forward pass."""
import json

import numpy as np
import pytest

from rollout_relabel.transforms.lib.rescoring.reward_model import RewardModelError, checkpoint, identity, scores
from tests.reward_models import forward, tiny_reward_model


def test_a_tiny_checkpoint_is_accepted_and_scored_as_its_forward_pass(tmp_path):
    model = tiny_reward_model(tmp_path / "rm", vocab_size=40)
    config, weights = checkpoint(str(tmp_path / "rm"))
    assert weights.endswith("model.safetensors") and len(config["id2label"]) == 1
    assert identity(str(tmp_path / "rm")).startswith("model:rm@sha256:")
    batch = [[1, 2, 3], [4], [5, 6]]
    assert np.array_equal(scores(model, batch, 0, "cpu"), forward(model, batch))


@pytest.mark.parametrize("change, match", [({"architectures": ["LlamaForCausalLM"]}, "ForSequenceClassification"),
                                           ({"pad_token_id": None}, "pad_token_id"),
                                           ({"id2label": {"0": "a", "1": "b"}}, "one label")])
def test_checkpoints_that_cannot_score_are_refused(tmp_path, change, match):
    tiny_reward_model(tmp_path / "rm", vocab_size=40)
    path = tmp_path / "rm" / "config.json"
    config = json.loads(path.read_text())
    config.update(change)
    config.pop("num_labels", None)
    path.write_text(json.dumps(config))
    with pytest.raises(RewardModelError, match=match):
        checkpoint(str(tmp_path / "rm"))
