"""How a trial's MLflow run is named from its configuration (`RunNaming`).

A sweep records its naming on its parent run (the `genrec.run_naming` tag, as JSON), so a store that
attaches later names trials the same way; without one, `RunNaming.from_rows` infers it from the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from genrec.platform.mlflow_rows import row_params, value_text


@dataclass(frozen=True)
class RunNaming:
    """Which configuration values name a trial's run: the swept params of each decoder
    (`beam_width=100`), the decoder when an experiment runs several (`beam(beam_width=100)`), the
    seed when it has several (`beam_width=100 seed=1`). A decoder it does not list shows every
    param. The `genrec.run_id` tag, not the name, identifies a run."""

    keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # decoder -> params in the name
    decoder: bool = False
    seed: bool = False

    def name(self, flat: dict) -> str:
        params, decoder = row_params(flat), str(flat.get("decoder", ""))
        keys = self.keys.get(decoder, tuple(params))
        pairs = [f"{k}={value_text(params[k])}" for k in keys if k in params]
        if self.decoder:
            name = f"{decoder}({', '.join(pairs)})" if pairs else decoder
        else:
            name = " ".join(pairs) or decoder
        if self.seed and flat.get("seed") is not None:
            name = f"{name} seed={flat['seed']}"
        return name.strip() or str(flat.get("run_id", ""))

    @classmethod
    def from_rows(cls, rows: list[dict]) -> RunNaming:
        """The naming rows imply when no sweep recorded one: per decoder, the params whose values
        differ between its rows."""
        by_decoder: dict[str, list[dict]] = {}
        for row in rows:
            by_decoder.setdefault(str(row.get("decoder", "")), []).append(row_params(row))
        keys = {}
        for decoder, params in by_decoder.items():
            names = dict.fromkeys(k for p in params for k in p)
            keys[decoder] = tuple(
                k for k in names if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1
            )
        seeds = {row.get("seed") for row in rows}
        return cls(keys, decoder=len(keys) > 1, seed=len(seeds) > 1)

    def to_json(self) -> str:
        return json.dumps({"keys": self.keys, "decoder": self.decoder, "seed": self.seed}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunNaming:
        d = json.loads(text)
        return cls({k: tuple(v) for k, v in d["keys"].items()}, bool(d["decoder"]), bool(d["seed"]))
