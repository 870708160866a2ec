"""``inferctl plan``: the capacity planner — memory and GPUs for a model, a precision, a context
and a concurrency (the product notes' §1.1 formula and §5.1 hardware guide).

This module is the command (:func:`register`) and its output (:func:`render_rows`, a rich table
on a terminal, plain columns otherwise, ``--json``). The planner's parts are modules of their
own, re-exported here (``__all__``): the model's dimensions are read by ``tools/plan_model.py``
(:func:`read_model`, :func:`dims_from_flags`), the arithmetic — weights, KV cache, activations,
total, the GPUs it fits on and the decode bound — is ``tools/plan_compute.py``
(:func:`compute_plan`; its docstring gives the formulas), a speculative draft's share
``tools/plan_draft.py``.

Errors are :class:`PlanError` naming the flag (``--context: must be an integer >= 1, got -5``):
one line on stderr, exit code 2.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from inferctl.tools.plan_compute import (DEFAULT_MAX_NUM_BATCHED_TOKENS, KV_DTYPE_BYTES, MAX_CONCURRENCY, MAX_CONTEXT,
                                         PRECISION_BITS, Plan, activation_figures, compute_plan)
from inferctl.tools.plan_model import ModelDims, PlanError, dims_from_flags, llama_params, parse_count, read_model

__all__ = ["PRECISION_BITS", "KV_DTYPE_BYTES", "ModelDims", "Plan", "PlanError", "activation_figures",
           "MAX_CONCURRENCY", "MAX_CONTEXT", "compute_plan", "dims_from_flags", "llama_params", "parse_count",
           "precision_words", "read_model", "register"]


def render_rows(plan: Plan) -> tuple[list[tuple[str, str, str]], list[tuple[str, ...]]]:
    """(summary rows ``(quantity, value, how)``, GPU rows) as text, binary units."""
    from inferctl.contract.units import format_bytes

    m, a = plan.model, plan.activations
    dims = ", ".join(f"{k} {m[k]}" for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                             "vocab") if m.get(k) is not None)
    rows = [("model", f"{m['name']} ({m['source']})", f"{m['params']:,} parameters" + (f"; {dims}" if dims else "")),
            ("weights", format_bytes(plan.weights_bytes),
             f"{plan.weights_bytes:,} bytes = " + (f"as stored in the file ({m['stored_format']})"
                                                   if plan.precision == "stored"
                                                   else f"params × {PRECISION_BITS[plan.precision]} bits / 8"))]
    if plan.weights_stored_bytes is not None and plan.precision != "stored":
        rows.append(("weights as stored", format_bytes(plan.weights_stored_bytes),
                     f"{plan.weights_stored_bytes:,} bytes in the file ({m['stored_format']})"))
    kvt = plan.kv_bytes_per_token
    rows.append(("KV cache per token", format_bytes(kvt),
                 "no data" if kvt is None else f"2 × {m['layers']} layers × {m['kv_heads']} KV heads × "
                 f"{m['head_dim']} head dim × {KV_DTYPE_BYTES[plan.kv_cache_dtype]} bytes ({plan.kv_cache_dtype})"))
    rows.append(("KV cache", format_bytes(plan.kv_bytes),
                 f"× {plan.context:,} tokens × {plan.concurrency} sequences"))
    rows += [("activations (notes' term)", format_bytes(a["notes_term"]),
              "seq² × heads × hidden × bytes, one sequence: over-counts (the score matrix has no × hidden)"),
             ("activations (unfused scores)", format_bytes(a["unfused_attention_scores"]),
              "2 × concurrency × heads × context² × bytes: one layer's scores + probabilities, eager attention; "
              "0 with fused/flash or paged kernels"),
             ("activations (engine, per step)", format_bytes(a["engine_worst_step"]),
              "this engine's estimate of its worst step (prefill chunk or full-context decode); "
              f"it reserves {format_bytes(a['engine_profile_step'])} for its profile step"),
             ("total", format_bytes(plan.total_bytes), "weights + KV cache + engine activations"
              + (" + the draft's weights and KV cache" if plan.draft else ""))]
    if plan.draft:
        dr = plan.draft
        rows[-1:-1] = [("draft weights", format_bytes(dr["weights_bytes"]), f"{dr['method']}: {dr['name']}"),
                       ("draft KV cache", format_bytes(dr["kv_bytes"]),
                        f"{format_bytes(dr['kv_bytes_per_token'])} per token × {plan.context:,} tokens × "
                        f"{plan.concurrency} sequences (as many blocks as the target's)")]
    gpu_rows = [(g.gpu, format_bytes(g.memory_bytes), format_bytes(g.usable_bytes),
                 "yes" if g.fits else f"no: needs {g.gpus_needed}", f"{g.bandwidth_bytes_per_s / 1e12:.3g} TB/s",
                 f"{g.decode_tokens_per_s:,.0f}",
                 "-" if g.decode_tokens_per_s_at_context is None else f"{g.decode_tokens_per_s_at_context:,.0f}")
                for g in plan.gpus]
    return rows, gpu_rows


def precision_words(plan: Plan) -> str:
    """The plan's precision for its title: the ``--precision`` name (``fp16``), or for a GGUF
    file planned as stored (``--precision auto``) "the file's own precision" and its tensor
    types (``Q4_1 ×210, F32 ×61``)."""
    if plan.precision != "stored":
        return plan.precision
    fmt = plan.model.get("stored_format")
    return "the file's own precision" + (f" ({fmt})" if fmt else "")


GPU_HEADERS = ("gpu", "memory", "usable", "fits on one", "bandwidth", "decode bound tok/s (batch 1)",
               "at full context")


def _plain(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [headers, *rows])


def register(app: Any) -> None:
    """Add ``inferctl plan`` to the typer ``app``."""
    import sys

    import typer

    @app.command("plan")
    def plan(
        model: Optional[str] = typer.Argument(None, metavar="MODEL", help="Same as --model."),
        model_opt: Optional[str] = typer.Option(None, "--model", metavar="PATH",
                                                help="A local llama2.c .bin, Hugging Face directory or .gguf file."),
        precision: str = typer.Option("auto", "--precision", metavar="PRECISION",
                                      help="fp32, bf16, fp16, int8, int4, or auto (the file's own; a GGUF as stored)."),
        context: Optional[int] = typer.Option(None, "--context", metavar="TOKENS",
                                              help="Tokens per sequence (default: the model's context length)."),
        concurrency: int = typer.Option(1, "--concurrency", metavar="N", help="Sequences at full context at once."),
        kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", metavar="DTYPE",
                                           help="fp32, bf16, fp16, fp8, int8, or auto (fp32 for fp32, else 16 bits)."),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", metavar="FRACTION",
                                                     help="Share of each GPU's memory the plan may use (vLLM's)."),
        max_num_batched_tokens: int = typer.Option(DEFAULT_MAX_NUM_BATCHED_TOKENS, "--max-num-batched-tokens",
                                                   metavar="TOKENS", help="The engine's per-step token budget."),
        params: Optional[str] = typer.Option(None, "--params", metavar="COUNT", help="Parameters, e.g. 7B, 135M."),
        layers: Optional[int] = typer.Option(None, "--layers", metavar="N"),
        heads: Optional[int] = typer.Option(None, "--heads", metavar="N", help="Attention (query) heads."),
        kv_heads: Optional[int] = typer.Option(None, "--kv-heads", metavar="N", help="KV heads (GQA)."),
        head_dim: Optional[int] = typer.Option(None, "--head-dim", metavar="N", help="Default --hidden / --heads."),
        hidden: Optional[int] = typer.Option(None, "--hidden", metavar="N", help="Model (embedding) width."),
        intermediate: Optional[int] = typer.Option(None, "--intermediate", metavar="N", help="MLP width."),
        vocab: Optional[int] = typer.Option(None, "--vocab", metavar="N"),
        speculative_config: Optional[str] = typer.Option(
            None, "--speculative-config", metavar="JSON",
            help="The engine's flag: a draft model (int8_self, draft_model) adds its weights and KV cache."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (bytes)."),
    ) -> None:
        """Memory for a model at a precision, context and concurrency — weights, KV cache,
        activations — the GPUs it fits on and the batch-1 decode bound (docs/cli.md)."""
        def fail(exc: PlanError) -> None:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)

        try:
            if model and model_opt and model != model_opt:
                raise PlanError("--model", f"given twice ({model!r} and {model_opt!r})")
            spec = model or model_opt
            flags = {"--params": params, "--layers": layers, "--heads": heads, "--kv-heads": kv_heads,
                     "--head-dim": head_dim, "--hidden": hidden, "--intermediate": intermediate, "--vocab": vocab}
            if spec is not None:
                extra = [f for f, v in flags.items() if v is not None]
                if extra:
                    raise PlanError(extra[0], "give either --model or the dimension flags, not both")
                dims = read_model(spec)
            elif any(v is not None for v in flags.values()):
                dims = dims_from_flags(params, layers, heads, kv_heads, head_dim, hidden, intermediate, vocab)
            else:
                raise PlanError("--model", "give a model (a .bin, .gguf or Hugging Face directory) or its "
                                           "dimensions (--params 7B --layers 32 --kv-heads 32 --head-dim 128)")
            result = compute_plan(dims, precision, context, concurrency, kv_cache_dtype, gpu_memory_utilization,
                                  max_num_batched_tokens, speculative_config)
        except PlanError as exc:
            fail(exc)
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=1))
            return
        rows, gpu_rows = render_rows(result)
        title = (f"plan: {result.model['name']} at {precision_words(result)}, context {result.context:,}, "
                 f"concurrency {result.concurrency}, KV {result.kv_cache_dtype}")
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.table import Table

            t = Table(title=title)
            for h in ("quantity", "value", "how"):
                t.add_column(h)
            for r in rows:
                t.add_row(*r)
            g = Table(title=f"GPUs (keeping {result.gpu_memory_utilization:.0%} of memory; NVIDIA datasheets)")
            for h in GPU_HEADERS:
                g.add_column(h, justify="left" if h == "gpu" else "right")
            for r in gpu_rows:
                g.add_row(*r)
            con = Console(highlight=False)
            con.print(t)
            con.print(g)
        else:
            typer.echo(title)
            typer.echo(_plain(("quantity", "value", "how"), rows))
            typer.echo("")
            typer.echo(f"GPUs (keeping {result.gpu_memory_utilization:.0%} of memory; NVIDIA datasheets)")
            typer.echo(_plain(GPU_HEADERS, gpu_rows))
        for n in result.notes:
            typer.echo(f"note: {n}", err=True)
