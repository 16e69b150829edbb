// The chat page's keyboard, beyond what static/chat/layout.js handles (Esc stops an answer,
// Ctrl/Cmd+Shift+O starts a new chat): Ctrl+/ (Cmd+/ on a Mac) opens a dialog listing every
// shortcut, and ↑ in an empty composer edits the user's last message on the branch shown, with the
// same edit form as its Edit button (static/chat/tree.js).
(function () {
  "use strict";
  const messages = document.getElementById("messages");
  const input = document.getElementById("input");
  const stopButton = document.getElementById("stop");
  if (!messages || !input) return;
  const MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
  const MOD = MAC ? "⌘" : "Ctrl";

  const SHORTCUTS = [
    [["Enter"], "Send the message"],
    [["Shift", "Enter"], "A new line in the message"],
    [["Esc"], "Stop the answer being written; close a menu or this list"],
    [[MOD, "Shift", "O"], "Start a new chat"],
    [["↑"], "In an empty message box: edit your last message"],
    [["/"], "At the start of a message: insert a saved prompt (↑ ↓ choose, Enter or Tab inserts)"],
    [["F2"], "On a chat in the list: rename it"],
    [[MOD, "/"], "Show these shortcuts"],
  ];

  // --- the list of shortcuts: a modal dialog, built once ----------------------------------------------
  const dialog = document.createElement("dialog");
  dialog.id = "shortcuts";
  dialog.className = "shortcuts";
  dialog.setAttribute("aria-labelledby", "shortcuts-title");
  const title = document.createElement("h2");
  title.id = "shortcuts-title";
  title.textContent = "Keyboard shortcuts";
  const list = document.createElement("dl");
  SHORTCUTS.forEach(function (shortcut) {
    const keys = document.createElement("dt");
    shortcut[0].forEach(function (key, i) {
      if (i) keys.append(" + ");
      const kbd = document.createElement("kbd");
      kbd.textContent = key;
      keys.appendChild(kbd);
    });
    const what = document.createElement("dd");
    what.textContent = shortcut[1];
    list.append(keys, what);
  });
  const close = document.createElement("button");
  close.type = "button";
  close.className = "shortcuts-close";
  close.textContent = "Close";
  close.addEventListener("click", function () { dialog.close(); });
  dialog.append(title, list, close);
  document.body.appendChild(dialog);
  // Esc closes the dialog (the browser's own cancel) and nothing else: not an answer being written.
  dialog.addEventListener("keydown", function (event) {
    if (event.key === "Escape") event.stopPropagation();
  });
  dialog.addEventListener("click", function (event) {
    if (event.target === dialog) dialog.close();  // a click on the backdrop
  });
  dialog.addEventListener("close", function () { input.focus(); });

  document.addEventListener("keydown", function (event) {
    if ((event.ctrlKey || event.metaKey) && !event.altKey && (event.key === "/" || event.code === "Slash")) {
      event.preventDefault();
      if (dialog.open) dialog.close();
      else dialog.showModal();
    }
  });

  // --- ↑ in an empty composer: edit the last message -------------------------------------------------
  input.addEventListener("keydown", function (event) {
    if (event.key !== "ArrowUp" || event.shiftKey || event.altKey || event.ctrlKey || event.metaKey) return;
    if (input.value !== "" || event.isComposing || (stopButton && !stopButton.hidden)) return;
    const mine = messages.querySelectorAll("article.message.user[data-message]");
    const last = mine[mine.length - 1];
    const edit = last && last.querySelector(":scope > .actions button.edit");
    if (!edit) return;
    event.preventDefault();
    edit.click();
    last.scrollIntoView({block: "nearest"});
  });
})();
