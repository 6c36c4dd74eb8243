// Model output, readable and safe: Markdown rendered by marked, then sanitized by DOMPurify
// (votes/static/vendor/README.md), never inserted as the model wrote it. Raw HTML in a reply is
// shown as text; images are not loaded (a reply could point anywhere), their alt text is shown.
// Fenced code becomes a monospaced block with a Copy button.
(function () {
  "use strict";

  function escapeHtml(text) {
    return String(text)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  window.marked.use({
    gfm: true,
    breaks: true,  // Models break lines where they mean them.
    renderer: {
      html: function (token) { return escapeHtml(token.text); },
      image: function (token) { return escapeHtml(token.text ? "[image: " + token.text + "]" : "[image]"); },
    },
  });

  const SANITIZE = {
    RETURN_DOM_FRAGMENT: true,
    FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "iframe"],
    FORBID_ATTR: ["style", "class", "id"],
    // Links may go to the web or to an address, nowhere else (no javascript:, no data:).
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
  };

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) { return navigator.clipboard.writeText(text); }
    // Plain http (a LAN arena): the older way, through a selection.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    const copied = document.execCommand("copy");
    area.remove();
    return copied ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function addCopyButton(pre) {
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    pre.replaceWith(wrap);
    // Scrolls sideways rather than breaking code mid-word; focusable so keyboards can scroll it.
    pre.tabIndex = 0;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-code";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy this code");
    button.addEventListener("click", function () {
      copyText(pre.textContent).then(
        function () { button.textContent = "Copied"; },
        function () { button.textContent = "Select and copy"; },
      );
      setTimeout(function () { button.textContent = "Copy"; }, 2000);
    });
    wrap.append(button, pre);
  }

  // Characters that act instead of showing: C0 and C1 controls (tab and line breaks aside) and
  // the bidirectional embeddings, overrides and isolates, with which a prompt or a reply can
  // read in another order than it was written. Each is shown as its code point, and does nothing.
  const ACTING = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F-\u009F\u202A-\u202E\u2066-\u2069]/g;

  function inert(text) {
    return String(text || "").replace(ACTING, function (character) {
      return "[U+" + character.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "]";
    });
  }

  // A DocumentFragment of the rendered, sanitized reply.
  function render(text) {
    const fragment = window.DOMPurify.sanitize(window.marked.parse(inert(text)), SANITIZE);
    fragment.querySelectorAll("a").forEach(function (link) {
      link.rel = "noopener noreferrer nofollow ugc";
      link.target = "_blank";
    });
    fragment.querySelectorAll("pre").forEach(addCopyButton);
    return fragment;
  }

  // Replace element's content by text, rendered.
  function renderInto(element, text) {
    element.replaceChildren(render(text));
    element.dataset.source = text;
  }

  // Server-rendered pages (evaluations, a shared battle) mark model text with data-markdown; the
  // template has escaped it, so without JavaScript it reads as plain text.
  function renderMarked(root) {
    (root || document).querySelectorAll("[data-markdown]").forEach(function (element) {
      renderInto(element, element.textContent);
      element.classList.add("markdown");
    });
  }

  window.ArenaMarkdown = { inert: inert, render: render, renderInto: renderInto, renderMarked: renderMarked, copyText: copyText };
  document.addEventListener("DOMContentLoaded", function () { renderMarked(); });
})();
