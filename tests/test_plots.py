"""Figure readability, checked on the figures the pages draw from the committed results: every marker at
its own batch, cards smallest first, one colour and one order per backend everywhere, markers that
would hide each other drawn apart, and no label over a line or another label."""

import itertools
import re

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import rgb_to_hsv, to_rgb

from harness.report import agreement, data, plots, scaling, style, tables, text
from harness.spec import CARDS

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def committed():
    results = data.read()
    cells, calls = data.load(results)
    return results, cells, calls


def test_each_regime_shows_its_cards_smallest_first_and_every_probe_at_its_own_batch(committed):
    results, _, _ = committed
    probes = data.ceiling_probes(results)
    if probes.empty:
        pytest.skip("no ceiling probe committed")
    figures = plots.probe_figures(probes)
    assert sum(len(group) for _, group in figures) == len(probes)
    for (stack, regime), keys in itertools.groupby([key for key, _ in figures], key=lambda key: key[:2]):
        sizes = [CARDS[card].nominal_gb or 0 for _, _, card in keys]
        assert sizes == sorted(sizes), (stack, regime, sizes)
    for _, group in figures[:3]:
        figure = plots.plot_probe_peaks(group, "probes")
        batches = set(group["batch_size"].astype(float))
        for axis in figure.axes:
            drawn = {float(x) for collection in axis.collections for x in collection.get_offsets()[:, 0]}
            assert drawn <= batches, f"markers away from every probed batch: {sorted(drawn - batches)}"
        matplotlib.pyplot.close(figure)


def test_a_backend_has_one_colour_one_marker_and_one_place_in_every_order():
    backends = ["vanilla", "lik", "flash", "vanilla + chunk 16", "vanilla + chunk 32", "vanilla + chunk 64",
                "vanilla + chunk 128", "vanilla + chunk 256"]  # fmt: skip
    colours = [style.colour(b) for b in backends]
    assert len(set(colours)) == len(backends) and len({style.look(b).marker for b in backends}) == len(backends)
    assert style.OTHER.colour not in colours
    hues = {b: rgb_to_hsv(to_rgb(style.colour(b)))[0] for b in backends}
    apart = abs(hues["vanilla + chunk 16"] - hues["vanilla + chunk 64"])
    assert min(apart, 1 - apart) > 0.1  # chunk 16 beside chunk 64 (the GradCache page): not a shade of red, as pink was
    for shuffled in (backends[::-1], backends[3:] + backends[:3]):
        assert style.in_order(shuffled) == ["vanilla", "lik", "flash", "vanilla + chunk 16", "vanilla + chunk 32",
                                             "vanilla + chunk 64", "vanilla + chunk 128", "vanilla + chunk 256"]  # fmt: skip
    assert style.in_order(["other", "vanilla + chunk 64", "vanilla"]) == ["vanilla", "vanilla + chunk 64", "other"]


def _centres(figure, lines):
    figure.canvas.draw()
    return [line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))[0] for line in lines]


def test_the_gradcache_step_peaks_stand_apart_around_their_true_batch(committed):
    _, cells, calls = committed
    cells, calls = data.select(cells, "pylate", "gradcache"), data.select(calls, "pylate", "gradcache")
    if cells.empty:
        pytest.skip("no GradCache cell committed")
    figure = scaling.plot_gradcache(cells, calls)
    axis = figure.axes[0]
    peaks = [line for line in axis.get_lines() if line.get_label().endswith("step peak, measured")]
    assert len(peaks) >= 2
    measured = set(scaling.gradcache_cells(cells)["batch_size"].astype(float))
    assert all(set(np.asarray(line.get_xdata(), float)) <= measured for line in peaks)  # the data: the true batch
    centres = _centres(figure, peaks)
    for (one, a), (other, b) in itertools.combinations(zip(peaks, centres, strict=True), 2):
        apart = abs(a[0] - b[0]) / figure.dpi * 72  # points
        assert apart >= (one.get_markersize() + other.get_markersize()) / 2, (one.get_label(), other.get_label())
    middle = np.mean([c[0] for c in centres])
    true_x = axis.transData.transform((float(peaks[0].get_xdata()[0]), 1.0))[0]
    assert middle == pytest.approx(true_x, abs=1.0)  # the group is centred on its batch
    legend = [t.get_text() for t in axis.get_legend().get_texts()]
    backends = [name for name in legend if name in set(cells["backend"])]
    assert backends == style.in_order(backends)
    matplotlib.pyplot.close(figure)


def _overlaps(figure, texts, lines=()):
    """Pairs of labels whose boxes intersect, and labels a line's drawn path runs through."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_text() and t.get_visible()]
    found = [(a, b) for (a, one), (b, other) in itertools.combinations(boxes, 2) if one.overlaps(other)]
    for line in lines:
        path = line.get_transform().transform_path(line.get_path())
        for name, box in boxes:
            if path.intersects_bbox(box, filled=False):
                found.append((name, line.get_label()))
    return found


def test_the_gathered_figure_names_the_card_in_its_legend_not_over_a_line(committed):
    results, cells, calls = committed
    figure = scaling.plot_scaling(scaling.scalings(results, cells, calls))
    if figure is None:
        pytest.skip("no multi-GPU prediction")
    for axis in figure.axes:
        if axis.get_visible():
            assert not _overlaps(figure, [*axis.texts, axis.title], axis.get_lines())
            assert "plain" not in axis.get_title()  # ColQwen2's regime by its name on the pages
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert any("usable" in name for name in legend)
    order = [name.split(",")[0] for name in legend if "," in name]
    assert order == sorted(order, key=style.in_order(set(order)).index)
    matplotlib.pyplot.close(figure)


def test_the_parity_titles_do_not_overlap():
    panels = agreement.loss_curves(agreement.traced_cells())
    if not panels:
        pytest.skip("no traced cell committed")
    figure = plots.plot_loss_curves(panels)
    titles = [sub._suptitle for sub in figure.subfigs] + [axis.title for axis in figure.axes]  # noqa: SLF001
    assert [title.get_text() for title in titles[: len(panels)]] == [title for title, _ in panels]
    assert not _overlaps(figure, [title for title in titles if title is not None])
    matplotlib.pyplot.close(figure)


def test_printed_negatives_have_a_true_minus_and_a_rounded_zero_reads_0(committed):
    assert text.number(-0.0123, ".2f") == "\u22120.01" and text.number(-0.004, ".2f") == "0"
    assert text.number(0.0, ".2f") == "0" and text.number(1.5, ".2f") == "1.50" and text.number(None, ".2f") == "—"
    results, _, _ = committed
    table = tables.ceiling_details(data.ceilings(results))
    if table.empty:
        pytest.skip("no ceiling search committed")
    shown = [str(value) for value in table.to_numpy().ravel()]
    assert not [value for value in shown if re.search(r"(?<![\w])-\d", value)], "a hyphen before a figure"
