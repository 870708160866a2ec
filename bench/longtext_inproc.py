"""An in-process backend for :func:`inferctl.tools.longtext.run_longtext` over the bundled engine.

The engine's HTTP API does not return prompt logprobs yet, so teacher-forced perplexity is
computed here, in-process, with the same model the engine serves:

* ``score``: one packed forward of up to ``pack`` windows over a scratch paged KV cache
  (``AttentionMetadata.build`` with ``all_logits=True``: logits for every token of each
  window), ``log_softmax`` in float32, and the logprob of each actual next token.
* ``generate``: the engine itself (``LLMEngine.add_request`` / ``step``), greedy or sampled,
  with ``repetition_penalty``, logprob of each generated token; natural EOS allowed.

``max_model_len`` may exceed the model's trained context (RoPE is computed for any
position); the engine then admits longer windows and generations, and docs/longtext.md
reports what happens to the numbers past the trained length.
"""

from __future__ import annotations

from pathlib import Path

from inferctl.tools.longtext import Generation, LongTextConfig


class EngineBackend:
    """The bundled engine in this process (see the module doc).

    Args:
        model: a model spec for ``engine.loader.load_model`` (llama2.c ``.bin``, HF dir).
        max_model_len: engine context (None = the model's trained length).
        threads: torch CPU threads.
        max_num_seqs: the engine's batch for generation.
        pack: windows per scoring forward.
    """

    def __init__(self, model: str | Path, max_model_len: int | None = None, threads: int = 2,
                 max_num_seqs: int = 32, pack: int = 8) -> None:
        from inferctl.engine.config import EngineConfig
        from inferctl.engine.engine import LLMEngine
        from inferctl.engine.loader import load_model

        bundle = load_model(str(model))
        self.bundle = bundle
        self.engine = LLMEngine(bundle, EngineConfig(num_threads=threads, max_model_len=max_model_len,
                                                     max_num_seqs=max_num_seqs, device="cpu",
                                                     # runs C/D measure past the trained context on purpose
                                                     allow_long_max_model_len=max_model_len is not None))
        self.max_model_len = int(self.engine.config.max_model_len)
        self.max_window = self.max_model_len
        self.bos_id = getattr(bundle.tokenizer, "bos_id", None)
        self.name = f"in-process engine ({bundle.name}, max_model_len {self.max_model_len})"
        self.pack = pack
        self._cache = None
        self._ids = 0

    def tokenize(self, text: str) -> list[int]:
        return list(self.bundle.tokenizer.encode(text, bos=False))

    def _scratch(self, blocks: int):
        from inferctl.engine.attention import KVCache

        if self._cache is None or self._cache[1] < blocks:
            a = self.bundle.args
            m = self.bundle.model
            bs = self.engine.config.block_size
            cache = KVCache.allocate(a.n_layers, blocks, bs, a.n_kv_heads, a.head_dim, m.dtype, m.device)
            self._cache = (cache, blocks)
        return self._cache[0]

    def score(self, windows: list[list[int]]) -> list[list[float | None]]:
        import torch

        from inferctl.engine.attention import AttentionMetadata

        bs = self.engine.config.block_size
        model = self.bundle.model
        out: list[list[float | None]] = []
        for i in range(0, len(windows), self.pack):
            part = windows[i:i + self.pack]
            need = [-(-len(w) // bs) for w in part]
            cache = self._scratch(sum(need))
            chunks, ids, pos, start = [], [], [], 0
            for w, n in zip(part, need):
                chunks.append((list(range(start, start + n)), 0, len(w), True))
                start += n
                ids.extend(w)
                pos.extend(range(len(w)))
            meta = AttentionMetadata.build(chunks, bs, model.device)
            with torch.inference_mode():
                logits = model(torch.tensor(ids, dtype=torch.long, device=model.device),
                               torch.tensor(pos, dtype=torch.long, device=model.device), cache, meta)
                logp = torch.log_softmax(logits.float(), dim=-1)
            row = 0
            for w in part:
                n = len(w)
                nxt = torch.tensor(w[1:], dtype=torch.long, device=logp.device)
                lp = logp[row:row + n - 1].gather(1, nxt.unsqueeze(1)).squeeze(1).tolist()
                out.append([None] + [float(x) for x in lp])
                row += n
        return out

    def generate(self, prompts: list[list[int]], max_tokens: list[int], config: LongTextConfig) -> list[Generation]:
        from inferctl.engine.sampling_params import SamplingParams

        eng = self.engine
        ids: list[str] = []
        for p, m in zip(prompts, max_tokens):
            rid = f"lt{self._ids}"
            self._ids += 1
            ids.append(rid)
            eng.add_request(rid, list(p), SamplingParams(max_tokens=m, temperature=config.temperature,
                                                         repetition_penalty=config.repetition_penalty,
                                                         seed=config.seed, logprobs=0))
        toks = {r: [] for r in ids}
        lps = {r: [] for r in ids}
        text = {r: "" for r in ids}
        reason: dict[str, str | None] = {r: None for r in ids}
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.request_id not in toks:
                    continue
                toks[o.request_id] += list(o.new_token_ids)
                lps[o.request_id] += [float(x) for x in o.logprobs]
                text[o.request_id] += o.new_text
                if o.finished:
                    reason[o.request_id] = o.finish_reason
        return [Generation(toks[r], lps[r], text[r], reason[r]) for r in ids]
