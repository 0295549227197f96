import dataclasses
from pathlib import Path

import pytest
import yaml

from hbnn.config import ConfigError, Params
from hbnn.config_read import load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def test_committed_params_equal_defaults():
    # params.yaml documents the defaults; the dataclasses must agree with it.
    assert load_params(ROOT / "params.yaml") == Params()


def test_a_partial_section_keeps_that_sections_defaults():
    """A params file that sets only some keys of a section gets the documented defaults for the rest (those of
    params.yaml and params.schema.json): hier_sampler's own, not the per-group sampler's."""
    import dataclasses

    from hbnn.config import HIER_SAMPLER, SAMPLER
    from hbnn.config_schema import params_schema

    p = parse_params({"hier_sampler": {"draws": 800, "max_draws": 4000}, "sampler": {"seed": 7},
                      "data": {"noise": 0.2}})
    assert p.hier_sampler == dataclasses.replace(HIER_SAMPLER, draws=800, max_draws=4000)
    assert p.sampler == dataclasses.replace(SAMPLER, seed=7)
    assert p.data == dataclasses.replace(Params().data, noise=0.2)
    schema = params_schema()["properties"]
    for section in ("sampler", "hier_sampler"):
        defaults = {k: v["default"] for k, v in schema[section]["properties"].items() if "default" in v}
        built = dataclasses.asdict(getattr(parse_params({section: {"seed": 1}}), section))
        assert defaults == {k: built[k] for k in defaults}, section


def test_another_backend_on_the_committed_hier_sampler():
    """`-S hier_sampler.backend=numpyro` (or pymc, blackjax, advi) alone is valid: their one diagonal adaptation is
    Stan's, which the committed diag_stan names; only nutpie has a low-rank one."""
    committed = load_params(ROOT / "params.yaml").to_dict()
    for backend in ("pymc", "numpyro", "blackjax", "advi"):
        raw = committed | {"hier_sampler": committed["hier_sampler"] | {"backend": backend, "max_draws": 0}}
        assert parse_params(raw).hier_sampler.mass_matrix == "diag_stan"
        with pytest.raises(ConfigError, match="hier_sampler.mass_matrix='low_rank'"):
            parse_params(committed | {"hier_sampler": raw["hier_sampler"] | {"mass_matrix": "low_rank"}})


def test_top_level_keys_for_dvc_overrides():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert "n_groups" in raw and "seed" in raw


