// Samples the height of the outputs of the given cells while the notebook runs, for
// tools/ui/browser.py: every ~100 ms and on every change of the notebook's DOM (a progress
// redraw), keeping a (ms, height) pair each time the height differs from the last one.
// window.tmHeights.stop() ends the sampling and returns {cell index: {samples, heights}}.
(indices) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const start = performance.now();
  const records = Object.fromEntries(indices.map((i) => [i, { samples: 0, heights: [] }]));
  function sample() {
    for (const index of indices) {
      const cell = panel.content.widgets[Number(index)];
      const area = cell && cell.node.querySelector(".jp-Cell-outputArea");
      const height = area ? area.getBoundingClientRect().height : 0;
      const record = records[index];
      const last = record.heights[record.heights.length - 1];
      record.samples += 1;
      if (!last || last[1] !== height) {
        record.heights.push([Math.round(performance.now() - start), height]);
      }
    }
  }
  const timer = setInterval(sample, 100);
  const observer = new MutationObserver(sample);
  observer.observe(panel.content.node, { childList: true, subtree: true, characterData: true });
  window.tmHeights = {
    stop() {
      clearInterval(timer);
      observer.disconnect();
      sample();
      return records;
    },
  };
}
