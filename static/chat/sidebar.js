// The conversation list and the header's actions: titles that arrive over the socket, rename
// (Enter saves, Esc cancels), pin, share, export, delete, search, and the list's day groups.
// chat.js passes every socket message on as a "chat:event" on the document; nothing here touches
// the messages or the stream. Titles are model output and user input: they only go in as text.
(function () {
  "use strict";
  const chat = document.getElementById("chat");
  const list = document.getElementById("conversation-list");
  const search = document.getElementById("conversation-search");
  const noResults = document.getElementById("no-results");
  const title = document.getElementById("chat-title");
  const actions = document.getElementById("conversation-actions");
  const pinButton = document.getElementById("pin");
  const sharePanel = document.getElementById("share-panel");
  const shareUrl = document.getElementById("share-url");
  const errorBanner = document.getElementById("request-error");
  const announcer = document.getElementById("announcer");
  const GROUPS = ["Pinned", "Today", "Yesterday", "Previous 7 days", "Older"];

  function currentId() {
    return chat.dataset.conversation ? parseInt(chat.dataset.conversation, 10) : null;
  }

  function urlFor(id, suffix) {
    return chat.dataset.conversationUrl.replace("/0/", "/" + id + "/") + (suffix || "");
  }

  const csrfToken = window.chatPage.csrfToken;  // static/chat.js, loaded first

  function announce(text) {
    // Emptied first, so the same words said twice in a row are announced twice.
    announcer.textContent = "";
    setTimeout(function () { announcer.textContent = text; }, 50);
  }

  function showError(text) {
    errorBanner.textContent = text;
    errorBanner.hidden = !text;
  }

  // POST form fields to one of the page's endpoints; resolves with its JSON, rejects with its message.
  function post(url, fields) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: {"X-CSRFToken": csrfToken(), "Accept": "application/json"},
      body: new URLSearchParams(fields || {}),
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (body) {
        if (!response.ok) throw new Error((body.error && body.error.message) || "That did not work. Try again.");
        return body;
      });
    });
  }

  // --- the list ---------------------------------------------------------------------------------

  function linkFor(id) {
    return list.querySelector('a.conversation-link[data-conversation="' + id + '"]');
  }

  function group(label) {
    let section = list.querySelector('section.conversation-group[data-group="' + label + '"]');
    if (section) return section;
    section = document.createElement("section");
    section.className = "conversation-group";
    section.dataset.group = label;
    const heading = document.createElement("h2");
    heading.textContent = label;
    section.appendChild(heading);
    // In its place among the groups there are.
    const later = GROUPS.slice(GROUPS.indexOf(label) + 1);
    const next = Array.from(list.querySelectorAll("section.conversation-group"))
      .find(function (s) { return later.indexOf(s.dataset.group) >= 0; });
    list.insertBefore(section, next || noResults);
    return section;
  }

  function makeLink(conversation) {
    const link = document.createElement("a");
    link.href = conversation.url || urlFor(conversation.id);
    link.className = "conversation-link" + (conversation.id === currentId() ? " active" : "");
    link.dataset.conversation = String(conversation.id);
    link.dataset.pinned = conversation.pinned ? "true" : "false";
    if (conversation.id === currentId()) link.setAttribute("aria-current", "page");
    link.textContent = conversation.title;
    return link;
  }

  function dropEmptyGroups() {
    list.querySelectorAll("section.conversation-group").forEach(function (section) {
      if (!section.querySelector("a.conversation-link")) section.remove();
    });
  }

  // Put a conversation at the top of its group: Pinned, or Today (it has just been active).
  function moveToTop(conversation) {
    const link = linkFor(conversation.id) || makeLink(conversation);
    if (conversation.title) link.textContent = conversation.title;
    const pinned = link.dataset.pinned === "true";
    const section = group(pinned ? "Pinned" : "Today");
    section.insertBefore(link, section.querySelector("h2").nextSibling);
    dropEmptyGroups();
  }

  function render(groups, query) {
    list.querySelectorAll("section.conversation-group").forEach(function (s) { s.remove(); });
    groups.forEach(function (g) {
      const section = group(g.label);
      g.conversations.forEach(function (c) { section.appendChild(makeLink(c)); });
    });
    noResults.hidden = !(query && groups.length === 0);
  }

  let searchTimer = null;
  let searchSeq = 0;
  // The list as the server has it now, for the words in the search box (all of it when empty); the
  // chat menu and static/chat/projects.js call it after a change they made.
  function refresh() {
    const query = search.value.trim();
    const seq = ++searchSeq;
    return fetch(list.dataset.searchUrl + "?q=" + encodeURIComponent(query), {credentials: "same-origin"})
      .then(function (response) {
        if (!response.ok) throw new Error(response.statusText);
        return response.json();
      })
      .then(function (body) { if (seq === searchSeq) render(body.groups || [], query); })
      .catch(function () { showError("The search failed. Try again."); });
  }

  search.addEventListener("input", function () {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(refresh, 200);
  });

  window.chatSidebar = {refresh: refresh};

  // --- titles -----------------------------------------------------------------------------------

  function titleShow(id, text) {
    const link = linkFor(id);
    if (link && !link.querySelector("input")) link.textContent = text;
    if (id === currentId()) {
      if (!title.querySelector("input")) title.textContent = text;
      document.title = text;
    }
  }

  // Edit a title in place: Enter saves, Esc (or leaving the field) cancels.
  function edit(el, id) {
    if (el.querySelector("input")) return;
    const before = el.textContent;
    const field = document.createElement("input");
    field.type = "text";
    field.className = "title-edit";
    field.maxLength = 200;
    field.value = before;
    field.setAttribute("aria-label", "Title");
    el.textContent = "";
    el.appendChild(field);
    field.focus();
    field.select();
    let done = false;
    function finish(text) {
      if (done) return;
      done = true;
      field.remove();
      el.textContent = text;
    }
    field.addEventListener("click", function (event) { event.preventDefault(); });
    field.addEventListener("keydown", function (event) {
      if (event.key === "Escape") {
        event.preventDefault();
        finish(before);
      } else if (event.key === "Enter") {
        event.preventDefault();
        const text = field.value.trim();
        if (!text || text === before) return finish(before);
        post(urlFor(id, "rename/"), {title: text})
          .then(function (body) { finish(body.title); titleShow(id, body.title); showError(""); })
          .catch(function (error) { finish(before); showError(error.message); });
      }
    });
    field.addEventListener("blur", function () { finish(before); });
  }

  document.getElementById("rename").addEventListener("click", function () {
    if (currentId()) edit(title, currentId());
  });
  title.addEventListener("dblclick", function () {
    if (currentId()) edit(title, currentId());
  });
  list.addEventListener("keydown", function (event) {
    const link = event.target.closest && event.target.closest("a.conversation-link");
    if (event.key === "F2" && link) {
      event.preventDefault();
      edit(link, parseInt(link.dataset.conversation, 10));
    }
  });

  // --- pin, share, and the actions of a conversation started on this page ------------------------

  function pinShow(pinned) {
    actions.dataset.pinned = pinned ? "true" : "false";
    pinButton.textContent = pinned ? "Unpin" : "Pin";
  }

  pinButton.addEventListener("click", function () {
    const id = currentId();
    if (!id) return;
    post(urlFor(id, "pin/"), {pinned: actions.dataset.pinned === "true" ? "false" : "true"})
      .then(function (body) {
        pinShow(body.pinned);
        const link = linkFor(id) || makeLink(body);
        link.dataset.pinned = body.pinned ? "true" : "false";
        const section = group(body.pinned ? "Pinned" : "Today");
        section.insertBefore(link, section.querySelector("h2").nextSibling);
        dropEmptyGroups();
      })
      .catch(function (error) { showError(error.message); });
  });

  function shareShow(url) {
    actions.dataset.shareUrl = url;
    shareUrl.value = url;
    sharePanel.hidden = !url;
  }

  document.getElementById("share").addEventListener("click", function () {
    const id = currentId();
    if (!id) return;
    post(urlFor(id, "share/"))
      .then(function (body) { shareShow(body.url); shareUrl.select(); })
      .catch(function (error) { showError(error.message); });
  });
  // Copying says so: "Copied" on the button for a moment, and once to a screen reader.
  const shareCopy = document.getElementById("share-copy");
  let copiedTimer = null;
  shareCopy.addEventListener("click", function () {
    shareUrl.select();
    const copied = navigator.clipboard && window.isSecureContext
      ? navigator.clipboard.writeText(shareUrl.value)
      : (document.execCommand("copy") ? Promise.resolve() : Promise.reject(new Error("not copied")));
    copied.then(function () {
      shareCopy.textContent = "Copied";
      announce("Link copied.");
      clearTimeout(copiedTimer);
      copiedTimer = setTimeout(function () { shareCopy.textContent = "Copy"; }, 2000);
    }, function () { announce("Press Ctrl+C (⌘C on a Mac) to copy the selected link."); });
  });
  document.getElementById("share-revoke").addEventListener("click", function () {
    const id = currentId();
    if (!id) return;
    post(urlFor(id, "share/revoke/"))
      .then(function () { shareShow(""); })
      .catch(function (error) { showError(error.message); });
  });
  if (actions.dataset.shareUrl) shareShow(actions.dataset.shareUrl);

  // A conversation started on this page gets its actions as soon as it exists, without a reload.
  function actionsFor(id) {
    document.getElementById("delete-form").action = urlFor(id, "delete/");
    document.getElementById("export-markdown").href = urlFor(id, "export.md");
    document.getElementById("export-json").href = urlFor(id, "export.json");
    document.getElementById("export-tree").href = urlFor(id, "export.json?scope=tree");
    pinShow(false);
    shareShow("");
    actions.hidden = false;
  }

  // For the list's other scripts (static/chat/chatmenu.js): rename an entry in place (as F2 does),
  // and show the list again as the server has it after they changed it.
  window.chatSidebar = {
    rename: function (id) {
      const link = linkFor(id);
      if (link) edit(link, id);
    },
    pinned: function (id, pinned) {
      if (id === currentId()) pinShow(pinned);
      return refresh();
    },
    refresh: refresh,
  };

  document.addEventListener("chat:event", function (event) {
    const msg = event.detail;
    switch (msg.type) {
      case "conversation.created":
        list.querySelectorAll("a.conversation-link.active").forEach(function (a) {
          a.classList.remove("active");
          a.removeAttribute("aria-current");
        });
        moveToTop({id: msg.conversation.id, title: msg.conversation.title, pinned: false});
        linkFor(msg.conversation.id).classList.add("active");
        linkFor(msg.conversation.id).setAttribute("aria-current", "page");
        actionsFor(msg.conversation.id);
        document.title = msg.conversation.title;
        break;
      case "conversation.title":
        titleShow(msg.conversation, msg.title);
        break;
      case "conversation.message":
        // Another tab sent it: the conversation has just been active (an archived one stays out).
        if (msg.conversation.archived) break;
        moveToTop({id: msg.conversation.id, title: linkFor(msg.conversation.id) ? "" : msg.conversation.title, pinned: false});
        break;
      case "message.accepted":
        if (msg.conversation === currentId() && linkFor(msg.conversation)) moveToTop({id: msg.conversation, title: "", pinned: false});
        break;
    }
  });
})();
