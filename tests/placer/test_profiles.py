"""Profiles: built-ins compile; a bad plugin, weight, argument or choice is a clear error."""

from __future__ import annotations

import pytest

from services.placer.core.profiles import (
    BUILTIN,
    ProfileError,
    ProfileSpec,
    ScoreSpec,
    build_profile,
    load_profile_spec,
)


@pytest.mark.parametrize("name", list(BUILTIN))
def test_builtin_profiles_compile(name: str) -> None:
    profile = build_profile(name)
    assert profile.name == name
    assert profile.filters[0].name == "fit"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fdg"),)),
            "profile 'p': unknown score plugin 'fdg' (known: balanced, bestfit,",
            id="unknown-plugin",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd", weight=0),)),
            "weight of 'fgd' must be in (0, 100], got 0",
            id="zero-weight",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd", weight=500),)),
            "must be in (0, 100], got 500",
            id="huge-weight",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd", args={"exact": "yes"}),)),
            "argument 'exact' must be true or false",
            id="bad-argument-type",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="packing", args={"x": 1}),)),
            "plugin 'packing': takes no arguments, got x",
            id="unexpected-argument",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="balanced", args={"w1": -1}),)),
            "weights w1..w5 must be >= 0",
            id="negative-balance-weight",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd", args={"step": 0}),)),
            "argument 'step' must be an integer in 1..50",
            id="fgd-step",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd", args={"demand_weight": -1}),)),
            "argument 'demand_weight' must be a number >= 0",
            id="fgd-demand-weight",
        ),
        pytest.param(
            ProfileSpec(
                name="p", scores=(ScoreSpec(plugin="fgd-fed", args={"first_copy_exact": 1}),)
            ),
            "argument 'first_copy_exact' must be true or false",
            id="fed-first-copy",
        ),
        pytest.param(
            ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-fed", args={"margin": 1}),)),
            "(known: first_copy_exact, memory_margin, scarcity, unfed_weight)",
            id="fed-unknown-argument",
        ),
        pytest.param(
            ProfileSpec(name="p", gpu_choice="tightest"),
            "unknown GPU choice 'tightest'",
            id="unknown-gpu-choice",
        ),
        pytest.param(
            ProfileSpec(name="p", tie_break="coin"), "unknown tie-break 'coin'", id="tie-break"
        ),
    ],
)
def test_invalid_profiles_are_clear_errors(spec: ProfileSpec, message: str) -> None:
    with pytest.raises(ProfileError) as error:
        build_profile(spec)
    assert message in str(error.value)


def test_unknown_builtin_name() -> None:
    with pytest.raises(ProfileError, match="unknown profile 'tesera'"):
        build_profile("tesera")


def test_profile_from_operator_config() -> None:
    spec = load_profile_spec(
        {"name": "mine", "scores": [{"plugin": "binpack", "weight": 2}], "gpu_choice": "spread"}
    )
    profile = build_profile(spec)
    assert [(p.name, w) for p, w in profile.scores] == [("binpack", 2.0)]
    with pytest.raises(ProfileError, match="invalid profile"):
        load_profile_spec({"name": "mine", "scorez": []})
