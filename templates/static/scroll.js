// Tables wider than the screen scroll sideways inside their .scroll box: say which side hides columns
// (data-more = right, left or both; CSS draws the cue). Again on resize, scroll and live refreshes.
(() => {
  const mark = (box) => {
    const left = box.scrollLeft > 1, right = box.scrollLeft + box.clientWidth < box.scrollWidth - 1;
    const more = left && right ? "both" : left ? "left" : right ? "right" : null;
    if (more) { if (box.dataset.more !== more) box.dataset.more = more; } else if ("more" in box.dataset) delete box.dataset.more;
  };
  const markAll = () => document.querySelectorAll(".scroll").forEach(mark);
  document.addEventListener("scroll", (event) => { if (event.target.classList?.contains("scroll")) mark(event.target); }, true);
  window.addEventListener("resize", markAll);
  new MutationObserver(markAll).observe(document.querySelector("main"), {childList: true, subtree: true});
  markAll();
})();
