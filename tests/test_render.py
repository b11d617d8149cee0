from torchmagic import Session, render


def test_change_has_text_and_html(trained):
    model, opt = trained
    change = Session(model, opt).freeze("layer1-3")
    bundle = render.change(change, width=90)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    text = bundle["text/plain"]
    assert "froze layer1, layer2, layer3" in text and "held in eval" in text
    assert "changed" in text and "<pre" in bundle["text/html"]
    assert "layer1" in bundle["text/html"]
    assert max(len(line) for line in text.splitlines()) <= 90


def test_brackets_are_not_markup(trained):
    model, opt = trained
    tm = Session(model, opt)
    tm.freeze("layer1", command="%freeze [weird] layer1")
    assert "[weird]" in str(render.history(tm.history()))


def test_long_module_lists_are_shortened(trained):
    model, opt = trained
    change = Session(model, opt).freeze("*.bn*", dry_run=True)
    text = str(render.change(change))
    assert "more" in text and text.count("bn") < 16


def test_bundle_computes_only_the_types_asked_for(monkeypatch):
    drawn = render.render("hello", width=40)
    assert set(drawn._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert set(drawn._repr_mimebundle_(exclude={"text/plain"})) == {"text/html"}
    assert drawn._repr_mimebundle_(include={"image/png"}) == {}
    exported = []
    monkeypatch.setattr(
        "rich.console.Console.export_html", lambda *a, **k: exported.append(1) or ""
    )
    drawn._repr_mimebundle_(exclude={"text/html"})
    assert exported == []


def test_history_chart_is_drawn_only_for_html(monkeypatch):
    from torchmagic.core.training.fit import EpochMetrics, FitHistory

    run = FitHistory(
        "fit 1", "model", (EpochMetrics(1, 1.0, None, None, 8, 1.0, (0.1,)),), 1, 8, 1.0
    )
    charts = []
    monkeypatch.setattr(render.training, "_chart", lambda h: charts.append(h) or "<img/>")
    view = render.render(render.FitRuns((run,)))
    assert set(view._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert charts == []
    assert view._repr_mimebundle_()["text/html"].endswith("<img/>")
    assert view.histories == (run,)


def test_lr_reads_as_typed():
    assert [render.lr(x) for x in (1e-4, 2.45e-6, 0.01, 0.001, 0.1, 0.0)] == [
        "1e-4",
        "2.45e-6",
        "0.01",
        "0.001",
        "0.1",
        "0",
    ]


def test_default_width_and_no_trailing_spaces(trained):
    model, opt = trained
    drawn = render.render(Session(model, opt).summary(depth=1))
    assert drawn.width == render.DEFAULT_WIDTH
    text = str(drawn)
    assert text == drawn._repr_mimebundle_()["text/plain"]
    assert all(line == line.rstrip() for line in text.splitlines())
