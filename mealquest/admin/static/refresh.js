// Re-fetches the page every few seconds and swaps its #live part in, so the
// figures and a job's status change without a reload. Pauses while the
// "pause refresh" box is ticked or the tab is hidden. A page that no longer
// answers with a #live part (signed out, the job deleted) is reloaded whole.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Number(live.getAttribute("data-refresh") || "3") * 1000;
  var pause = document.getElementById("pause");

  function schedule() { window.setTimeout(tick, every); }

  function tick() {
    if ((pause && pause.checked) || document.hidden) { schedule(); return; }
    fetch(window.location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (response) {
        if (!response.ok) { window.location.reload(); return null; }
        return response.text();
      })
      .then(function (text) {
        if (text === null) { return; }
        var next = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (!next) { window.location.reload(); return; }
        live.innerHTML = next.innerHTML;
        schedule();
      })
      .catch(function () { schedule(); });
  }

  schedule();
})();
