// The chat page's files: attach (the button, or a file dropped on the page) into this conversation,
// or, on a new chat with no conversation yet, into the library; each file's processing shown until
// it is ready; and under an answer, above its actions, the passages of files it cites, numbered as
// it cites them ([1], [2]…; a passage its prompt quoted but it does not cite is not shown), each
// opening to show its passage. Everything from the server goes into the
// page as text (textContent), never as HTML.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const messages = document.getElementById("messages");
  const attachments = document.getElementById("attachments");
  const attachButton = document.getElementById("attach");
  const attachInput = document.getElementById("attach-input");
  const errorBanner = document.getElementById("request-error");
  const WITHHELD = "was left out: it reads like instructions to the assistant, and text in a file is never taken as instructions.";

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  function conversationId() {
    return chat.dataset.conversation ? parseInt(chat.dataset.conversation, 10) : null;
  }

  function showError(text) {
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  function chipFor(file) {
    if (file.kind === "image") pendingImages.set(file.id, file);
    let chip = attachments.querySelector('.chip[data-document="' + file.id + '"]');
    if (!chip) {
      chip = document.createElement("span");
      chip.className = "chip";
      const name = document.createElement("span");
      name.className = "chip-name";
      const state = document.createElement("span");
      state.className = "chip-status";
      chip.append(name, " ", state);
      attachments.appendChild(chip);
    }
    chip.dataset.document = file.id;
    chip.dataset.status = file.status;
    chip.querySelector(".chip-name").textContent = file.name + (file.library ? " (library)" : "");
    if (file.kind === "image") chip.classList.add("image");
    chip.querySelector(".chip-status").textContent =
      file.status === "ready" && file.kind === "image" ? "ready · " + window.chatPage.imageCaption(file)
        : file.status === "ready" ? "ready" + (file.withheld_count ? " · " + file.withheld_count + " passage(s) held back" : "")
        : file.status === "failed" ? "failed: " + file.error
        : "processing " + (file.progress || 0) + "%";
    return chip;
  }

  function follow(id) {
    fetch("/api/files/" + id + "/", {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (r.status === 429) throw new Error("rate limited");  // asked again, as after a network error
        return r.ok ? r.json() : null;
      })
      .then(function (file) {
        if (!file) return;
        if (file.kind === "image" && !pendingImages.has(file.id)) return;  // sent with a message meanwhile
        chipFor(file);
        if (file.status === "queued" || file.status === "processing") setTimeout(function () { follow(id); }, 700);
      }, function () { setTimeout(function () { follow(id); }, 2000); });
  }

  // Images attached for the next message, by id, with what the server said of each.
  const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"];
  const pendingImages = new Map();

  function isImage(file) {
    return IMAGE_TYPES.indexOf(file.type) >= 0 || /\.(png|jpe?g|webp|gif)$/i.test(file.name || "");
  }

  // What chat.js sends with a message: the images read so far, or that one is still being read.
  // Once taken, they belong to the message and leave the attachments.
  window.chatPage.imagesForSend = function () {
    const images = Array.from(pendingImages.values());
    const waiting = images.some(function (file) { return file.status !== "ready" && file.status !== "failed"; });
    if (waiting) return {ready: [], waiting: true};
    const ready = images.filter(function (file) { return file.status === "ready"; });
    ready.forEach(function (file) {
      pendingImages.delete(file.id);
      const chip = attachments.querySelector('.chip[data-document="' + file.id + '"]');
      if (chip) chip.remove();
    });
    return {ready: ready, waiting: false};
  };

  function upload(file) {
    if (!file) return;
    showError("");
    const id = conversationId();
    const body = new FormData();
    body.append("file", file);
    fetch(id ? "/api/conversations/" + id + "/files/" : "/api/files/", {
      method: "POST",
      credentials: "same-origin",
      headers: {"X-CSRFToken": csrfToken(), "Accept": "application/json"},
      body: body,
    }).then(function (r) {
      return r.json().then(function (data) { return {ok: r.ok, data: data}; });
    }).then(function (result) {
      if (!result.ok) {
        showError((result.data.error && result.data.error.message) || "The file could not be uploaded.");
        return;
      }
      chipFor(result.data);
      follow(result.data.id);
    }, function () { showError("The file could not be uploaded. Check your connection and try again."); });
  }

  attachButton.addEventListener("click", function () { attachInput.click(); });
  attachInput.addEventListener("change", function () {
    upload(attachInput.files[0]);
    attachInput.value = "";
  });
  chat.addEventListener("dragover", function (event) {
    if (!event.dataTransfer || Array.from(event.dataTransfer.types).indexOf("Files") < 0) return;
    event.preventDefault();
    chat.classList.add("drop-active");
  });
  chat.addEventListener("dragleave", function (event) {
    if (event.target === chat) chat.classList.remove("drop-active");
  });
  // A pasted image (a screenshot) is attached as a dropped one is; pasted text stays the browser's.
  document.addEventListener("paste", function (event) {
    const files = event.clipboardData ? Array.from(event.clipboardData.files || []).filter(isImage) : [];
    if (!files.length) return;
    event.preventDefault();
    files.forEach(upload);
  });
  chat.addEventListener("drop", function (event) {
    if (!event.dataTransfer || !event.dataTransfer.files.length) return;
    event.preventDefault();
    chat.classList.remove("drop-active");
    Array.from(event.dataTransfer.files).forEach(upload);
  });
  attachments.querySelectorAll('.chip[data-status="queued"], .chip[data-status="processing"]').forEach(function (chip) {
    follow(chip.dataset.document);
  });

  // --- an answer's sources ----------------------------------------------------------------------

  function sourcesBlock(article, citations) {
    const old = article.querySelector("aside.sources");
    if (old) old.remove();
    // The server says which passages the answer's text cites (`cited`), as it does for the page it renders.
    citations = citations.filter(function (c) { return c.cited || c.withheld; });
    if (!citations.length) return;
    const aside = document.createElement("aside");
    aside.className = "sources";
    aside.setAttribute("aria-label", "Sources");
    citations.forEach(function (c) {
      const where = c.file + (c.page ? " (page " + c.page + ")" : "");
      if (c.withheld) {
        const note = document.createElement("p");
        note.className = "note source-withheld";
        note.textContent = "A passage of " + where + " " + WITHHELD;
        aside.appendChild(note);
        return;
      }
      const details = document.createElement("details");
      details.className = "source";
      details.id = "source-" + article.dataset.message + "-" + c.number;
      details.dataset.number = c.number;
      const summary = document.createElement("summary");
      summary.textContent = "[" + c.number + "] " + c.file + (c.page ? ", page " + c.page : "") + (c.heading ? " · " + c.heading : "");
      const quote = document.createElement("blockquote");
      quote.textContent = c.passage;
      details.append(summary, quote);
      aside.appendChild(details);
    });
    // Above the answer's actions (static/chat/tree.js), a comment form and Regenerate, as the server
    // renders it: the sources belong to the answer's text, the actions to the whole message.
    article.insertBefore(aside, article.querySelector(":scope > .actions, :scope > .feedback-form, :scope > button.regenerate"));
  }

  // "[2]" in an answer becomes a link that opens source 2 beneath it.
  function linkMarkers(article) {
    const content = article.querySelector(".content");
    if (!content || !article.querySelector("details.source")) return;
    const walker = document.createTreeWalker(content, NodeFilter.SHOW_TEXT);
    const found = [];
    while (walker.nextNode()) {
      if (/\[\d{1,2}\]/.test(walker.currentNode.nodeValue) && !walker.currentNode.parentElement.closest("a, code, pre")) {
        found.push(walker.currentNode);
      }
    }
    found.forEach(function (node) {
      const parts = node.nodeValue.split(/(\[\d{1,2}\])/);
      const fragment = document.createDocumentFragment();
      parts.forEach(function (part) {
        const match = /^\[(\d{1,2})\]$/.exec(part);
        const target = match && article.querySelector('details.source[data-number="' + match[1] + '"]');
        if (!target) {
          fragment.appendChild(document.createTextNode(part));
          return;
        }
        const link = document.createElement("a");
        link.href = "#" + target.id;
        link.className = "citation";
        link.textContent = part;
        link.addEventListener("click", function () { target.open = true; });
        fragment.appendChild(link);
      });
      node.replaceWith(fragment);
    });
  }

  function loadSources(article) {
    const id = conversationId();
    if (!id || !article.dataset.message) return;
    fetch("/api/conversations/" + id + "/messages/" + article.dataset.message + "/citations/", {
      credentials: "same-origin", headers: {"Accept": "application/json"},
    }).then(function (r) { return r.ok ? r.json() : null; }).then(function (data) {
      if (!data) return;
      sourcesBlock(article, data.citations);
      linkMarkers(article);
    });
  }

  document.addEventListener("chat:event", function (event) {
    const msg = event.detail;
    if (msg.type !== "generation.done") return;
    // After chat.js has drawn the answer's end (it handles the same event next).
    setTimeout(function () {
      const article = messages.querySelector('article[data-newest-generation="' + msg.generation + '"]') ||
        messages.querySelector('article[data-generation="' + msg.generation + '"]');
      if (article) loadSources(article);
    }, 0);
  });
  messages.querySelectorAll("article.message.assistant").forEach(linkMarkers);
})();
