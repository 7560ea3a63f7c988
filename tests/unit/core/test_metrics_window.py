"""A process's metrics window: labels summed away, totals, increases over at most
WINDOW_S, gauges as they are."""

from __future__ import annotations

from core.metrics import Sample, Snapshot
from core.metrics_window import MetricsWindow, Series, merged, snapshot_of


def snap(g: float = 0.0, **values: float) -> Snapshot:
    """``ok=3`` -> gristmill_x_total{code="ok", model="a"} 3 and {code="ok", model="b"} 1;
    ``g`` -> gristmill_g{class="paid"} g and {class="free"} 1."""
    s = Snapshot()
    for code, v in values.items():
        s.samples.setdefault("gristmill_x_total", []).extend(
            [Sample({"code": code, "model": "a"}, v), Sample({"code": code, "model": "b"}, 1.0)]
        )
    s.samples["gristmill_g"] = [Sample({"class": "paid"}, g), Sample({"class": "free"}, 1.0)]
    return s


def window(*, peak: bool = False) -> MetricsWindow:
    return MetricsWindow(
        (
            Series("gristmill_x_total", ("code",)),
            Series("gristmill_g", counter=False, peak=peak),
        ),
        span_s=10.0,
    )


def test_the_first_window_is_empty_and_carries_totals_summed_over_labels_not_kept() -> None:
    pub = window().publish(100.0, snap(g=7, ok=3, bad=-1))
    assert pub["window_s"] == 0
    assert pub["total"] == {"gristmill_x_total": [[{"code": "ok"}, 4.0]]}  # bad sums to 0
    assert pub["increase"] == {}
    assert pub["gauges"] == {"gristmill_g": [[{}, 8.0]]}


def test_a_peak_gauge_takes_the_largest() -> None:
    assert window(peak=True).publish(0.0, snap(g=7))["gauges"] == {"gristmill_g": [[{}, 7.0]]}


def test_increase_is_over_the_newest_snapshot_at_least_span_old() -> None:
    w = window()
    for t in range(0, 12):  # one count a second
        pub = w.publish(100.0 + t, snap(ok=float(t)))
    assert pub["window_s"] == 10.0
    assert pub["increase"] == {"gristmill_x_total": [[{"code": "ok"}, 10.0]]}
    assert pub["total"] == {"gristmill_x_total": [[{"code": "ok"}, 12.0]]}


def test_a_series_born_inside_the_window_counts_from_zero() -> None:
    w = window()
    w.publish(0.0, snap(ok=5))
    pub = w.publish(4.0, snap(ok=6, bad=2))
    assert pub["window_s"] == 4.0
    got = {p[0]["code"]: p[1] for p in pub["increase"]["gristmill_x_total"]}
    assert got == {"ok": 1.0, "bad": 3.0}


def test_a_gap_longer_than_the_span_keeps_one_base() -> None:
    w = window()
    w.publish(0.0, snap(ok=1))
    w.publish(1.0, snap(ok=2))
    pub = w.publish(30.0, snap(ok=4))  # the process was stalled: the window is what it is
    assert pub["window_s"] == 29.0
    assert pub["increase"]["gristmill_x_total"] == [[{"code": "ok"}, 2.0]]


def test_published_parts_read_back_scaled_and_merged() -> None:
    a = snapshot_of({"gristmill_x_total": [[{"code": "ok"}, 10]]}, 0.1)
    b = snapshot_of({"gristmill_x_total": [[{"code": "ok"}, 4], [{"code": "bad"}, 2]]}, 0.5)
    both = merged([a, b])
    assert both.get("gristmill_x_total", code="ok") == 3.0
    assert both.get("gristmill_x_total") == 4.0
