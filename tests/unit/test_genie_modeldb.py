"""The model database: lookups, similarity fallback, files and rows, the built-in table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from masterd.core.genie import model as perf
from masterd.core.genie.model import Coefficients
from masterd.core.genie.modeldb import (
    DEFAULT_GPU_MODEL,
    DEFAULT_SOURCE,
    INFERENCE_SPEEDUP,
    ROW_FIELDS,
    ModelDB,
    ModelDBError,
    ModelEntry,
)
from masterd.core.genie.options import load_modeldb


def entry(model_type: str, family: str | None, params: float | None, k0: float,
          gpu: str = "V100", kind: str = "training") -> ModelEntry:
    return ModelEntry(model_type, gpu, kind, Coefficients(k0, 1.0, -0.001, 0.5, 0.3, 10.0),
                      family, params, "test")


@pytest.fixture
def db() -> ModelDB:
    return ModelDB([
        entry("ResNet50", "cnn", 25.6, 1.0),
        entry("VGG16", "cnn", 138.0, 2.0),
        entry("MobileNet", "cnn", 4.2, 3.0),
        entry("LSTM", "rnn", 20.0, 4.0),
        entry("Transformer", "attention", 65.0, 5.0),
        entry("ResNet50", "cnn", 25.6, 6.0, gpu="Tesla K80"),
        entry("LSTM", "rnn", 20.0, 7.0, kind="inference"),
    ], default_gpu_model="V100")


def test_exact_lookup_ignores_case_and_punctuation(db: ModelDB) -> None:
    res = db.resolve("resnet-50", "v100")
    assert res is not None and not res.fallback and res.reason == ""
    assert res.coefficients.k0 == 1.0 and res.model_type == "ResNet50"
    k80 = db.resolve("RESNET_50", "Tesla-K80")
    assert k80 is not None and k80.coefficients.k0 == 6.0


def test_unknown_type_falls_back_to_same_family_nearest_size(db: ModelDB) -> None:
    res = db.resolve("ResNet101", "V100", family="CNN", params_m=44.5)
    assert res is not None and res.fallback
    assert res.model_type == "ResNet50"  # log-distance 0.55 beats VGG16's 1.13
    assert "'ResNet101' not profiled" in res.reason and "ResNet50" in res.reason
    tiny = db.resolve("SqueezeNet", "V100", family="cnn", params_m=1.2)
    assert tiny is not None and tiny.model_type == "MobileNet"


def test_family_wins_over_size(db: ModelDB) -> None:
    # 60M params is closest to Transformer (65M), but the declared family is rnn.
    res = db.resolve("GRU", "V100", family="rnn", params_m=60.0)
    assert res is not None and res.model_type == "LSTM"


def test_unknown_family_falls_back_by_size_alone(db: ModelDB) -> None:
    res = db.resolve("Mystery", "V100", family="gan", params_m=130.0)
    assert res is not None and res.model_type == "VGG16" and res.fallback


def test_a_job_without_model_type_can_still_match_by_family_or_size(db: ModelDB) -> None:
    res = db.resolve(None, "V100", family="attention")
    assert res is not None and res.model_type == "Transformer"
    assert "no model type" in res.reason
    assert db.resolve(None, "V100") is None
    assert db.resolve("Mystery", "V100") is None  # nothing to judge similarity by
    assert db.resolve("Mystery", "V100", family="gan") is None


def test_unprofiled_gpu_model_uses_the_default_gpu(db: ModelDB) -> None:
    res = db.resolve("VGG16", "A100-SXM4-40GB")
    assert res is not None and res.fallback and res.gpu_model == "V100"
    assert "'A100-SXM4-40GB' not profiled" in res.reason
    assert ModelDB([entry("VGG16", "cnn", 138.0, 2.0)]).resolve("VGG16", "A100") is None


def test_inference_uses_its_own_profile_or_the_training_one_sped_up(db: ModelDB) -> None:
    own = db.resolve("LSTM", "V100", kind="inference")
    assert own is not None and not own.fallback and own.coefficients.k0 == 7.0
    derived = db.resolve("VGG16", "V100", kind="inference")
    assert derived is not None and derived.fallback and "training fit" in derived.reason
    assert derived.coefficients.k0 == pytest.approx(2.0 * INFERENCE_SPEEDUP)
    assert derived.coefficients.gamma == 0.0
    with pytest.raises(ModelDBError, match="kind"):
        db.resolve("VGG16", "V100", kind="serving")


def test_json_and_toml_files_round_trip(db: ModelDB, tmp_path: Path) -> None:
    for suffix in (".json", ".toml"):
        path = tmp_path / f"models{suffix}"
        db.save(path)
        again = ModelDB.load(path)
        assert again.entries() == db.entries()
        assert again.default_gpu_model == "V100"
        assert load_modeldb(str(path)).entries() == db.entries()


def test_rows_round_trip_for_the_sqlite_store(db: ModelDB) -> None:
    rows = db.to_rows()
    assert all(len(r) == len(ROW_FIELDS) for r in rows)
    assert ModelDB.from_rows(rows).entries() == db.entries()
    as_dicts = [dict(zip(ROW_FIELDS, r, strict=True)) for r in rows]
    assert ModelDB.from_rows(as_dicts, default_gpu_model="V100").entries() == db.entries()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"models": [{"model_type": "x", "gpu_model": "g", "k0": 1, "k1": 0}]}',
         r"models\[0\]: k2 is required"),
        ('{"models": [{"model_type": "x", "gpu_model": "g", "k0": "fast", "k1": 0, "k2": 0}]}',
         r"models\[0\]: k0 must be a number"),
        ('{"models": [{"model_type": "x", "gpu_model": "g", "k0": 1, "k1": 0, "k2": 0, '
         '"gamma": -1}]}', r"models\[0\]: gamma must be >= 0"),
        ('{"models": [{"model_type": "x", "gpu_model": "g", "k0": 1, "k1": 0, "k2": 0, '
         '"speed": 3}]}', "unknown fields speed"),
        ('{"models": [{"model_type": "x", "gpu_model": "g", "kind": "serve", "k0": 1, '
         '"k1": 0, "k2": 0}]}', "kind must be one of"),
        ('{"models": [{"model_type": "", "gpu_model": "g", "k0": 1, "k1": 0, "k2": 0}]}',
         "model_type must be a name"),
        ('{"models": [{"model_type": "x", "gpu_model": "g", "k0": 1, "k1": 0, "k2": 0, '
         '"params_m": -3}]}', "params_m must be a number > 0"),
        ('{"models": {"a": 1}}', "'models' must be a list"),
        ('{"modles": []}', "unknown top-level keys: modles"),
        ('[1, 2]', "must be a table"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_files_get_an_error_naming_the_field(tmp_path: Path, content: str,
                                                 message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ModelDBError, match=message):
        ModelDB.load(path)


def test_bad_paths_and_rows_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelDBError, match="cannot read"):
        ModelDB.load(tmp_path / "missing.json")
    (tmp_path / "models.yaml").write_text("models: []")
    with pytest.raises(ModelDBError, match=r"use a \.json or \.toml"):
        ModelDB.load(tmp_path / "models.yaml")
    (tmp_path / "bad.toml").write_text("models = [")
    with pytest.raises(ModelDBError, match="not valid TOML"):
        ModelDB.load(tmp_path / "bad.toml")
    with pytest.raises(ModelDBError, match="row 0: expected 13 columns"):
        ModelDB.from_rows([("x", "g", "training")])
    with pytest.raises(ValueError, match=r"path to a \.json/\.toml"):
        load_modeldb(42)  # type: ignore[arg-type]


def test_the_default_table_covers_genies_six_types_and_says_what_it_is() -> None:
    db = ModelDB.default()
    assert db.default_gpu_model == DEFAULT_GPU_MODEL
    types = {e.model_type for e in db.entries()}
    assert types == {"Alexnet", "GoogleNet", "ResNet50", "Inception-v3", "LSTM", "Seq2seq"}
    assert len(db) == 12  # training and inference for each
    for e in db.entries():
        assert e.source == DEFAULT_SOURCE
        c = e.coefficients
        # A sane single-GPU curve: positive at batch 1, rising to a plateau.
        assert perf.single_gpu_rate(c, 1) > 0
        assert c.plateau_batch is not None and c.plateau_batch > 32
        assert perf.single_gpu_rate(c, 32) > perf.single_gpu_rate(c, 1)
        inference = e.kind == "inference"
        # Two nodes of one GPU never lose both GPUs to communication.
        assert perf.processing_rate(c, 64, 2, 1, inference) is not None
    # Fig. 4: Inception-v3 cannot train with batch 128 on one GPU.
    inception = db.get("inception_v3", DEFAULT_GPU_MODEL)
    assert inception is not None
    assert perf.processing_rate(inception.coefficients, 128, 1, 1) is None
    assert perf.processing_rate(inception.coefficients, 128, 1, 2) is not None


def test_saved_json_is_readable_by_people(tmp_path: Path) -> None:
    path = tmp_path / "db.json"
    ModelDB.default().save(path)
    data = json.loads(path.read_text())
    assert data["default_gpu_model"] == DEFAULT_GPU_MODEL
    assert {"model_type", "gpu_model", "kind", "k0", "gamma", "source"} <= set(data["models"][0])
