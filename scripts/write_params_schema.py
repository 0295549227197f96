"""Write params.schema.json, the JSON Schema of params.yaml (tests fail while it is stale)."""

import json
from pathlib import Path

from hbnn.config_schema import params_schema

if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "params.schema.json"
    path.write_text(json.dumps(params_schema(), indent=2) + "\n")
    print(f"wrote {path}")
