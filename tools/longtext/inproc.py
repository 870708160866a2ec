"""The in-process long-text backend: the engine's model in this process, driven through its
Python API (``engine.loader.load_model``, ``LlamaModel.forward`` over a paged ``KVCache`` with
``AttentionMetadata``), for what HTTP cannot carry — an embedding fed at an input position
(``--memory-compression mean``, :mod:`.markers`).

* :meth:`InProcessBackend.score`: packed teacher-forced forwards of up to ``pack`` windows over
  a scratch KV cache (``all_logits``), ``log_softmax`` in float32, the logprob of each next token.
* :meth:`InProcessBackend.generate`: batched decoding of up to ``pack`` prompts: greedy at
  temperature 0 (else sampled with ``seed``), ``repetition_penalty`` as CTRL / Hugging Face
  define it (a logit of a token already in prompt or output is divided by the penalty when
  positive, multiplied when negative; the summary placeholder is not a token and is left
  out), stopping at EOS or the model's stop tokens; each token's logprob is from the
  unpenalised distribution (as the engine reports it).
* :meth:`InProcessBackend.mean_embedding`: the mean input embedding of a list of tokens.

The same loop runs every variant (plain, [SEP], mean), so their numbers compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferctl.tools.longtext.measure import Generation

__all__ = ["InProcessBackend"]


class InProcessBackend:
    """See the module doc. ``model``: a spec for ``engine.loader.load_model`` (.bin, .gguf, HF
    dir); ``max_model_len``: None = the model's trained context; ``pack``: windows per forward;
    ``threads``: torch CPU threads (default 1: on a busy shared machine two OpenMP threads wait at
    every op's barrier for a descheduled partner — SmolLM2's decode step took 2.2 s with 2
    threads at load 14 on 2 cores, 0.25 s with 1).

    Raises FileNotFoundError / ValueError from the loader (naming the path)."""

    def __init__(self, model: str | Path, max_model_len: int | None = None, threads: int | None = 1,
                 pack: int = 4, block_size: int = 16) -> None:
        import torch

        from inferctl.engine.loader import load_model

        if threads:
            torch.set_num_threads(threads)
        self.bundle = load_model(str(model))
        self.model = self.bundle.model
        self.max_model_len = int(max_model_len or self.bundle.args.max_seq_len)
        self.max_window = self.max_model_len
        self.bos_id = getattr(self.bundle.tokenizer, "bos_id", None)
        self.name = f"in-process {self.bundle.name} (max_model_len {self.max_model_len})"
        self.pack = max(1, pack)
        self.block_size = block_size
        self._cache: Any = None
        self._blocks = 0
        tok = self.bundle.tokenizer
        self._stops = {getattr(tok, "eos_id", None), *self.bundle.stop_token_ids} - {None}

    def close(self) -> None:
        """Drop the scratch KV cache (the model stays loaded)."""
        self._cache, self._blocks = None, 0

    def tokenize(self, text: str) -> list[int]:
        return list(self.bundle.tokenizer.encode(text, bos=False))

    def mean_embedding(self, token_ids: list[int]) -> Any:
        """Mean of the model's input embeddings of ``token_ids`` (a float32 vector [dim]); None
        for no tokens."""
        import torch

        if not token_ids:
            return None
        ids = torch.tensor(token_ids, dtype=torch.long)
        uniq, counts = torch.unique(ids, return_counts=True)
        with torch.inference_mode():
            emb = self.model.embed(uniq.to(self.model.device)).float()
        return (emb * counts.to(emb.device, torch.float32)[:, None]).sum(0) / len(token_ids)

    # ---- internals
    def _kv(self, blocks: int) -> Any:
        from inferctl.engine.attention import KVCache

        if self._cache is None or self._blocks < blocks:
            a = self.bundle.args
            self._cache = KVCache.allocate(a.n_layers, blocks, self.block_size, a.n_kv_heads, a.head_dim,
                                           self.model.dtype, self.model.device)
            self._blocks = blocks
        return self._cache

    def _forward(self, seqs: list[list[int]], cached: list[int], tables: list[list[int]], all_logits: bool,
                 embeds: list[dict[int, Any] | None]) -> Any:
        """One packed forward of the new tokens ``seqs[i][cached[i]:]``; float32 logits."""
        import torch

        from inferctl.engine.attention import AttentionMetadata

        dev = self.model.device
        chunks, ids, pos, rows = [], [], [], []
        for s, c, t, e in zip(seqs, cached, tables, embeds):
            chunks.append((t, c, len(s) - c, all_logits))
            for p in range(c, len(s)):
                if e and p in e and e[p] is not None:
                    rows.append((len(ids), e[p]))
                ids.append(s[p])
                pos.append(p)
        meta = AttentionMetadata.build(chunks, self.block_size, dev)
        id_t = torch.tensor(ids, dtype=torch.long, device=dev)
        x = None
        if rows:
            x = self.model.embed(id_t).clone()
            for r, vec in rows:
                x[r] = vec.to(x.dtype)
        return self.model(id_t, torch.tensor(pos, dtype=torch.long, device=dev), self._cache, meta,
                          inputs_embeds=x).float()

    def _tables(self, lengths: list[int]) -> list[list[int]]:
        need = [-(-n // self.block_size) for n in lengths]
        self._kv(sum(need))
        out, start = [], 0
        for n in need:
            out.append(list(range(start, start + n)))
            start += n
        return out

    # ---- backend protocol
    def score(self, windows: list[list[int]], embeds: list[dict[int, Any] | None] | None = None
              ) -> list[list[float | None]]:
        import torch

        embeds = embeds or [None] * len(windows)
        out: list[list[float | None]] = []
        for i in range(0, len(windows), self.pack):
            part, emb = windows[i:i + self.pack], embeds[i:i + self.pack]
            tables = self._tables([len(w) for w in part])
            with torch.inference_mode():
                logp = torch.log_softmax(self._forward(part, [0] * len(part), tables, True, emb), dim=-1)
            row = 0
            for w in part:
                nxt = torch.tensor(w[1:], dtype=torch.long)
                lp = logp[row:row + len(w) - 1].gather(1, nxt.unsqueeze(1)).squeeze(1).tolist()
                out.append([None] + [float(x) for x in lp])
                row += len(w)
        return out

    def generate(self, prompts: list[list[int]], max_tokens: list[int], config: Any,
                 embeds: list[dict[int, Any] | None] | None = None) -> list[Generation]:
        import torch

        embeds = embeds or [None] * len(prompts)
        gen = torch.Generator().manual_seed(config.seed if config.seed is not None else 0)
        out: list[Generation] = []
        for i in range(0, len(prompts), self.pack):
            out += self._generate_batch(prompts[i:i + self.pack], max_tokens[i:i + self.pack],
                                        embeds[i:i + self.pack], config, gen)
        return out

    def score_and_generate(self, windows: list[list[int]], max_tokens: list[int], config: Any,
                           embeds: list[dict[int, Any] | None] | None = None
                           ) -> tuple[list[list[float | None]], list[Generation]]:
        """:meth:`score` and :meth:`generate` of the same windows (each window its own prompt)
        with one prefill: the teacher-forced logprobs come from the prefill's every-row logits,
        the generation continues from its KV cache. Same numbers as the two calls."""
        import torch

        embeds = embeds or [None] * len(windows)
        gen = torch.Generator().manual_seed(config.seed if config.seed is not None else 0)
        scores: list[list[float | None]] = []
        gens: list[Generation] = []
        for i in range(0, len(windows), self.pack):
            g, s = self._generate_batch(windows[i:i + self.pack], max_tokens[i:i + self.pack],
                                        embeds[i:i + self.pack], config, gen, score=True)
            gens += g
            scores += s
        return scores, gens

    def _generate_batch(self, prompts: list[list[int]], max_tokens: list[int], embeds: list[dict[int, Any] | None],
                        config: Any, gen: Any, score: bool = False) -> Any:
        import torch

        seqs = [list(p) for p in prompts]
        tables = self._tables([len(p) + m for p, m in zip(prompts, max_tokens)])
        seen = [set(t for j, t in enumerate(p) if not (e and j in e)) for p, e in zip(prompts, embeds)]
        toks: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float | None]] = [[] for _ in prompts]
        reasons: list[str | None] = [None] * len(prompts)
        active = list(range(len(prompts)))
        cached = [0] * len(prompts)
        penalty = float(config.repetition_penalty)
        scores: list[list[float | None]] = []
        with torch.inference_mode():
            logits = self._forward(seqs, cached, tables, score, embeds)
            if score:   # every row: teacher forcing; then the last row of each prompt starts decoding
                logp_all = torch.log_softmax(logits, dim=-1)
                row, last = 0, []
                for w in prompts:
                    nxt = torch.tensor(w[1:], dtype=torch.long)
                    lp = logp_all[row:row + len(w) - 1].gather(1, nxt.unsqueeze(1)).squeeze(1).tolist()
                    scores.append([None] + [float(x) for x in lp])
                    row += len(w)
                    last.append(row - 1)
                logits = logits[torch.tensor(last, dtype=torch.long)]
            while active:
                cached = [len(s) for s in seqs]
                nxt_active = []
                for row, k in enumerate(active):
                    lg = logits[row]
                    logp = torch.log_softmax(lg, dim=-1)
                    if penalty != 1.0 and seen[k]:
                        idx = torch.tensor(sorted(seen[k]), dtype=torch.long)
                        v = lg[idx]
                        lg = lg.clone()
                        lg[idx] = torch.where(v > 0, v / penalty, v * penalty)
                    if config.temperature and config.temperature > 0:
                        probs = torch.softmax(lg / config.temperature, dim=-1)
                        t = int(torch.multinomial(probs, 1, generator=gen))
                    else:
                        t = int(torch.argmax(lg))
                    toks[k].append(t)
                    lps[k].append(float(logp[t]))
                    seen[k].add(t)
                    seqs[k].append(t)
                    if t in self._stops:
                        reasons[k] = "stop"
                    elif len(toks[k]) >= max_tokens[k]:
                        reasons[k] = "length"
                    else:
                        nxt_active.append(k)
                active = nxt_active
                if active:
                    logits = self._forward([seqs[k] for k in active], [cached[k] for k in active],
                                           [tables[k] for k in active], False, [None] * len(active))
        tok = self.bundle.tokenizer
        gens = [Generation(t, lp, tok.decode([x for x in t if x not in self._stops]), r)
                for t, lp, r in zip(toks, lps, reasons)]
        return (gens, scores) if score else gens
