// Sundial web UI: progressive enhancement only. Every page works without this file.
// - A search form marked data-live="#id" filters as you type: it fetches the same page with the
//   form's query and swaps the element #id, keeping the URL shareable (history.replaceState).
// - "Back" links go back in history.
(function () {
  "use strict";
  function live(form) {
    var target = form.getAttribute("data-live");
    var timer = null;
    var seq = 0;
    function run() {
      var params = new URLSearchParams(new FormData(form));
      var url = form.getAttribute("action") + "?" + params.toString();
      var mine = ++seq;
      fetch(url, { credentials: "same-origin", headers: { "accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null || mine !== seq) { return; }
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.querySelector(target);
          var old = document.querySelector(target);
          if (fresh && old) {
            old.replaceWith(fresh);
            history.replaceState(null, "", url);
          }
        })
        .catch(function () { /* the form still submits normally */ });
    }
    form.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(run, 200);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-live]").forEach(live);
    document.querySelectorAll("a[data-back]").forEach(function (a) {
      a.setAttribute("href", "/ui");
      a.addEventListener("click", function (e) {
        if (history.length > 1) { e.preventDefault(); history.back(); }
      });
    });
  });
})();
