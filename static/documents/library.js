// The files page: a file still being processed shows its progress, polled from the files API, and
// the page reloads once every such file has ended (ready or failed) to show it as the server does.
(function () {
  "use strict";
  const rows = Array.from(document.querySelectorAll("#files tr[data-document]")).filter(function (row) {
    return row.dataset.status === "queued" || row.dataset.status === "processing";
  });
  if (!rows.length) return;
  function poll() {
    Promise.all(rows.map(function (row) {
      return fetch("/api/files/" + row.dataset.document + "/", {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) {
          if (r.status === 429) throw new Error("rate limited");  // polled again, as after a network error
          return r.ok ? r.json() : {status: "failed"};
        })
        .then(function (file) {
          row.dataset.status = file.status;
          if (file.status === "queued" || file.status === "processing") {
            row.querySelector(".file-status").textContent = "Processing " + (file.progress || 0) + "%";
          }
          return file.status;
        });
    })).then(function (states) {
      if (states.every(function (s) { return s === "ready" || s === "failed"; })) location.reload();
      else setTimeout(poll, 1000);
    }, function () { setTimeout(poll, 3000); });
  }
  setTimeout(poll, 500);
})();
