"""The pod view's pure parts: the GPU type filter, its URL round trip, the pod menu, the Prometheus expressions and
steps, and the grid a timeline is drawn on."""

from __future__ import annotations

import math

import numpy as np

from nvdash.apps.cluster_pods import ALL, KIND_NAMES, PodFilter, filter_of, pod_choices
from nvdash.apps.time_range import query_values
from nvdash.cluster.history import choose_step
from nvdash.cluster.model import ClusterPod, gpu_shares
from nvdash.cluster.pod_history import MEMORY, SM_SHARE, pod_expression
from nvdash.history.pod_history import local_step
from nvdash.history.share_table import grid_times, on_grid


def pod(namespace: str, name: str, sharing: str, gpu: int = 0, host: str = "node-1") -> ClusterPod:
    return ClusterPod(hostname=host, namespace=namespace, pod=name, container="main", gpu=gpu, uuid="", resource="",
                      sharing=sharing, mig_profile="3g.20gb" if sharing == "mig" else "")


PODS = [pod("team-a", "trainer", "whole"), pod("team-a", "notebook", "shared", 1),
        pod("team-b", "infer", "mps", 2), pod("team-b", "batch", "mps", 2), pod("team-b", "vjob", "vgpu", 3),
        pod("team-c", "mig-job", "mig", 4), pod("team-c", "notebook", "shared", 1)]


def test_every_gpu_type_is_offered_mps_apart_from_time_slicing() -> None:
    assert list(KIND_NAMES) == [ALL, "whole", "mig", "shared", "mps", "vgpu"]
    assert KIND_NAMES["shared"] == "time-sliced"
    assert KIND_NAMES["mps"] == "MPS"
    kept = [(item.namespace, item.pod) for item in PODS if PodFilter(kind="mps").keeps(item)]
    assert kept == [("team-b", "infer"), ("team-b", "batch")]
    assert [item.pod for item in PODS if PodFilter("shared", "team-c", "notebook").keeps(item)] == ["notebook"]
    assert [item.pod for item in PODS if PodFilter(ALL, ALL, "notebook").keeps(item)] == ["notebook", "notebook"]


def test_two_mps_pods_on_one_gpu_hold_half_of_it_each() -> None:
    assert gpu_shares(PODS) == [1.0, 0.5, 0.5, 0.5, 1.0, 3 / 7, 0.5]


def test_the_filter_round_trips_through_the_url() -> None:
    arguments = {"kind": [b"mps"], "namespace": [b"team-b"], "pod": [b"infer"], "range": [b"7d"]}
    chosen = filter_of(query_values(arguments))
    assert chosen == PodFilter("mps", "team-b", "infer")
    assert chosen.query() == {"kind": "mps", "namespace": "team-b", "pod": "infer"}
    assert filter_of(query_values({name: [value.encode()] for name, value in chosen.query().items()})) == chosen
    # Nothing chosen: nothing in the URL; an unknown kind is every kind.
    assert PodFilter().query() == {}
    assert filter_of({"kind": "gpu-of-the-future"}) == PodFilter()


def test_the_pod_menu_follows_the_type_and_namespace() -> None:
    assert pod_choices(PODS, PodFilter("mps")) == [(ALL, "every pod"), ("batch", "team-b/batch"),
                                                   ("infer", "team-b/infer")]
    assert pod_choices(PODS, PodFilter(ALL, "team-a")) == [(ALL, "every pod"), ("notebook", "notebook"),
                                                           ("trainer", "trainer")]
    # The same name in two namespaces is listed once (choosing it picks its first namespace).
    assert [value for value, _label in pod_choices(PODS, PodFilter("shared"))] == [ALL, "notebook"]


def test_a_pods_expression_sums_the_mean_of_each_of_its_series() -> None:
    assert pod_expression(SM_SHARE, "team-b", "infer", 1800.0) == (
        'sum(avg_over_time(nvdash_pod_gpu_sm_share_ratio{namespace="team-b", pod="infer"}[1800s]))')
    assert pod_expression(MEMORY, 'we"ird', "p\\od", 60.0) == (
        'sum(avg_over_time(nvdash_pod_gpu_memory_bytes{namespace="we\\"ird", pod="p\\\\od"}[60s]))')


def test_steps_keep_seven_days_to_a_few_hundred_points() -> None:
    week = 7 * 86_400.0
    assert choose_step(0.0, week) == 1800.0
    assert week / choose_step(0.0, week) == 336
    assert choose_step(0.0, 1800.0) == 15.0
    assert local_step(0.0, week) == 1800.0
    assert local_step(0.0, 1800.0) == 60.0


def test_a_timeline_sits_on_every_step_with_gaps_where_nothing_was_recorded() -> None:
    assert grid_times(125.0, 400.0, 60.0).tolist() == [120.0, 180.0, 240.0, 300.0, 360.0]
    values = on_grid(np.array([180.0, 300.0]), np.array([0.5, 0.8]), 125.0, 400.0, 60.0)
    assert [None if math.isnan(v) else v for v in values.tolist()] == [None, 0.5, None, 0.8, None]
