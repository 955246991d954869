// Wide tables: the theme puts every table in a .pst-scrollable-table-container that
// scrolls sideways. A table wider than its column is marked "vsb-wide" (custom.css then
// keeps its header row and first column in view, and its height within the window so the
// scrollbar is on screen), and the frame around it is shaded on each side that hides
// columns, so a cut-off table shows that it scrolls.
(function () {
  "use strict";

  function update(frame, box) {
    const hidden = box.scrollWidth - box.clientWidth;
    const first = box.querySelector("tbody td:first-child");
    // The left shade starts after the first column, which stays in view (custom.css).
    frame.style.setProperty("--vsb-first-column", (first ? first.offsetWidth : 0) + "px");
    frame.classList.toggle("vsb-more-left", box.scrollLeft > 1);
    frame.classList.toggle("vsb-more-right", hidden - box.scrollLeft > 1);
  }

  function setUp(box) {
    if (box.scrollWidth <= box.clientWidth + 1) {
      return;
    }
    box.classList.add("vsb-wide");
    const frame = document.createElement("div");
    frame.className = "vsb-table-frame";
    box.parentNode.insertBefore(frame, box);
    frame.appendChild(box);
    const refresh = () => update(frame, box);
    box.addEventListener("scroll", refresh, { passive: true });
    window.addEventListener("resize", refresh);
    refresh();
  }

  function run() {
    document
      .querySelectorAll(".bd-article .pst-scrollable-table-container")
      .forEach(setUp);
  }

  // Measured once the fonts are in; later only the shades follow the scroll and resizes.
  if (document.readyState === "complete") {
    run();
  } else {
    window.addEventListener("load", run);
  }
})();
