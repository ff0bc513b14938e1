"""A stored sweep profile (estimator/coverage-profiles/<type>.json, written by `hpcmem validate coverage`) and the
learner's job spec for it: what tests of the learner's variant cells build their traced jobs on."""

from __future__ import annotations

import json


def sweep_profile(model_type: str):
    from hpcmem.datapath import estimator_dir
    from hpcmem.models.profile import profile_from_dict

    return profile_from_dict(json.loads((estimator_dir() / "coverage-profiles" / f"{model_type}.json").read_text()))


def sweep_spec(model_type: str):
    """(the profile, the ModelSpec the learner traces it as)."""
    from hpcmem.models.profile import spec_from_profile

    p = sweep_profile(model_type)
    return p, spec_from_profile(p, p.model_type)
