// "Select all" ticks every row of this page (the bulk form works without it).
const all = document.getElementById("tick-all");
if (all) all.addEventListener("change", () => {
  for (const box of document.querySelectorAll("input[name=id][form=bulk]")) box.checked = all.checked;
});
