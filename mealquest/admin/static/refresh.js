// Re-fetches the page and swaps its #live part in, so the figures and a job's
// status change without a reload. A part with data-events (a job's page)
// is fetched again at each event of that stream: as soon as the job changes,
// and never while it does not. Other pages, and a job's page whose stream
// is refused (signed out, the job deleted), are fetched every few seconds.
// Pauses while the "pause refresh" box is ticked or the tab is hidden. A page
// that no longer answers with a #live part is reloaded whole.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Number(live.getAttribute("data-refresh") || "3") * 1000;
  var pause = document.getElementById("pause");
  var latest = 0;  // the last fetch asked for: an earlier one answering later is dropped
  var missed = false;  // an event came while paused

  function paused() { return (pause && pause.checked) || document.hidden; }

  // Fetch the page and swap its live part in; then `next` (if any).
  function refresh(next) {
    var asked = ++latest;
    // Marked as a refresh: the server leaves a flashed message for the page
    // the browser is loading (a click's answer), which would lose it to a
    // refresh that an event started just then.
    fetch(window.location.href, {
      credentials: "same-origin",
      redirect: "manual",
      headers: { "X-Live-Refresh": "1" },
    })
      .then(function (response) {
        if (!response.ok) { window.location.reload(); return null; }
        return response.text();
      })
      .then(function (text) {
        if (text === null) { return; }
        if (asked === latest) {
          var part = new DOMParser().parseFromString(text, "text/html").getElementById("live");
          if (!part) { window.location.reload(); return; }
          live.innerHTML = part.innerHTML;
        }
        if (next) { next(); }
      })
      .catch(function () { if (next) { next(); } });
  }

  function schedule() { window.setTimeout(tick, every); }

  function tick() {
    if (paused()) { schedule(); return; }
    refresh(schedule);
  }

  function follow(url) {
    var stream = new EventSource(url);
    function changed(event) {
      live.setAttribute("data-event-id", event.lastEventId);
      if (paused()) { missed = true; return; }
      refresh(null);
    }
    stream.addEventListener("job", changed);
    stream.addEventListener("end", function (event) { stream.close(); changed(event); });
    // The browser reconnects by itself after a stream that ended (with its
    // Last-Event-ID); one it was refused stays closed: poll instead.
    stream.onerror = function () {
      if (stream.readyState === EventSource.CLOSED) { schedule(); }
    };
    function resumed() {
      if (missed && !paused()) { missed = false; refresh(null); }
    }
    if (pause) { pause.addEventListener("change", resumed); }
    document.addEventListener("visibilitychange", resumed);
  }

  var events = live.getAttribute("data-events");
  if (events && window.EventSource) { follow(events); } else { schedule(); }
})();