def test_types_are_coerced():
    p = parse_params({"data": {"noise": 1}, "model": {"hidden_layers": [3]}})
    assert p.data.noise == 1.0 and isinstance(p.data.noise, float)
    assert p.model.hidden_layers == (3,)


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"n_groups": 0}, "n_groups=0"),
        ({"n_groups": "many"}, "n_groups='many'"),
        ({"n_groups": 2.5}, "n_groups=2.5"),
        ({"n_groups": True}, "n_groups=True"),
        ({"data": {"noise": -0.1}}, "data.noise=-0.1"),
        ({"data": {"train_fraction": 1.0}}, "data.train_fraction=1.0"),
        ({"data": {"train_fraction": 0}}, "data.train_fraction=0"),
        ({"data": {"n_samples": 4, "train_fraction": 0.1}}, "data.train_fraction=0.1"),
        ({"sampler": {"draws": 0}}, "sampler.draws=0"),
        ({"sampler": {"backend": "stan"}}, "sampler.backend='stan'"),
        ({"sampler": {"mass_matrix": "dense"}}, "sampler.mass_matrix='dense'"),
        ({"sampler": {"backend": "pymc", "mass_matrix": "low_rank"}}, "sampler.mass_matrix='low_rank'"),
        ({"sampler": {"target_accept": 1.5}}, "sampler.target_accept=1.5"),
        ({"hier_sampler": {"draws": 1000, "max_draws": 500}}, "hier_sampler.max_draws=500"),
        ({"hier_sampler": {"backend": "numpyro", "mass_matrix": "diag", "draws": 1000, "max_draws": 2500}},
         "hier_sampler.max_draws=2500"),
        ({"hier_sampler": {"backend": "numpyro", "mass_matrix": "diag", "chains": 1, "max_draws": 5000},
          "prior": {"reference_chain": 0}},
         "hier_sampler.max_draws=5000"),
        ({"hier_sampler": {"backend": "pymc", "mass_matrix": "diag", "max_draws": 5000}},
         "hier_sampler.max_draws=5000"),
        ({"sampler": {"chains": 1, "max_draws": 5000}}, "sampler.max_draws=5000"),
        ({"sampler": {"draws": 1000, "max_draws": 500}}, "sampler.max_draws=500"),
        ({"sampler": {"restarts": 1}}, "sampler.restarts=1"),  # per-group fits refit instead
        ({"sampler": {"refit_target_accept": 1.0}}, "sampler.refit_target_accept=1.0"),
        ({"hier_sampler": {"refit_target_accept": 0.995}}, "hier_sampler.refit_target_accept=0.995"),  # restarts
        ({"hier_sampler": {"restarts": -1}}, "hier_sampler.restarts=-1"),
        ({"model": {"hidden_layers": [5, 0]}}, "model.hidden_layers[1]=0"),
        ({"model": {"hidden_layers": 5}}, "model.hidden_layers=5"),
        ({"prior": {"align": "sideways"}}, "prior.align='sideways'"),
        ({"prior": {"method": "foo"}}, "prior.method='foo'"),
        ({"prior": {"jitter": 0}}, "prior.jitter=0"),
        ({"prior": {"reference_chain": 2}}, "prior.reference_chain=2"),
        ({"hier_sampler": {"chains": 1, "max_draws": 0}, "prior": {"reference_chain": 1}}, "prior.reference_chain=1"),
        ({"sampler": {"drawz": 10}}, "sampler.drawz=10"),
        ({"n_group": 10}, "n_group=10"),
        ({"data": 3}, "data=3"),
        ({"transfer": {"holdout_fraction": 1.0}}, "transfer.holdout_fraction=1.0"),
        ({"transfer": {"min_holdout": 0}}, "transfer.min_holdout=0"),
        ({"transfer": {"sizes": [4, 2]}}, "transfer.sizes=[4, 2]"),
        ({"transfer": {"sizes": [2, 2]}}, "transfer.sizes=[2, 2]"),
        ({"transfer": {"sizes": [0, 2]}}, "transfer.sizes[0]=0"),
        ({"transfer": {"sizes": [], "all_rows": False}}, "transfer.sizes=[]"),
        ({"transfer": {"seed": -1}}, "transfer.seed=-1"),
        ({"transfer": {"tune": -1}}, "transfer.tune=-1"),
        ({"report": {"embedded_pages": -1}}, "report.embedded_pages=-1"),
        ({"report": {"surface_groups": -1}}, "report.surface_groups=-1"),
    ],
)
def test_bad_values_name_key_and_value(raw, key):
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert key in str(err.value)


def test_restarts_apply_only_where_a_fit_judges_its_chains_at_a_first_look():
    hier = parse_params({}).hier_sampler
    assert hier.restarts == 2 and hier.restarts_apply
    # a quick look, another backend: accepted, and nothing to judge
    on = {"restarts": 2, "draws": 500, "max_draws": 5000}
    assert parse_params({"hier_sampler": on}).hier_sampler.restarts_apply
    for off in ({"max_draws": 0}, {"max_draws": 500}, {"backend": "numpyro", "mass_matrix": "diag"}, {"restarts": 0}):
        assert not parse_params({"hier_sampler": on | off}).hier_sampler.restarts_apply, off


def test_the_held_out_fit_tunes_as_transfer_says_and_samples_as_hier_sampler_says():
    p = parse_params({"transfer": {"tune": 250}, "hier_sampler": {"tune": 900, "draws": 1000, "seed": 4}})
    held_out = p.sampler_for("transfer_hier")
    assert held_out.tune == 250 and p.sampler_for("fit_hier").tune == 900
    assert dataclasses.replace(held_out, tune=900) == p.hier_sampler
    assert p.sampler_for("fit_flat") == p.sampler_for("transfer_flat") == p.sampler


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_groups: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


def test_section_hash_covers_only_the_named_keys():
    base = parse_params({})
    assert base.section_hash("model.hidden_layers") == parse_params({"model": {"prior_sd": 2.0}}).section_hash(
        "model.hidden_layers"
    )
    assert base.section_hash("model.hidden_layers") != parse_params({"model": {"hidden_layers": [4, 4]}}).section_hash(
        "model.hidden_layers"
    )
    assert base.section_hash("model") != parse_params({"model": {"prior_sd": 2.0}}).section_hash("model")


