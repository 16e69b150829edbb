// The prompt library in the composer: `/` at the start of an empty message opens a list of the
// user's saved prompts (GET /api/prompts/), filtered by what follows it (`/sum`); ↑ and ↓ choose,
// Enter or Tab puts the chosen prompt's text into the composer, Esc closes the list. The list is a
// listbox the composer points into (aria-activedescendant), so the focus stays in the composer.
// Prompts are the user's own text: they go into the page as text (textContent), never as HTML.
(function () {
  "use strict";
  const form = document.getElementById("composer");
  const input = document.getElementById("input");
  if (!form || !input) return;
  const PREVIEW_CHARS = 80;
  const TRIGGER = /^\/(\S*)$/;

  const menu = document.createElement("div");
  menu.id = "prompt-menu";
  menu.className = "prompt-menu";
  menu.setAttribute("role", "listbox");
  menu.setAttribute("aria-label", "Saved prompts");
  menu.hidden = true;
  form.appendChild(menu);
  input.setAttribute("aria-controls", menu.id);

  let prompts = null;     // the library, once loaded
  let loading = null;
  let shown = [];         // the prompts listed now, in order
  let selected = 0;
  let dismissed = null;   // the composer's text when Esc closed the list: it opens again once that changes

  function load() {
    if (!loading) {
      loading = fetch("/api/prompts/", {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { return r.ok ? r.json() : []; })
        .then(function (list) { prompts = list; }, function () { prompts = []; })
        .finally(function () { loading = null; });
    }
    return loading;
  }

  function isOpen() { return !menu.hidden; }

  function close() {
    menu.hidden = true;
    menu.replaceChildren();
    shown = [];
    input.removeAttribute("aria-activedescendant");
  }

  function matching(query) {
    const starts = prompts.filter(function (p) { return p.command.startsWith(query); });
    const within = prompts.filter(function (p) { return !p.command.startsWith(query) && p.command.includes(query); });
    return starts.concat(within);
  }

  function note(text, withLink) {
    const line = document.createElement("div");
    line.className = "prompt-empty";
    line.textContent = text;
    if (withLink) {
      const link = document.createElement("a");
      link.href = "/prompts/";
      link.textContent = "Add one";
      line.append(" ", link);
    }
    menu.appendChild(line);
  }

  function draw(query) {
    menu.replaceChildren();
    shown = matching(query);
    if (selected >= shown.length) selected = 0;
    if (!prompts.length) note("No saved prompts yet.", true);
    else if (!shown.length) note("No prompt matches /" + query + ".", false);
    shown.forEach(function (p, i) {
      const option = document.createElement("div");
      option.id = "prompt-option-" + p.id;
      option.className = "prompt-option";
      option.setAttribute("role", "option");
      option.setAttribute("aria-selected", String(i === selected));
      option.dataset.command = p.command;
      const command = document.createElement("span");
      command.className = "prompt-command";
      command.textContent = "/" + p.command;
      const preview = document.createElement("span");
      preview.className = "prompt-preview";
      preview.textContent = p.text.length > PREVIEW_CHARS ? p.text.slice(0, PREVIEW_CHARS) + "…" : p.text;
      option.append(command, preview);
      // Chosen with the pointer without taking the focus from the composer.
      option.addEventListener("mousedown", function (event) { event.preventDefault(); });
      option.addEventListener("click", function () { insert(p); });
      menu.appendChild(option);
    });
    menu.hidden = false;
    mark();
  }

  function mark() {
    Array.prototype.forEach.call(menu.querySelectorAll("[role=option]"), function (option, i) {
      option.setAttribute("aria-selected", String(i === selected));
      if (i === selected) {
        input.setAttribute("aria-activedescendant", option.id);
        option.scrollIntoView({block: "nearest"});
      }
    });
    if (!shown.length) input.removeAttribute("aria-activedescendant");
  }

  function insert(prompt) {
    close();
    input.value = prompt.text;
    input.focus();
    input.setSelectionRange(input.value.length, input.value.length);
    // As if typed: the composer grows to the text (static/chat/layout.js listens).
    input.dispatchEvent(new Event("input", {bubbles: true}));
  }

  function update() {
    const match = TRIGGER.exec(input.value);
    if (!match) dismissed = null;
    if (!match || input.value === dismissed) {
      close();
      return;
    }
    dismissed = null;
    const opening = !isOpen();
    if (opening) selected = 0;
    if (prompts !== null) draw(match[1].toLowerCase());
    if (!opening) return;
    // Loaded again each time the list opens, so a prompt saved in another tab is there.
    load().then(function () {
      const now = TRIGGER.exec(input.value);
      if (now && input.value !== dismissed && document.activeElement === input) draw(now[1].toLowerCase());
    });
  }

  input.addEventListener("input", update);
  input.addEventListener("blur", close);
  form.addEventListener("submit", close);  // a `/word` matching no prompt is sent as it is

  // Before the composer's own keys (chat.js sends on Enter; layout.js stops an answer on Esc).
  form.addEventListener("keydown", function (event) {
    if (event.target !== input || !isOpen() || event.isComposing) return;
    const key = event.key;
    if (key === "ArrowDown" || key === "ArrowUp") {
      if (!shown.length) return;
      selected = (selected + (key === "ArrowDown" ? 1 : shown.length - 1)) % shown.length;
      mark();
    } else if ((key === "Enter" || key === "Tab") && !event.shiftKey && shown.length) {
      insert(shown[selected]);
    } else if (key === "Escape") {
      dismissed = input.value;
      close();
    } else {
      return;
    }
    event.preventDefault();
    event.stopPropagation();
  }, true);
})();
