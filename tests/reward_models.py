"""A tiny Hugging Face reward model built from a config (no download), and its own batched forward pass."""
import numpy as np
import torch


def tiny_reward_model(directory, vocab_size: int, seed: int = 0, safetensors: bool = True):
    """A one-layer Llama sequence classifier with one label, saved as a checkpoint folder."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                      num_labels=1, pad_token_id=0, max_position_embeddings=256)
    torch.manual_seed(seed)
    model = transformers.LlamaForSequenceClassification(config).eval()
    model.save_pretrained(directory, safe_serialization=safetensors)
    return model


def forward(model, token_lists) -> np.ndarray:
    """The model's own forward pass over the rows as one batch, right-padded with its pad token."""
    longest = max(len(t) for t in token_lists)
    ids = torch.zeros((len(token_lists), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, tokens in enumerate(token_lists):
        ids[i, :len(tokens)] = torch.tensor(tokens)
        mask[i, :len(tokens)] = 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0].numpy()
