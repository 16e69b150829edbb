// The chat page's layout and keyboard, apart from its socket (chat.js): the phone menu, the composer
// that grows with its text, following a streaming answer only while the reader is at the bottom
// (with "Jump to latest" otherwise), aria-busy on an answer being written and one announcement when
// it ends, and the shortcuts (Esc stops an answer, Ctrl/Cmd+Shift+O starts a new chat).
// It watches the page rather than being called by chat.js, so the two change independently.
(function () {
  "use strict";
  const layout = document.getElementById("layout");
  const sidebar = document.getElementById("sidebar");
  const menuButton = document.getElementById("menu-button");
  const menuClose = document.getElementById("menu-close");
  const backdrop = document.getElementById("menu-backdrop");
  const messages = document.getElementById("messages");
  const jump = document.getElementById("jump-latest");
  const announcer = document.getElementById("announcer");
  const form = document.getElementById("composer");
  const input = document.getElementById("input");
  const stopButton = document.getElementById("stop");
  const newChat = document.getElementById("new-chat");

  // --- the phone menu: the sidebar as a drawer below 700 px ---------------------------------------
  const narrow = window.matchMedia("(max-width: 700px)");

  function menuOpen() { return layout.classList.contains("menu-open"); }

  function setMenu(open) {
    layout.classList.toggle("menu-open", open);
    menuButton.setAttribute("aria-expanded", String(open));
    backdrop.hidden = !open;
    if (open) newChat.focus();
    else if (narrow.matches) menuButton.focus();
  }

  menuButton.addEventListener("click", function () { setMenu(!menuOpen()); });
  menuClose.addEventListener("click", function () { setMenu(false); });
  backdrop.addEventListener("click", function () { setMenu(false); });
  narrow.addEventListener("change", function () { if (!narrow.matches) setMenu(false); });

  // --- the composer grows with its text, up to a limit, then scrolls -------------------------------
  const GROW_LIMIT = 0.4;  // of the window's height

  function grow() {
    input.style.height = "auto";
    const limit = Math.max(96, window.innerHeight * GROW_LIMIT);
    input.style.height = Math.min(input.scrollHeight + 2, limit) + "px";
    input.style.overflowY = input.scrollHeight + 2 > limit ? "auto" : "hidden";
  }

  input.addEventListener("input", grow);
  window.addEventListener("resize", grow);

  // --- following the newest text --------------------------------------------------------------------
  const NEAR_BOTTOM_PX = 48;
  let pinned = true;  // whether the reader is at the end: then new text keeps them there

  function atBottom() {
    return messages.scrollHeight - messages.scrollTop - messages.clientHeight <= NEAR_BOTTOM_PX;
  }

  function toBottom() {
    messages.scrollTop = messages.scrollHeight;
    jump.hidden = true;
  }

  messages.addEventListener("scroll", function () {
    pinned = atBottom();
    if (pinned) jump.hidden = true;
  });
  jump.addEventListener("click", function () {
    pinned = true;
    toBottom();
  });
  form.addEventListener("submit", function () {
    // Sending is a wish to see the answer; chat.js empties the input after this listener.
    pinned = true;
    requestAnimationFrame(grow);
  });
  messages.addEventListener("submit", function (event) {
    // So is sending an edit (static/chat/tree.js's form in a message).
    if (event.target.matches(".edit-form")) pinned = true;
  });

  // Whether the page changed at its end: a message added, or the last one written on. A change
  // higher up (a message's actions drawn again, an edit form opened) is not news below the reader.
  function changedAtEnd(records) {
    const last = messages.querySelector("article.message:last-of-type");
    return records.some(function (record) {
      const added = Array.prototype.some.call(record.addedNodes, function (node) {
        return node.matches && node.matches("article.message");
      });
      return added || (last !== null && last.contains(record.target));
    });
  }

  // --- an answer being written: aria-busy, then one announcement when it ends ------------------------
  const BUSY = ["pending", "streaming"];
  const ENDED = {
    complete: "The answer is complete.",
    stopped: "The answer was stopped.",
    failed: "The answer failed.",
    flagged: "The answer was stopped by a safety check.",
  };

  function markBusy(article) {
    const busy = article.classList.contains("assistant") && BUSY.indexOf(article.dataset.status) >= 0;
    if (busy) {
      article.setAttribute("aria-busy", "true");
    } else if (article.getAttribute("aria-busy") === "true") {
      article.removeAttribute("aria-busy");
      if (ENDED[article.dataset.status]) announce(ENDED[article.dataset.status]);
    }
  }

  function announce(text) {
    // Emptied first, so the same words said twice in a row are announced twice.
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 50);
  }

  new MutationObserver(function (records) {
    records.forEach(function (record) {
      if (record.type === "attributes" && record.target.matches("article.message")) markBusy(record.target);
      if (record.type === "childList") {
        record.addedNodes.forEach(function (node) { if (node.matches && node.matches("article.message")) markBusy(node); });
      }
    });
    if (pinned) toBottom();
    else if (atBottom()) jump.hidden = true;  // everything below is on screen (the chat may have shrunk)
    else if (changedAtEnd(records)) jump.hidden = false;
  }).observe(messages, {childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ["data-status"]});

  // --- the keyboard ---------------------------------------------------------------------------------
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      // A modal dialog (move to project, shortcuts, share) takes its own Esc: it closes first.
      if (document.querySelector("dialog[open]")) return;
      if (menuOpen()) {
        setMenu(false);
      } else if (!stopButton.hidden) {
        stopButton.click();
      } else {
        return;
      }
      event.preventDefault();
    } else if ((event.ctrlKey || event.metaKey) && event.shiftKey && (event.key === "O" || event.key === "o")) {
      event.preventDefault();
      window.location.assign(newChat.href);
    }
  });

  // --- on load: at the end of the conversation, the cursor in the composer ---------------------------
  messages.querySelectorAll("article.message").forEach(markBusy);
  toBottom();
  grow();
  if (!window.matchMedia("(pointer: coarse)").matches) input.focus();
})();
