"""The long-text backend over HTTP: an engine's ``/v1/models``, ``/stats``, ``/tokenize`` and
``/v1/completions`` (the bundled engine or vLLM's OpenAI server)."""

from __future__ import annotations

import asyncio
from typing import Any

from inferctl.tools.longtext.config import LongTextConfig, LongTextError
from inferctl.tools.longtext.measure import Generation


def _error_text(resp: Any) -> str:
    try:
        doc = resp.json()
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            return str(err.get("message"))
        if isinstance(doc, dict) and "detail" in doc:
            return str(doc["detail"])
    except ValueError:
        pass
    return resp.text[:300]


def parse_prompt_logprobs(entries: Any, window: list[int]) -> list[float | None] | None:
    """vLLM's ``choices[i].prompt_logprobs`` → logprob of each window token.

    Accepts vLLM's form (a list, entry 0 null, then ``{"<token id>": {"logprob": x, ...}}``
    dicts holding at least the actual token) and a plain list of numbers. Returns None when
    ``entries`` is missing or does not match the window (wrong length, token absent).
    """
    if not isinstance(entries, list) or len(entries) != len(window):
        return None
    out: list[float | None] = [None]
    for tok, entry in zip(window[1:], entries[1:]):
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            out.append(float(entry))
        elif isinstance(entry, dict):
            item = entry.get(str(tok), entry.get(tok))
            if isinstance(item, dict):
                item = item.get("logprob")
            if not isinstance(item, (int, float)) or isinstance(item, bool):
                return None
            out.append(float(item))
        else:
            return None
    return out


class HttpBackend:
    """An engine over HTTP (the bundled engine, or vLLM's OpenAI server).

    Uses ``GET /v1/models`` (served name), ``GET /stats`` or the model card for
    ``max_model_len``, ``POST /tokenize`` (vLLM's tokenizer API) and ``POST /v1/completions``
    with token-id prompts — ``prompt_logprobs: 0`` and ``max_tokens: 1`` to score a window
    (so a window is at most ``max_model_len - 1`` tokens), ``logprobs: 0`` to generate.

    Raises:
        LongTextError: the engine cannot be reached, has no ``/tokenize``, or refuses a
            request (the engine's own message is included).
    """

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 600.0,
                 transport: Any = None, api_key: str | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_kw = dict(base_url=self.base_url, timeout=timeout, headers=headers, transport=transport)
        self._client = httpx.Client(**self._client_kw)
        self._warned = False
        models = self._get("/v1/models")
        data = models.get("data") or []
        if not data:
            raise LongTextError("url", f"{self.base_url}/v1/models lists no model")
        card = next((m for m in data if m.get("id") == model), None) if model else data[0]
        if card is None:
            raise LongTextError("model", f"{model!r} is not served at {self.base_url} "
                                         f"(served: {', '.join(str(m.get('id')) for m in data)})")
        self.model = str(card.get("id"))
        self.name = f"http {self.base_url} ({self.model})"
        mml = card.get("max_model_len")
        if not isinstance(mml, int):
            try:
                mml = (self._get("/stats").get("engine") or {}).get("max_model_len")
            except LongTextError:
                mml = None
        if not isinstance(mml, int) or mml < 3:
            raise LongTextError("url", f"{self.base_url} does not report max_model_len (neither in "
                                       "/v1/models nor in /stats)")
        self.max_model_len = mml
        self.max_window = mml - 1
        with_bos = self._tokenize("a", True)
        without = self._tokenize("a", False)
        self.bos_id = with_bos[0] if len(with_bos) == len(without) + 1 else None

    def close(self) -> None:
        self._client.close()

    # -- plumbing
    def _get(self, path: str) -> dict:
        import httpx

        try:
            r = self._client.get(path)
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"cannot reach {self.base_url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise LongTextError("url", f"GET {self.base_url}{path}: HTTP {r.status_code}: {_error_text(r)}")
        return r.json()

    def _tokenize(self, text: str, special: bool) -> list[int]:
        import httpx

        try:
            r = self._client.post("/tokenize", json={"model": self.model, "prompt": text,
                                                    "add_special_tokens": special})
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"cannot reach {self.base_url}/tokenize: {exc}") from None
        if r.status_code in (404, 405):
            raise LongTextError("url", (
                f"the engine at {self.base_url} has no POST /tokenize (vLLM's tokenizer API), which "
                "inferctl longtext needs to cut the book into token windows"))
        if r.status_code != 200:
            raise LongTextError("url", f"POST /tokenize: HTTP {r.status_code}: {_error_text(r)}")
        toks = r.json().get("tokens")
        if not isinstance(toks, list):
            raise LongTextError("url", "POST /tokenize: the answer has no 'tokens' list")
        return [int(t) for t in toks]

    def tokenize(self, text: str) -> list[int]:
        return self._tokenize(text, False)

    async def _complete(self, client: Any, sem: asyncio.Semaphore, body: dict) -> dict:
        async with sem:
            r = await client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise LongTextError(None, f"POST /v1/completions: HTTP {r.status_code}: {_error_text(r)}")
        return r.json()

    def _run_all(self, bodies: list[dict], concurrency: int) -> list[dict]:
        import httpx

        async def main() -> list[dict]:
            sem = asyncio.Semaphore(concurrency)
            kw = dict(self._client_kw)
            if kw.get("transport") is not None and not isinstance(kw["transport"], httpx.AsyncBaseTransport):
                kw["transport"] = None
            async with httpx.AsyncClient(**kw) as client:
                return await asyncio.gather(*(self._complete(client, sem, b) for b in bodies))

        try:
            return asyncio.run(main())
        except httpx.HTTPError as exc:
            raise LongTextError("url", f"{self.base_url}/v1/completions: {type(exc).__name__}: {exc}") from None

    def score(self, windows: list[list[int]]) -> list[list[float | None] | None]:
        if len(windows) and max(len(w) for w in windows) > self.max_window:
            raise LongTextError("chunk_size", f"window of {max(len(w) for w in windows)} tokens > {self.max_window}")
        bodies = [{"model": self.model, "prompt": w, "max_tokens": 1, "temperature": 0.0,
                   "prompt_logprobs": 0} for w in windows]
        docs = self._run_all(bodies, len(windows) or 1)
        return [parse_prompt_logprobs((d.get("choices") or [{}])[0].get("prompt_logprobs"), w)
                for d, w in zip(docs, windows)]

    def generate(self, prompts: list[list[int]], max_tokens: list[int],
                 config: LongTextConfig) -> list[Generation]:
        bodies = []
        for p, m in zip(prompts, max_tokens):
            b = {"model": self.model, "prompt": p, "max_tokens": m, "temperature": config.temperature,
                 "repetition_penalty": config.repetition_penalty, "logprobs": 0}
            if config.seed is not None:
                b["seed"] = config.seed
            bodies.append(b)
        out = []
        for d in self._run_all(bodies, config.concurrency):
            ch = (d.get("choices") or [{}])[0]
            lp = ch.get("logprobs") or {}
            toks = lp.get("tokens")
            lps = lp.get("token_logprobs")
            text = ch.get("text") or ""
            if not isinstance(toks, list):
                toks = list(text)   # no token list: characters as symbols (noted by the caller)
                lps = []
            out.append(Generation(tokens=toks, logprobs=list(lps or []), text=text,
                                  finish_reason=ch.get("finish_reason")))
        return out

