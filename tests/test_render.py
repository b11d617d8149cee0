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
