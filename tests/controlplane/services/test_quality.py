"""The control plane's comparison of a model across regions: a region whose workers all
agree with each other, and all answer wrong, is flagged against the other regions; regions
that differ by no more than their noise are not."""

from __future__ import annotations

from typing import Any

from controlplane.services.quality import compare, region_quality


def _beat(model: str, answers: int, flagged: dict[str, int], score: float,
          reference: str = "ref-a") -> dict[str, Any]:  # fmt: skip
    return {"quality": [{"model": model, "answers": answers, "flagged": flagged,
                         "canaries": [{"name": "river", "reference": reference, "workers": 3,
                                       "score": score}]}],
            "quality_held": []}  # fmt: skip


def _regions(**beats: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    return {region: region_quality(b) for region, b in beats.items()}


def test_a_region_whose_canaries_score_low_everywhere_is_flagged() -> None:
    compared = compare(_regions(
        east=[_beat("llama", 200, {}, -1.20), _beat("llama", 150, {}, -1.22)],
        west=[_beat("llama", 180, {}, -1.21)],
        eu=[_beat("llama", 190, {}, -1.60)],  # its workers agree: wrong weights everywhere
    ))  # fmt: skip
    llama = compared["llama"]
    assert [(f["region"], f["check"]) for f in llama["flagged"]] == [("eu", "canary:river")]
    assert llama["flagged"][0]["figure"] < llama["flagged"][0]["peers_figure"]
    assert llama["alert"]
    assert llama["regions"]["east"]["answers"] == 350  # its two nodes' answers summed


def test_a_region_whose_replicas_continue_the_golden_prompt_differently_is_flagged() -> None:
    compared = compare(_regions(
        east=[_beat("llama", 50, {}, -1.2)], west=[_beat("llama", 50, {}, -1.2)],
        eu=[_beat("llama", 50, {}, -1.2, reference="ref-b")],
    ))  # fmt: skip
    assert [(f["region"], f["check"]) for f in compared["llama"]["flagged"]] == [
        ("eu", "canary:river:reference")
    ]


def test_a_detector_flagging_one_region_far_more_than_the_others_flags_it() -> None:
    compared = compare(_regions(
        east=[_beat("llama", 400, {"length": 40, "foreign": 1}, -1.2)],
        west=[_beat("llama", 400, {"length": 44}, -1.2)],
        eu=[_beat("llama", 400, {"length": 38, "foreign": 120}, -1.2)],
    ))  # fmt: skip
    found = compared["llama"]["flagged"]
    assert [(f["region"], f["check"]) for f in found] == [("eu", "foreign")]
    assert compared["llama"]["regions"]["eu"]["flagged_share"]["foreign"] == 0.3


def test_regions_within_their_noise_and_a_pair_are_not_flagged() -> None:
    alike = compare(_regions(
        east=[_beat("llama", 300, {"length": 30}, -1.20)],
        west=[_beat("llama", 300, {"length": 36}, -1.23)],
        eu=[_beat("llama", 300, {"length": 27}, -1.19)],
    ))  # fmt: skip
    assert alike["llama"]["flagged"] == []
    assert alike["llama"]["alert"] is None
    pair = compare(_regions(east=[_beat("llama", 50, {}, -1.2)],
                            west=[_beat("llama", 50, {}, -3.0, reference="ref-b")]))  # fmt: skip
    assert pair["llama"]["flagged"] == []  # of two that differ, neither is the odd one
