// The colour theme: the system's (prefers-color-scheme) until the visitor picks one with the
// header's toggle; the choice is kept in this browser (localStorage) and set as data-theme on
// <html>, which arena.css reads. Loaded in <head>, so a kept choice applies before the first paint.
(function () {
  "use strict";
  const KEY = "fix-arena-theme";
  const root = document.documentElement;

  function saved() {
    try { return localStorage.getItem(KEY); } catch (error) { return null; }  // storage may be off
  }

  function current() {
    if (root.dataset.theme) { return root.dataset.theme; }
    return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  const kept = saved();
  if (kept === "light" || kept === "dark") { root.dataset.theme = kept; }

  document.addEventListener("DOMContentLoaded", function () {
    const button = document.getElementById("theme-toggle");
    if (!button) { return; }
    function show() { button.setAttribute("aria-pressed", String(current() === "dark")); }
    button.addEventListener("click", function () {
      root.dataset.theme = current() === "dark" ? "light" : "dark";
      try { localStorage.setItem(KEY, root.dataset.theme); } catch (error) { /* kept for this page only */ }
      show();
    });
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", show);
    show();
    button.hidden = false;
  });
})();
