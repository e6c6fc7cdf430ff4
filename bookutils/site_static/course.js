// Figures are drawn wider than the text column and shrunk to fit it: each links to
// its image, which the browser shows at full size.
function linkFiguresToFullSize() {
  for (const img of document.querySelectorAll("div.cell_output img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "full-size-figure";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  }
}

// A printed table keeps its columns: an output with lines laid out in columns (runs of
// spaces between several fields) does not wrap, and scrolls instead (course.css); any
// other output, a sentence or a list of numbers, wraps at the column's edge.
const COLUMNS = /\S {2,}\S.*\S {2,}\S/;
function markPrintedTables() {
  for (const pre of document.querySelectorAll("div.cell_output div.output pre")) {
    const lines = pre.textContent.split("\n").filter(line => line.trim());
    if (lines.filter(line => COLUMNS.test(line)).length >= 2) pre.classList.add("printed-table");
  }
  markWideTables();
}

// A table still wider than the column gets a shadow at its right edge and a scrollbar,
// so that a reader sees there is more of it.
function markWideTables() {
  for (const pre of document.querySelectorAll("pre.printed-table")) {
    const wide = pre.scrollWidth > pre.clientWidth + 1;
    pre.classList.toggle("wider-than-column", wide);
    if (wide) pre.title = "Scroll sideways for the rest of the table";
    else pre.removeAttribute("title");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  linkFiguresToFullSize();
  markPrintedTables();
});
window.addEventListener("resize", markWideTables);