def test_a_key_added_later_hashes_at_its_default_as_params_without_it():
    """advi.starts (and prior.method) came after outputs were stamped with the params' hash: at the default that
    reproduces those outputs the hash is the one computed without the key, so they stay current."""
    import hashlib
    import json

    base = parse_params({})
    without = base.to_dict()["hier_sampler"]
    del without["advi"]["starts"]
    assert base.section_hash("hier_sampler") == hashlib.sha256(
        json.dumps({"hier_sampler": without}, sort_keys=True).encode()).hexdigest()[:16]
    for section in ("sampler", "hier_sampler"):
        assert parse_params({section: {"advi": {"starts": 2}}}).section_hash(section) != base.section_hash(section)


TABLE = {"data": {"source": "table", "path": "t.csv", "features": ["a", "b"], "label": "y", "group": "g"}}


def _table(**data):
    return {"data": {**TABLE["data"], **data}}


def test_table_and_model_keys_are_coerced():
    p = parse_params({**_table(split="part", standardize=False), "model": {"likelihood": "gaussian", "noise_sd": 2}})
    assert p.data.features == ("a", "b") and p.data.split == "part" and p.data.standardize is False
    assert p.model.likelihood == "gaussian" and p.model.noise_sd == 2.0
    assert parse_params({"model": {"hidden_layers": 0}}).model.hidden_layers == ()
    assert parse_params({"model": {"hidden_layers": []}}).model.hidden_layers == ()


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"data": {"source": "sql"}}, "data.source='sql'"),
        (_table(path="t.xlsx"), "data.path='t.xlsx'"),
        (_table(path=""), "data.path=''"),
        (_table(features=[]), "data.features=[]"),
        (_table(features=["a", "a"]), "data.features[1]='a'"),
        (_table(label="a"), "data.label='a'"),
        (_table(group="y"), "data.group='y'"),
        (_table(split="a"), "data.split='a'"),
        (_table(split="y"), "data.split='y': names the same column as data.label"),  # the later key, not data.group
        (_table(standardize="yes"), "data.standardize='yes'"),
        ({"model": {"likelihood": "poisson"}}, "model.likelihood='poisson'"),
        ({"model": {"noise_sd": 0}}, "model.noise_sd=0"),
        ({"model": {"likelihood": "gaussian"}}, "model.likelihood='gaussian'"),  # moons labels are 0/1
        ({"model": {"hidden_layers": 3}}, "model.hidden_layers=3"),
    ],
)
def test_bad_table_and_model_values_name_key_and_value(raw, key):
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert key in str(err.value)


def test_a_list_of_columns_is_not_offered_0_for_none():
    """A bare 0 reads as an empty list, which a list of columns may not be: only lists of numbers mention it."""
    with pytest.raises(ConfigError) as err:
        parse_params(_table(features="temp"))
    assert "expected a list of str" in str(err.value) and "0 for none" not in str(err.value)
    with pytest.raises(ConfigError, match=r"expected a list of int \(or 0 for none\)"):
        parse_params({"model": {"hidden_layers": "five"}})


def test_published_schema_is_current_and_describes_params_yaml():
    """params.schema.json is what params_schema() writes (scripts/write_params_schema.py), and fits params.yaml."""
    import json
    from pathlib import Path

    import yaml

    from hbnn.config_schema import params_schema

    root = Path(__file__).resolve().parents[1]
    schema = json.loads((root / "params.schema.json").read_text())
    assert schema == json.loads(json.dumps(params_schema())), "stale: run python scripts/write_params_schema.py"
    types = {"integer": int, "number": (int, float), "string": str, "boolean": bool, "array": list, "object": dict}

    def walk(node, value, key):
        options = node.get("anyOf", [node])
        assert any(isinstance(value, types[o["type"]]) for o in options if "type" in o), key
        if "enum" in node:
            assert value in node["enum"], key
        if isinstance(value, dict):
            assert set(value) <= set(node["properties"]), f"{key}: {set(value) - set(node['properties'])}"
            for k, v in value.items():
                walk(node["properties"][k], v, f"{key}.{k}")

    walk(schema, yaml.safe_load((root / "params.yaml").read_text()), "params")
    assert schema["properties"]["sampler"]["properties"]["backend"]["enum"] == [
        "nutpie", "pymc", "numpyro", "blackjax", "advi"]
    assert schema["properties"]["sampler"]["additionalProperties"] is False
