"""The GGUF loader on the real SmolLM2-135M-Instruct (Q4_1) against Hugging Face transformers
reading the same file: metadata → ModelArgs, tokenizer ids, and greedy output up to the first
near-tie (top-2 margin < 0.01 in transformers' logits), through the real LLMEngine."""

from __future__ import annotations

import pytest
import torch

from tests.core_helpers import drain
from tests.gguf_helpers import NEAR_TIE, first_divergence, hf_greedy, hf_model, hf_tokenizer, require_smollm
from tests.model_helpers import Harness
from inferctl.engine.config import EngineConfig
from inferctl.engine.engine import LLMEngine
from inferctl.engine.loader import load_model
from inferctl.engine.sampling_params import SamplingParams

# minutes of CPU when the machine is shared (transformers loads and decodes too): a generous limit
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

N_TOKENS = 32
#: plain text, a chat turn in the model's format, code (each costs transformers N_TOKENS forward passes)
PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "List three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n",
]
TEXTS = [
    "Hello world", "  leading spaces and  double  spaces ", "12345 and 3.14159, 2024-11-30: 7 days",
    "héllo wörld — ünïcödé, 日本語のテキスト, emoji 🙂🚀", "tabs\tand\nnewlines\r\n\n end",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>x<repo_name>y",
    "It's we'll they've I'M", "", " ", "((a+b)*c)/d != e; x_y = {'k': [1, 2]}",
]


@pytest.fixture(scope="module")
def bundle():
    return load_model(require_smollm())


@pytest.fixture(scope="module")
def hf_tok():
    require_smollm()
    return hf_tokenizer()


@pytest.fixture(scope="module")
def hf():
    require_smollm()
    return hf_model()


def test_metadata_becomes_model_args(bundle):
    a = bundle.args
    assert (a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.hidden_dim) == (30, 576, 9, 3, 64, 1536)
    assert (a.rope_theta, a.max_seq_len, a.vocab_size, a.tie_embeddings) == (100000.0, 8192, 49152, True)
    assert a.norm_eps == pytest.approx(1e-5)
    assert a.rope_style == "interleaved"
    assert bundle.tokenizer.eos_id == 2 and bundle.tokenizer.bos_id == 1
    assert "<|im_start|>" in bundle.chat_template


def test_tokenizer_ids_equal_transformers(bundle, hf_tok):
    tok = bundle.tokenizer
    for text in TEXTS:
        ours = tok.encode(text, bos=True)  # add_bos_token is false: no BOS even when asked
        assert ours == hf_tok(text, add_special_tokens=True)["input_ids"], text
        assert tok.decode(ours) == hf_tok.decode(ours, skip_special_tokens=True), text
    assert tok.encode("<|im_start|>user", bos=False)[0] == 1
    assert tok.encode("<|im_end|>", bos=False) == [2]


def test_logits_match_transformers(bundle, hf, hf_tok):
    ids = hf_tok(PROMPTS[2])["input_ids"]
    h = Harness(bundle.model, block_size=16, num_blocks=8, shuffle=True)
    ours = h.step([(0, ids, True)])
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape
    assert float((ours - ref).abs().max()) < 2e-3


def test_greedy_equals_transformers_up_to_first_near_tie(bundle, hf, hf_tok):
    engine = LLMEngine(bundle, EngineConfig(max_model_len=512))
    ref: dict[str, tuple[list[int], list[float]]] = {}
    for i, p in enumerate(PROMPTS):
        ids = hf_tok(p)["input_ids"]
        assert ids == bundle.tokenizer.encode(p, bos=True)
        engine.add_request(str(i), ids, SamplingParams(max_tokens=N_TOKENS, temperature=0, ignore_eos=True))
        ref[str(i)] = hf_greedy(hf, ids, N_TOKENS)
    ours, _ = drain(engine)
    compared = 0
    for rid, (toks, margins) in ref.items():
        assert len(ours[rid]) == N_TOKENS
        # the outputs may part only where transformers' top two logits are within NEAR_TIE
        i = first_divergence(ours[rid], toks)
        assert i == N_TOKENS or margins[i] < NEAR_TIE, (PROMPTS[int(rid)], i, margins[i], ours[rid], toks)
        compared += i
    # most steps are not near-ties: the comparison must cover most of the tokens
    assert compared >= 0.6 * len(PROMPTS) * N_TOKENS


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And times 3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 日本"},
     {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "  spaces  \n"}],
]


def test_chat_template_renders_as_transformers(bundle, hf_tok):
    from inferctl.contract.openai import ChatMessage
    from inferctl.engine.chat_template import JinjaChatTemplate, render_chat_prompt, resolve_chat_template

    tpl = resolve_chat_template(None, bundle.chat_template, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert isinstance(tpl, JinjaChatTemplate)
    for conv in CONVERSATIONS:
        ours = render_chat_prompt([ChatMessage(**m) for m in conv], tpl)
        ref = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert ours == ref
        assert ours.endswith("<|im_start|>assistant\n")


def test_chat_answer_stops_at_im_end(bundle):
    """The model's own template + greedy: the answer names Paris and ends on <|im_end|> (EOS, id 2)."""
    from inferctl.contract.openai import ChatMessage
    from inferctl.engine.chat_template import render_chat_prompt, resolve_chat_template

    tpl = resolve_chat_template(None, bundle.chat_template)
    prompt = render_chat_prompt([ChatMessage(role="user", content="What is the capital of France?")], tpl)
    engine = LLMEngine(bundle, EngineConfig(max_model_len=512))
    engine.add_request("c", bundle.tokenizer.encode(prompt, bos=True),
                       SamplingParams(max_tokens=48, temperature=0))
    tokens, final = drain(engine)
    assert final["c"].finish_reason == "stop"
    assert tokens["c"][-1] == 2 and len(tokens["c"]) < 48
    assert "Paris" in bundle.tokenizer.decode(tokens["c"])
