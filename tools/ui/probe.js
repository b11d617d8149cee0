// Reads the current JupyterLab notebook from the page for tools/ui/browser.py.
// Needs JupyterLab started with --LabApp.expose_app_in_browser=True (window.jupyterapp).
// Returns plain data only; every judgement (wrapping, contrast, errors) is made in Python.
(options) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const maxText = options.maxText;

  // The Range covering characters [start, end) of the concatenated text nodes of `root`.
  function rangeOf(textNodes, start, end) {
    const range = document.createRange();
    let startSet = false;
    for (const { node, offset } of textNodes) {
      const length = node.data.length;
      if (!startSet && start < offset + length) {
        range.setStart(node, start - offset);
        startSet = true;
      }
      if (startSet && end <= offset + length) {
        range.setEnd(node, end - offset);
        return range;
      }
    }
    return null;
  }

  // Each text line of a <pre> with the vertical extent of every box it renders into.
  function preLines(pre) {
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    const textNodes = [];
    let total = 0;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.data.length) {
        textNodes.push({ node, offset: total });
        total += node.data.length;
      }
    }
    const text = textNodes.map(({ node }) => node.data).join("");
    const lines = [];
    let start = 0;
    for (const line of text.split("\n")) {
      const end = start + line.length;
      if (line.trim()) {
        const range = rangeOf(textNodes, start, end);
        const boxes = range
          ? Array.from(range.getClientRects())
              .filter((r) => r.width > 0 && r.height > 0)
              .map((r) => [r.top, r.bottom])
          : [];
        lines.push({ text: line, boxes });
      }
      start = end + 1;
    }
    return lines;
  }

  // The horizontal extent of `element` a user sees without scrolling: its box clipped
  // by every ancestor that clips (a scrolling output block, the notebook panel).
  function visibleSpan(element) {
    let left = -Infinity;
    let right = Infinity;
    for (let e = element.parentElement; e; e = e.parentElement) {
      if (getComputedStyle(e).overflowX === "visible") continue;
      const box = e.getBoundingClientRect();
      left = Math.max(left, box.left);
      right = Math.min(right, box.right);
    }
    return [Math.max(left, 0), Math.min(right, document.documentElement.clientWidth)];
  }

  // The box of `element` a user sees: sideways as visibleSpan, and up and down as far as
  // its output area lets it (a scrolled output's height limit), wherever the notebook
  // happens to be scrolled.
  function visibleBox(element) {
    const [left, right] = visibleSpan(element);
    let [top, bottom] = [-Infinity, Infinity];
    const area = element.closest(".jp-Cell-outputArea");
    for (let e = element.parentElement; e && area && area.contains(e); e = e.parentElement) {
      if (getComputedStyle(e).overflowY === "visible") continue;
      const box = e.getBoundingClientRect();
      [top, bottom] = [Math.max(top, box.top), Math.min(bottom, box.bottom)];
    }
    return { left, top, right, bottom };
  }

  // The rects of the text of `root` from the first "→" on: a finding's fix.
  function fixOf(root) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    let started = false;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.data.indexOf("→");
      if (!started && at >= 0) {
        range.setStart(node, at);
        started = true;
      }
      if (started) range.setEnd(node, node.data.length);
    }
    if (!started) return null;
    const boxes = Array.from(range.getClientRects())
      .filter((r) => r.width > 0 && r.height > 0)
      .map((r) => [r.left, r.top, r.right, r.bottom]);
    return { text: range.toString().trim(), boxes };
  }

  // Each %tm doctor findings block: the fix of every finding and the box one sees.
  function findings(root) {
    return Array.from(root.querySelectorAll(".torchmagic-findings")).map((block) => ({
      visible: visibleBox(block),
      fixes: Array.from(block.children).slice(1).map(fixOf).filter((fix) => fix), // 0: heads
    }));
  }

  // Every number with its unit in the output's text, with the line boxes it renders into.
  const NUMBER = /\d[\d.,]*(?:e[-+]?\d+)?%?(?:[ \u00a0](?:[KMGT]i?B|B|ms|s|k|M|G)(?![\w]))?/g;
  function numbers(root) {
    const found = [];
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.data.matchAll(NUMBER)) {
        if (match[0].length < 2) continue; // a single digit cannot break
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const boxes = Array.from(range.getClientRects())
          .filter((r) => r.width > 0 && r.height > 0)
          .map((r) => [r.top, r.bottom]);
        if (boxes.length) found.push({ text: match[0], boxes });
      }
    }
    return found;
  }

  // The nearest ancestor that scrolls sideways: whether it does, and where it ends.
  function scrollerOf(table) {
    for (let e = table.parentElement; e; e = e.parentElement) {
      const overflow = getComputedStyle(e).overflowX;
      if (overflow === "auto" || overflow === "scroll") {
        return { scrolls: e.scrollWidth > e.clientWidth + 1, bottom: e.getBoundingClientRect().bottom };
      }
    }
    return null;
  }

  // Each <table> with the header cells of its key columns (``data-tm-key``, those no
  // width hides) and where they sit against the part of the output one sees.
  function tables(root) {
    return Array.from(root.querySelectorAll("table")).map((table) => {
      const [visibleLeft, visibleRight] = visibleSpan(table);
      const keys = Array.from(table.querySelectorAll("th[data-tm-key]")).map((th) => {
        const box = th.getBoundingClientRect();
        return { text: th.innerText.trim(), left: box.left, right: box.right };
      });
      const above = table.previousElementSibling;
      const titled = above && above.classList.contains("torchmagic-title");
      return {
        title: titled ? above.innerText.trim() : "",
        keys,
        visibleLeft,
        visibleRight,
        bottom: table.getBoundingClientRect().bottom,
        scroller: scrollerOf(table),
        // columns a narrow output hid, and whether the line naming them is in view
        hidden: Array.from(table.querySelectorAll("th")).filter(
          (th) => getComputedStyle(th).display === "none"
        ).length,
        hiddenNamed: Array.from(
          (table.closest(".torchmagic-table-block") || table).querySelectorAll("div")
        ).some((d) => d.innerText.startsWith("… hidden at this width") && d.getClientRects().length),
      };
    });
  }

  // Any CSS colour (color(srgb …), color-mix results, names) as "rgba(r, g, b, a)".
  const canvas = document.createElement("canvas").getContext("2d", { willReadFrequently: true });
  function rgba(css) {
    canvas.clearRect(0, 0, 1, 1);
    canvas.fillStyle = "#000";
    canvas.fillStyle = css;
    canvas.fillRect(0, 0, 1, 1);
    const [r, g, b, a] = canvas.getImageData(0, 0, 1, 1).data;
    return `rgba(${r}, ${g}, ${b}, ${(a / 255).toFixed(3)})`;
  }

  // The colour a text's background really has: the first opaque ancestor background.
  function backgroundOf(element) {
    for (let e = element; e; e = e.parentElement) {
      const bg = rgba(getComputedStyle(e).backgroundColor);
      if (!bg.endsWith(", 0.000)")) return bg;
    }
    return "rgba(255, 255, 255, 1.000)";
  }

  // Distinct (colour, background) pairs of the visible text in an output, with a sample.
  function colours(root) {
    const seen = new Map();
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const sample = node.data.trim();
      const element = node.parentElement;
      if (!sample || !element || !element.getClientRects().length) continue;
      const color = rgba(getComputedStyle(element).color);
      const background = backgroundOf(element);
      const key = color + "|" + background;
      if (!seen.has(key)) seen.set(key, { color, background, sample: sample.slice(0, 40) });
    }
    return Array.from(seen.values());
  }

  const cells = panel.content.widgets.map((cell, index) => {
    cell.node.setAttribute("data-tm-cell", String(index));
    const model = cell.model;
    const result = {
      index,
      type: model.type,
      source: model.sharedModel.getSource(),
      executionCount: model.type === "code" ? model.executionCount : null,
      prompt: (cell.node.querySelector(".jp-InputPrompt") || {}).textContent || "",
      outputs: [],
    };
    if (model.type !== "code") return result;
    const children = cell.node.querySelectorAll(".jp-OutputArea-child");
    for (let i = 0; i < model.outputs.length; i++) {
      const json = model.outputs.get(i).toJSON();
      const node = children[i] ? children[i].querySelector(".jp-OutputArea-output") : null;
      const rendered = node ? node.querySelector("[data-mime-type]") || node : null;
      result.outputs.push({
        outputType: json.output_type,
        mimeType: rendered ? rendered.getAttribute("data-mime-type") || "" : "",
        text: node ? node.innerText.slice(0, maxText) : "",
        present: !!node && node.getClientRects().length > 0,
        // only a <pre> that promises not to wrap (white-space: pre); one with pre-wrap
        // wraps its prose at spaces by design
        pres: node
          ? Array.from(node.querySelectorAll("pre"))
              .filter((pre) => getComputedStyle(pre).whiteSpace === "pre")
              .map(preLines)
          : [],
        tables: node ? tables(node) : [],
        width: node ? node.getBoundingClientRect().width : 0,
        findings: node ? findings(node) : [],
        numbers: node ? numbers(node) : [],
        colours: node && options.colours ? colours(node) : [],
      });
    }
    return result;
  });
  return {
    theme: document.body.dataset.jpThemeName || "",
    kernel: panel.sessionContext.session?.kernel?.status || "none",
    cells,
  };
}
