"""SODA's adaptive CPU allocator, first half (§V-B1): the core count a training job starts at.

N_start is the largest core count the owner's previous jobs of the same model category
converged to; for an owner's first job of a category it is the paper's category default
(CV 3, NLP 5, speech 5). Declared traits then adjust it: −1 for pipelined input, −1 for large
weights, +1 for heavy preprocessing between iterations. The result is clamped to
``[1, available]``. ``noded.policy.tuner.CoreTuner`` then searches from there.

The three traits are read by :func:`declared_traits`, the one adapter between the job's
description and this module: the spec's ``traits`` (``pipelined_input`` / ``large_weights`` /
``heavy_preprocessing``) where the job declares them, else its environment variables
``TRELLIS_PIPELINED_INPUT`` / ``TRELLIS_LARGE_WEIGHTS`` / ``TRELLIS_HEAVY_PREPROCESSING``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from shared.model import JobSpec

CATEGORY_DEFAULTS: Mapping[str, int] = {"cv": 3, "nlp": 5, "speech": 5}
# With neither a category nor any history, start where the most CPU-hungry default does:
# starting too high costs one probing step, too low starves the GPU while tuning.
UNKNOWN_DEFAULT = max(CATEGORY_DEFAULTS.values())

# Spellings of model_family accepted for the paper's three categories.
FAMILY_ALIASES: Mapping[str, str] = {
    "cv": "cv", "vision": "cv", "image": "cv", "computervision": "cv",
    "nlp": "nlp", "text": "nlp", "language": "nlp", "translation": "nlp",
    "speech": "speech", "audio": "speech", "asr": "speech", "tts": "speech",
}

# Known model types by name prefix (normalised: lower case, letters and digits only), longest
# prefix wins. The paper's Table I models plus common relatives.
MODEL_PREFIXES: Mapping[str, str] = {
    "alexnet": "cv", "vgg": "cv", "inception": "cv", "resnet": "cv", "resnext": "cv",
    "densenet": "cv", "mobilenet": "cv", "efficientnet": "cv", "vit": "cv", "yolo": "cv",
    "maskrcnn": "cv", "fasterrcnn": "cv", "unet": "cv", "convnext": "cv", "swin": "cv",
    "bert": "nlp", "roberta": "nlp", "gpt": "nlp", "t5": "nlp", "transformer": "nlp",
    "biattflow": "nlp", "bidaf": "nlp", "lstm": "nlp", "seq2seq": "nlp",
    "xlnet": "nlp", "llama": "nlp",
    "wavenet": "speech", "deepspeech": "speech", "tacotron": "speech", "wav2vec": "speech",
    "conformer": "speech", "whisper": "speech",
}

TRAIT_ENV = {
    "pipelined_input": "TRELLIS_PIPELINED_INPUT",
    "large_weights": "TRELLIS_LARGE_WEIGHTS",
    "heavy_preprocessing": "TRELLIS_HEAVY_PREPROCESSING",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

# (owner, category) -> the largest core count that owner's jobs of that category converged to.
CoreHistory = Mapping[tuple[str, str], int]


@dataclass(frozen=True)
class JobTraits:
    """What the owner declared about the job's CPU side (§V-B1)."""

    pipelined_input: bool = False
    large_weights: bool = False
    heavy_preprocessing: bool = False


@dataclass(frozen=True)
class CoreStart:
    """N_start and how it was reached (for the master's log and ``trellisctl`` output)."""

    cores: int
    category: str | None
    from_history: bool  # True: a warm start, the tuner may trust it within a few cores
    reason: str


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def category_of(spec: JobSpec) -> str | None:
    """The model category: ``model_family`` when given, else inferred from ``model_type``.

    A family outside the paper's three is kept as its own category (history still applies,
    there is just no default for it); None means nothing was declared or recognised.
    """
    if spec.model_family:
        family = _normalise(spec.model_family)
        if family:
            return FAMILY_ALIASES.get(family, family)
    if spec.model_type:
        name = _normalise(spec.model_type)
        matches = [prefix for prefix in MODEL_PREFIXES if name.startswith(prefix)]
        if matches:
            return MODEL_PREFIXES[max(matches, key=len)]
    return None


def _flag(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{what} must be a boolean (1/0, true/false, yes/no), got {value!r}")


_NONE_DECLARED = JobTraits()


def declared_traits(spec: JobSpec) -> JobTraits:
    """The three traits from the spec's ``traits`` where declared, else from its env."""
    env = spec.env
    if not env:
        for name in TRAIT_ENV:
            if getattr(spec.traits, name) is not None:
                break
        else:
            return _NONE_DECLARED  # the usual case, read at every submission
    values: dict[str, bool] = {}
    for name, env_key in TRAIT_ENV.items():
        field_value = getattr(spec.traits, name)
        if field_value is not None:
            values[name] = _flag(field_value, f"job {spec.name}: {name}")
        elif env_key in env:
            values[name] = _flag(env[env_key], f"job {spec.name}: env {env_key}")
        else:
            values[name] = False  # declared nowhere: the usual case, checked per submission
    return JobTraits(**values)


def start_point(
    spec: JobSpec, history: CoreHistory, available: int | None = None
) -> CoreStart:
    """N_start with its provenance. ``available`` is the most cores the job could get."""
    if available is not None and available < 1:
        raise ValueError(f"available cores must be at least 1, got {available}")
    category = category_of(spec)
    owner = spec.user
    notes: list[str] = []
    if category is not None and (owner, category) in history:
        base = history[(owner, category)]
        from_history = True
        notes.append(f"owner {owner} history for {category}: {base}")
    elif category is None and any(user == owner for user, _ in history):
        # The owner named no category: their own history is still the best guide (§V-B1).
        base = max(cores for (user, _), cores in history.items() if user == owner)
        from_history = True
        notes.append(f"no category; owner {owner} history max: {base}")
    else:
        base = CATEGORY_DEFAULTS.get(category, UNKNOWN_DEFAULT) if category else UNKNOWN_DEFAULT
        from_history = False
        notes.append(f"default for {category or 'unknown category'}: {base}")
    if base < 1:
        raise ValueError(f"history for ({owner}, {category}) holds {base} cores; must be >= 1")
    traits = declared_traits(spec)
    cores = base
    if traits.pipelined_input:
        cores -= 1
        notes.append("pipelined input -1")
    if traits.large_weights:
        cores -= 1
        notes.append("large weights -1")
    if traits.heavy_preprocessing:
        cores += 1
        notes.append("heavy preprocessing +1")
    upper = available if available is not None else cores
    clamped = min(max(cores, 1), max(upper, 1))
    if clamped != cores:
        notes.append(f"clamped to {clamped}")
    return CoreStart(clamped, category, from_history, "; ".join(notes))


def initial_cores(spec: JobSpec, history: CoreHistory, available: int | None = None) -> int:
    """SODA's N_start for ``spec`` (§V-B1), clamped to ``[1, available]``."""
    return start_point(spec, history, available).cores


def remember(
    history: MutableMapping[tuple[str, str], int], spec: JobSpec, converged_cores: int
) -> None:
    """Record a finished tuning: the history keeps the largest count per (owner, category)."""
    if converged_cores < 1:
        raise ValueError(f"converged core count must be at least 1, got {converged_cores}")
    category = category_of(spec)
    if category is None:
        # Keyed under a placeholder so the owner's history still informs category-less jobs.
        category = "unknown"
    key = (spec.user, category)
    history[key] = max(history.get(key, 0), converged_cores)
