"""The experiment's rows as strict JSON (`bench compare --json`, `tune sweep --json`): what the markdown table
shows, with every request's TTFT, for a script to read instead of the table."""
from __future__ import annotations

from pathlib import Path


def row_json(row) -> dict:
    """One row of the table (report.Row) as --json writes it: what ran, every measured TTFT, and the simulator's
    figure."""
    r = row.rec()
    status = "skipped" if row.ent is None else row.ent["status"]
    return {"config": row.run.label(), "kind": row.run.kind, "chunk": row.run.chunk or None,
            "sigma": row.run.sigma, "input_len": row.L, "status": status,
            "median_ttft_ms": row.median, "p90_ttft_ms": r["p90_ttft_ms"] if r else None,
            "ttfts_s": list(r["ttfts"]) if r else [], "predicted_ttft_ms": row.pred, "note": row.note,
            "reason": row.ent.get("reason") if row.ent and status != "ok" else None}


def save_results_json(cfg, command: str, body: dict) -> Path:
    """`--json`: the rows with the command, commit and machine (its ISA) they were measured with."""
    from ..files import save_json
    from ..machine import machine_info, source_commit

    return save_json(cfg.json, {"command": command, "commit": source_commit(), "machine": machine_info(),
                                "pp_size": cfg.pp_size, "model": cfg.model, "input_lens": list(cfg.input_lens), **body})


def tuning_free_rows(cfg, order: list, ents: dict, ttfts, ran) -> list[dict]:
    """The tuning-free mode's rows: each configuration's TTFTs over its rounds and, for the plan, the chunks its
    requests ran (`ttfts`, `ran`: report.py's readers of the runner's entries; this module imports nothing of it)."""
    return [{"config": r.label(), "kind": r.kind, "chunk": r.chunk, "input_len": L, "ttfts_s": ttfts(ents[r.key], L),
             "chunks_ran": ran(ents[r.key], L) if r.kind == "plan" else None}
            for L in cfg.input_lens for r in order]
