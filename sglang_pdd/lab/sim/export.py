"""JSON form of the paper scenario's results (for notes, dashboards and regression checks)."""

from __future__ import annotations

from dataclasses import asdict


def paper_json(res: dict) -> dict:
    def row(r) -> dict:
        d = {"label": r.label, "system": r.spec.name, "chips": r.spec.chips_by_kind(),
             "price_per_hour": r.spec.price_per_hour}
        if r.goodput is not None:
            d["goodput_rps"] = r.goodput.goodput_rps
            d["bcr"] = r.goodput.bcr
            d["goodput_load"] = r.goodput.rate
        if r.at_load is not None:
            d["at_load"] = r.at_load.as_dict()
        return d

    s = res["setting"]
    return {"load": res["load"], "runtime_s": res["runtime_s"],
            "setting": {"wan": asdict(s.wan), "sla": asdict(s.sla), "model": asdict(s.model),
                        "tight_wan_gbps": s.tight_wan_gbps, "tight_load": s.tight_load},
            "rows": [row(r) for r in res["rows"]],
            "tight_rows": [row(r) for r in res.get("tight_rows", [])]}
