// Shows the frame of an interactive figure that its controls select (see stepper.py).
(function () {
  "use strict";
  if (window.courseStepper) { window.courseStepper.initAll(); return; }

  function init(root) {
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    const controls = Array.from(root.querySelectorAll(".cf-controls [data-control]"));
    const frames = Array.from(root.querySelectorAll(".cf-frame"));
    const live = root.querySelector(".cf-live");
    const movers = Array.from(root.querySelectorAll(".cf-controls button[data-move]"));

    function key() {
      return controls.map((c) => (c.type === "checkbox" ? (c.checked ? "1" : "0") : c.value)).join("|");
    }

    function show(announce) {
      const wanted = key();
      let current = null;
      frames.forEach((f) => {
        const on = f.dataset.key === wanted;
        f.hidden = !on;
        if (on) current = f;
      });
      controls.forEach((c) => {
        if (c.type !== "range") return;
        const text = JSON.parse(c.dataset.labels)[Number(c.value)];
        c.setAttribute("aria-valuetext", text);
        const out = root.querySelector('.cf-controls [data-output="' + c.dataset.control + '"]');
        if (out) out.textContent = text;
      });
      movers.forEach((b) => {
        const range = root.querySelector('.cf-controls [data-control="' + b.dataset.target + '"]');
        const value = Number(range.value) + Number(b.dataset.move);
        b.disabled = value < Number(range.min) || value > Number(range.max);
      });
      root.dataset.state = wanted;
      if (announce && current) live.textContent = current.dataset.summary;
    }

    movers.forEach((b) => {
      b.addEventListener("click", () => {
        const range = root.querySelector('.cf-controls [data-control="' + b.dataset.target + '"]');
        const value = Number(range.value) + Number(b.dataset.move);
        if (value < Number(range.min) || value > Number(range.max)) return;
        range.value = String(value);
        show(true);
        // A button that has just been disabled (first or last step) would drop the focus.
        if (b.disabled) range.focus();
      });
    });
    controls.forEach((c) => {
      c.disabled = false;
      c.addEventListener(c.type === "checkbox" ? "change" : "input", () => show(true));
    });
    show(false);
  }

  window.courseStepper = {
    initAll: function () { document.querySelectorAll(".cf-stepper").forEach(init); },
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", window.courseStepper.initAll);
  } else {
    window.courseStepper.initAll();
  }
})();
