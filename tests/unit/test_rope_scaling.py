"""RoPE scaling (linear, llama3) of Hugging Face Llama configs against transformers'
LlamaForCausalLM on small random checkpoints saved with save_pretrained: the engine loads the
directory and its logits and greedy tokens equal transformers'."""

from __future__ import annotations

import pytest
import torch

from tests.model_helpers import Harness
from inferctl.engine.loader import load_hf_dir, save_hf_dir
from inferctl.engine.model import rope_inv_freq

pytestmark = pytest.mark.slow

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    # Llama 3.1's own values; original context 64 so that the 512-position run crosses it and
    # the wavelengths of head_dim 16 fall in all three bands (kept, smoothed, divided)
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def _checkpoint(tmp_path, scaling: dict, seed: int = 0):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    vocab = {f"t{i}": i for i in range(96)}
    vocab.update({"<s>": 96, "</s>": 97})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    cfg = LlamaConfig(vocab_size=98, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, rope_scaling=dict(scaling), rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=96, eos_token_id=97)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():   # random norms too, so a wrong weight mapping cannot hide behind ones
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    d = tmp_path / scaling["rope_type"]
    model.save_pretrained(d, safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>").save_pretrained(d)
    return model, d


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_scaled_rope_logits_and_greedy_match_transformers(tmp_path, kind):
    ref, d = _checkpoint(tmp_path, SCALINGS[kind])
    bundle = load_hf_dir(d)
    assert bundle.args.rope_scaling_type == kind
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (300,), generator=g).tolist()   # beyond the original context (64)
    h = Harness(bundle.model, block_size=16, num_blocks=64, shuffle=True)
    ours = h.step([(0, ids, True)])
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0]
    assert float((ours - theirs).abs().max()) < 1e-4
    # greedy continuation: 24 tokens from the engine's KV cache vs transformers' full recompute
    out, _ = Harness(bundle.model, block_size=16, num_blocks=64).greedy(1, ids[:200], 24)
    seq = list(ids[:200])
    with torch.no_grad():
        for _ in range(24):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    assert out == seq[200:]


def test_scaling_changes_the_frequencies_as_specified():
    from inferctl.engine.model import ModelArgs

    base = rope_inv_freq(16, 10000.0)
    lin = ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=8, hidden_dim=8, max_seq_len=64,
                    rope_scaling_type="linear", rope_scaling_factor=4.0)
    assert torch.allclose(rope_inv_freq(16, 10000.0, lin), base / 4)
    l3 = ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=8, hidden_dim=8, max_seq_len=64,
                   rope_scaling_type="llama3", rope_scaling_factor=8.0, rope_original_max_seq_len=64)
    f = rope_inv_freq(16, 10000.0, l3)
    wavelen = 2 * torch.pi / base
    assert torch.equal(f[wavelen < 16], base[wavelen < 16])              # high frequencies kept
    assert torch.allclose(f[wavelen > 64], base[wavelen > 64] / 8)        # low frequencies / factor
    mid = (wavelen >= 16) & (wavelen <= 64)
    assert mid.any() and bool(((f[mid] < base[mid]) & (f[mid] > base[mid] / 8)).all())


def test_save_hf_dir_keeps_the_scaling(tmp_path):
    _ref, d = _checkpoint(tmp_path, SCALINGS["llama3"])
    bundle = load_hf_dir(d)
    again = load_hf_dir(save_hf_dir(bundle, tmp_path / "again"))
    assert again.args == bundle.args
